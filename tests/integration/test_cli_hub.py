"""`attn generate --model ORG/NAME:QUANT` as a user runs it: downloaded once from a Hub (`FakeHub`, on 127.0.0.1)
with huggingface_hub's progress bar, then read from its cache with HF_HUB_OFFLINE=1, where a file the cache lacks is
one line that says how to fetch it."""

from __future__ import annotations

from cli_helpers import run_cli
from fake_hub import GGUF_REPO

from attn.app.cli import main

ARGS = ("generate", "--device", "cpu", "--max-new-tokens", "6", "the")


def test_generate_downloads_a_quantization_once_then_reads_the_cache(tiny_hub, tmp_path, capsys):
    hub, sources = tiny_hub
    assert main([*ARGS[:1], "--model", str(sources / "tiny-Q4_K_M.gguf"), *ARGS[1:]]) == 0
    expected = capsys.readouterr().out
    home = tmp_path / "hf"
    online = run_cli(*ARGS, "--model", f"{GGUF_REPO}:Q4_K_M", env=hub.env(home), timeout=300)
    assert online.returncode == 0 and online.stdout == expected, online.stderr
    assert "Fetching 1 files: 100%" in online.stderr
    asked = len(hub.requests)
    offline = run_cli(*ARGS, "--model", f"{GGUF_REPO}:Q4_K_M", env=hub.env(home, offline=True), timeout=300)
    assert offline.returncode == 0 and offline.stdout == expected and offline.stderr == "", offline.stderr
    missing = run_cli(*ARGS, "--model", f"{GGUF_REPO}:q8_0", env=hub.env(home, offline=True), timeout=300)
    assert len(hub.requests) == asked
    assert missing.returncode == 1 and missing.stderr == (
        f"attn: error: {GGUF_REPO}: the Hugging Face cache ({home / 'hub'}) does not hold tiny-Q8_0.gguf, and "
        "HF_HUB_OFFLINE=1 keeps it from being downloaded: unset HF_HUB_OFFLINE, or fetch it with `hf download "
        f"{GGUF_REPO} tiny-Q8_0.gguf` where the Hub can be reached\n")

"""Hub model names (`ORG/NAME`, `ORG/NAME:QUANT`) resolved through huggingface_hub's own cache.

The files a name stands for are checked on listings. The downloads run in fresh processes against `FakeHub`, a Hub
on 127.0.0.1 (huggingface_hub reads its endpoint, cache and offline setting once, when it is imported): online they
fill a cache that huggingface_hub lays out itself; offline the same names load from it without a request, and a file
it lacks is an error that says how to fetch it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fake_hub import GGUF_REPO, HF_REPO, FakeHub

from attn import load_model
from attn.artifacts import resolve_model
from attn.artifacts.hub import files_to_fetch, is_hub_name
from attn.artifacts.loading import packaged_model_dir
from attn.core.errors import CheckpointError

QUANTS = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-Q8_0.gguf", "m-F16.gguf", "m-BF16.gguf", "README.md"]


@pytest.mark.parametrize(("quant", "expected"), [
    ("Q4_K_M", "m-Q4_K_M.gguf"), ("q4_k_m", "m-Q4_K_M.gguf"), ("Q8_0", "m-Q8_0.gguf"), ("F16", "m-F16.gguf"),
    ("bf16", "m-BF16.gguf"),
])
def test_a_quantization_tag_picks_the_one_gguf_file_named_with_it(quant, expected):
    assert files_to_fetch("org/m", quant, QUANTS) == [expected]


@pytest.mark.parametrize(("quant", "files", "message"), [
    ("Q4_K", QUANTS, ("org/m: several of its .gguf files match 'Q4_K' (m-BF16.gguf, m-F16.gguf, m-Q4_K_M.gguf, "
                      "m-Q4_K_S.gguf, m-Q8_0.gguf); give a quantization tag that names exactly one of them")),
    ("Q2_K", QUANTS, "org/m: none of its .gguf files match 'Q2_K' (m-BF16.gguf"),
    (None, QUANTS, ("org/m: the repository holds several .gguf files (m-BF16.gguf, m-F16.gguf, m-Q4_K_M.gguf, "
                    "m-Q4_K_S.gguf, m-Q8_0.gguf); choose one with org/m:QUANT, for example org/m:Q4_K_M")),
    ("Q4_K_M", ["README.md", "config.json"], "org/m: the repository holds neither a .gguf file nor a Hugging Face"),
])
def test_a_name_that_chooses_no_single_file_is_refused_with_the_files_listed(quant, files, message):
    with pytest.raises(CheckpointError, match="^" + re.escape(message)):
        files_to_fetch("org/m", quant, files)


def test_a_huggingface_repository_is_its_config_tokenizer_and_safetensors():
    files = ["README.md", ".gitattributes", "config.json", "generation_config.json", "tokenizer.json", "merges.txt",
             "chat_template.jinja", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors", "pytorch_model.bin", "onnx/model.onnx", "onnx/config.json",
             "m-Q4_K_M.gguf"]
    assert files_to_fetch("org/m", None, files) == [
        "config.json", "chat_template.jinja", "generation_config.json", "merges.txt", "model.safetensors.index.json",
        "tokenizer.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert files_to_fetch("org/m", None, ["config.json", "vocab.txt", "pytorch_model.bin"]) == [
        "config.json", "vocab.txt", "pytorch_model.bin"]
    assert files_to_fetch("org/m", None, ["README.md", "m-Q8_0.gguf"]) == ["m-Q8_0.gguf"]  # the only GGUF file
    assert files_to_fetch("org/m", "Q4_K_M", files) == ["m-Q4_K_M.gguf"]  # a tag asks for GGUF


def test_a_local_path_or_packaged_name_comes_before_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert resolve_model("org/model") == Path("org/model")
    assert resolve_model("all-MiniLM-L6-v2") == packaged_model_dir("all-MiniLM-L6-v2")
    assert [is_hub_name(n) for n in ("org/m", "org/m:Q4_K_M", "m", "a/b/c", "./m", "/m/n", "org/m:")] == [
        True, True, False, False, False, False, False]
    with pytest.raises(CheckpointError, match=r"^nowhere: no such checkpoint or model directory; .* or a Hugging "
                                              r"Face Hub model \(ORG/NAME or ORG/NAME:QUANT\)$"):
        resolve_model("nowhere")


# -- through a Hub on 127.0.0.1 -------------------------------------------------------------------------------------

LOADS = """
    import json, sys, torch
    from attn import load_model
    from attn.core.errors import CheckpointError
    found = {}
    for name in sys.argv[1:]:
        try:
            bundle = load_model(name, "cpu")
        except CheckpointError as error:
            found[name] = str(error)
            continue
        logits = bundle.model(torch.tensor([[5, 6, 7, 8]]))
        found[name] = {"path": str(bundle.path), "logits": logits.tolist(),
                       "files": sorted(p.name for p in bundle.path.iterdir()) if bundle.path.is_dir() else []}
    print(json.dumps(found))
"""


def _loads(hub: FakeHub, home: Path, offline: bool, *names: str) -> tuple[dict, str]:
    """What `load_model` gives for each name in a fresh process (its logits of 4 ids, or its error), and stderr."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(LOADS), *names], env=hub.env(home, offline),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_hub_names_download_into_the_cache_then_load_offline_from_it(tiny_hub, tmp_path):
    hub, sources = tiny_hub
    home = tmp_path / "hf"
    online, stderr = _loads(hub, home, False, f"{GGUF_REPO}:q4_k_m", HF_REPO)
    assert "Fetching 1 files: 100%" in stderr and "Fetching 6 files: 100%" in stderr  # huggingface_hub's bars
    assert "dry-run" not in stderr  # listing the repositories shows no bar
    snapshots = home / "hub" / "models--org--tiny-llama" / "snapshots"
    commit = hub.commit(HF_REPO)
    assert online[HF_REPO]["path"] == str(snapshots / commit)
    assert online[HF_REPO]["files"] == ["attn_tokenizer.json", "chat_template.jinja", "config.json",
                                        "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    gguf = home / "hub" / "models--org--tiny-GGUF" / "snapshots" / hub.commit(GGUF_REPO) / "tiny-Q4_K_M.gguf"
    assert online[f"{GGUF_REPO}:q4_k_m"]["path"] == str(gguf)
    assert gguf.is_symlink() and gguf.read_bytes() == hub.repos[GGUF_REPO]["tiny-Q4_K_M.gguf"]
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        for name, source in ((f"{GGUF_REPO}:q4_k_m", sources / "tiny-Q4_K_M.gguf"), (HF_REPO, sources / "hf")):
            local = load_model(source, "cpu").model(ids)
            torch.testing.assert_close(torch.tensor(online[name]["logits"]), local, rtol=0, atol=0)

    asked = len(hub.requests)
    q8 = f"{GGUF_REPO}:Q8_0"
    offline, _ = _loads(hub, home, True, f"{GGUF_REPO}:Q4_K_M", HF_REPO, q8, "org/unknown")
    assert len(hub.requests) == asked  # not one request
    assert offline[f"{GGUF_REPO}:Q4_K_M"] == online[f"{GGUF_REPO}:q4_k_m"] and offline[HF_REPO] == online[HF_REPO]
    cache = home / "hub"
    assert offline[q8] == (
        f"{GGUF_REPO}: the Hugging Face cache ({cache}) does not hold tiny-Q8_0.gguf, and HF_HUB_OFFLINE=1 keeps it "
        f"from being downloaded: unset HF_HUB_OFFLINE, or fetch it with `hf download {GGUF_REPO} tiny-Q8_0.gguf` "
        "where the Hub can be reached")
    assert offline["org/unknown"].startswith(
        f"org/unknown: the Hugging Face cache ({cache}) does not hold this repository, nor is it a local path, and "
        "HF_HUB_OFFLINE=1 keeps it from being downloaded: unset HF_HUB_OFFLINE, or fetch it with `hf download "
        "org/unknown`")

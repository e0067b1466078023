"""`attn generate` as a user runs it: greedy by default, sampling, beam search, stop strings, many prompts.

The model is a tiny random character LM that this module builds and saves as a checkpoint. The
greedy expectation is recomputed here the long way (the whole sequence through `forward` for
every new token, no cache), so it does not share the decoding code it checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from attn.app.cli import main
from attn.artifacts.checkpoint import write_checkpoint
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig
from attn.decoding.beam_search import beam_search
from attn.models import build_model
from attn.core.presets import preset

TEXT = "ROMEO. But soft, what light through yonder window breaks?\nJULIET. Ay me!\n"
PROMPTS = ["ROMEO.", "But soft, what light", "J"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = Tokenizer.train_chars([TEXT])
    config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0, output_bias=True)
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():  # no EOS from this random model, so every continuation has its full length
        model.lm_head.bias[tokenizer.eos_id] = -1e4
    return write_checkpoint(tmp_path_factory.mktemp("lm") / "ckpt", model, config, tokenizer=tokenizer)


def greedy_by_recomputing(path: Path, prompt: str, new_tokens: int) -> str:
    from attn.artifacts.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(path)
    ids = checkpoint.tokenizer.encode(prompt)
    produced: list[int] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = checkpoint.model(torch.tensor([ids + produced]))[0, -1]
            produced.append(int(logits.argmax()))
    return checkpoint.tokenizer.decode(produced)


def generate_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert main(["generate", *args, "--device", "cpu", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_is_greedy_by_default(lm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = generate_json(capsys, "--model", str(lm), "--max-new-tokens", "10", "ROMEO.")
    expected = greedy_by_recomputing(lm, "ROMEO.", 10)
    assert found == [{"prompt": "ROMEO.", "continuations": [{"text": expected, "score": None}]}]
    assert main(["generate", "--model", str(lm), "--device", "cpu", "--max-new-tokens", "10", "ROMEO."]) == 0
    assert capsys.readouterr().out == f"ROMEO.{expected}\n"  # streamed, the same text


def test_prompts_from_a_file_are_decoded_in_batches_in_input_order(
    lm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n", encoding="utf-8")  # a blank line is no prompt
    found = generate_json(capsys, "--model", str(lm), "--max-new-tokens", "6", "--input", str(prompts))
    assert [row["prompt"] for row in found] == PROMPTS
    assert [row["continuations"][0]["text"] for row in found] == [greedy_by_recomputing(lm, p, 6) for p in PROMPTS]
    # Positional prompts are prompts too, one per argument, and text output gives each with its continuation.
    out = tmp_path / "out.txt"
    assert main(["generate", "--model", str(lm), "--device", "cpu", "--max-new-tokens", "6", *PROMPTS, "-o",
                 str(out)]) == 0
    expected = [p + row["continuations"][0]["text"] for p, row in zip(PROMPTS, found)]
    assert out.read_text(encoding="utf-8") == "\n\n".join(expected) + "\n"


def test_sampling_draws_n_continuations_per_prompt_reproducibly(lm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", str(lm), "--temperature", "0.8", "--n", "4", "--seed", "7", "--max-new-tokens", "12", *PROMPTS[:2])
    found = generate_json(capsys, *args)
    assert [len(row["continuations"]) for row in found] == [4, 4]
    texts = [c["text"] for row in found for c in row["continuations"]]
    assert len(set(texts)) > 1  # the rows of one prompt draw their own tokens
    assert generate_json(capsys, *args) == found


def test_beam_search_gives_the_n_best_with_their_scores(lm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = generate_json(capsys, "--model", str(lm), "--beam-size", "3", "--n-best", "2", "--max-new-tokens", "5",
                          *PROMPTS)
    from attn.artifacts.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(lm)
    tokenizer = checkpoint.tokenizer
    config = GenerationConfig(beam_size=3, n_best=2, max_new_tokens=5)
    for prompt, row in zip(PROMPTS, found):
        (hypotheses,) = beam_search(checkpoint.model, [tokenizer.encode(prompt)], config, tokenizer.eos_id)
        assert row["continuations"] == [{"text": tokenizer.decode(h.tokens), "score": pytest.approx(h.score, abs=1e-5)}
                                        for h in hypotheses]
        assert row["continuations"][0]["score"] >= row["continuations"][1]["score"]


def test_a_stop_string_ends_the_text_before_it_streamed_or_not(lm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = greedy_by_recomputing(lm, "ROMEO.", 20)
    stop = full[8:10]
    before = full[: full.index(stop)]
    for extra in ((), ("--json",)):
        assert main(["generate", "--model", str(lm), "--device", "cpu", "--max-new-tokens", "20", "--stop", stop,
                     "--stop", "never seen", *extra, "ROMEO."]) == 0
        out = capsys.readouterr().out
        shown = json.loads(out)[0]["continuations"][0]["text"] if extra else out.removesuffix("\n")[len("ROMEO."):]
        assert shown == before


def test_every_sampling_flag_reaches_decoding(lm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attn.artifacts.checkpoint import load_checkpoint
    from attn.decoding import generate

    checkpoint = load_checkpoint(lm)
    tokenizer = checkpoint.tokenizer
    a = tokenizer.encode("a")[0]
    biased = generate_json(capsys, "--model", str(lm), "--max-new-tokens", "6", "--logit-bias", f"{a}=100", "J")
    assert biased[0]["continuations"][0]["text"] == "aaaaaa"
    flags = {"temperature": "0.9", "top_k": "20", "top_p": "0.95", "min_p": "0.05", "seed": "4",
             "repetition_penalty": "1.2", "frequency_penalty": "0.5", "presence_penalty": "-0.5"}
    args = [item for name, value in flags.items() for item in (f"--{name.replace('_', '-')}", value)]
    found = generate_json(capsys, "--model", str(lm), "--max-new-tokens", "12", *args, "--logit-bias", f"{a}=2.5",
                          "--logit-bias", "3=-1", "ROMEO.")
    config = GenerationConfig(max_new_tokens=12, sample=True, logit_bias={a: 2.5, 3: -1.0},
                              **{name: float(value) if "." in value else int(value) for name, value in flags.items()})
    (tokens,) = generate(checkpoint.model, [tokenizer.encode("ROMEO.")], config, tokenizer.eos_id)
    assert found[0]["continuations"][0]["text"] == tokenizer.decode(tokens)


@pytest.mark.parametrize(("args", "message"), [
    (("--n", "0"), "--n: must be >= 1, got 0"),
    (("--min-p", "0.5", "--temperature", "1", "--frequency-penalty", "-3"), "--frequency-penalty: must be in [-2, 2]"),
    (("--logit-bias", "7=-100.5"), "--logit-bias: the bias of token 7 must be a number in [-100, 100]"),
    (("--n", "3"), "--n: greedy decoding and beam search give one continuation per prompt"),
    (("--beam-size", "2", "--temperature", "0.8"), "--temperature: beam search does not sample"),
    (("--n-best", "2"), "--n-best: must be in [1, beam_size=1], got 2"),
    (("--beam-size", "2", "--stop", "x"), "--stop: beam search stops at EOS only"),
])
def test_bad_decoding_options_are_usage_errors_before_loading(args: tuple[str, ...], message: str) -> None:
    result = run_cli("generate", "--model", "no/such/model", *args, "x")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == f"attn: error: {message}" + result.stderr.split(message, 1)[1]


def test_a_prompts_file_without_prompts_is_named(lm: Path, tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    result = run_cli("generate", "--model", str(lm), "--device", "cpu", "--input", str(tmp_path / "blank.txt"))
    assert result.returncode == 1
    assert result.stderr == "attn: error: no prompts: give at least one, as an argument or as a non-blank line of the " \
                            "input file\n"

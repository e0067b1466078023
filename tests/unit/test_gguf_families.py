"""GGUF files of every Llama-style family, as llama.cpp's converter writes them, read back by attn.

Each case is a tiny random `transformers` model written by `tiny_gguf.write_gguf` the way convert_hf_to_gguf.py
writes it (names, llama's q/k permutation, Gemma's norms stored as 1 + w, Phi-3's fused matrices, Gemma 3's
embedding cut to the vocabulary, each family's metadata keys). attn's logits are compared in float32 at 1e-4 with
the model whose weights were written, and with `transformers`' own GGUF loading where it reads the architecture
(gemma2, gemma3, phi3), float and quantized; kept quantized, every family loads and decodes. Windows of 4 and 5
positions are overrun by the 12-token input.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from reference_imports import require
from tiny_gguf import TOKENS, write_gguf

transformers = require("transformers")
from transformers import (  # noqa: E402 (after the skip where transformers is missing)
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from attn import GenerationConfig, generate, load_model  # noqa: E402
from attn.artifacts.pretrained.gguf import read_gguf  # noqa: E402
from attn.core.errors import CheckpointError  # noqa: E402
from attn.core.layers import SoftCappedProjection  # noqa: E402
from attn.core.quantized import Int4Linear, Int8Linear  # noqa: E402

SIZES = {"vocab_size": len(TOKENS), "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
# transformers' GGUF loading takes Gemma's score scale as 1 / sqrt(256) and Gemma 2's caps as 50 and 30: the
# cases it reads have heads of 256 and those caps.
GEMMA = {"head_dim": 256, "num_attention_heads": 2, "num_key_value_heads": 1, "sliding_window": 4}
IDS = torch.tensor([[5, 70, 12, 200, 9, 33, 44, 100, 7, 8, 250, 3]])


@dataclasses.dataclass(frozen=True)
class Case:
    arch: str
    config: type
    fields: dict
    read_by_transformers: bool = False


CASES = {
    "llama": Case("llama", LlamaConfig, {"tie_word_embeddings": False}),
    "qwen2": Case("qwen2", Qwen2Config, {"tie_word_embeddings": True}),
    "qwen3": Case("qwen3", Qwen3Config, {"head_dim": 24}),
    "gemma2": Case("gemma2", Gemma2Config, GEMMA, read_by_transformers=True),
    # caps of its own, heads of 16 scaled by 1 / sqrt(16), as llama.cpp scales all but the 27B model's
    "gemma2-capped": Case("gemma2", Gemma2Config, {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 5,
                                                   "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0}),
    # 46 layers: llama.cpp takes it for the 27B model and scales scores by 1 / sqrt(hidden / heads)
    "gemma2-27b": Case("gemma2", Gemma2Config, {"num_hidden_layers": 46, "head_dim": 8, "query_pre_attn_scalar": 16}),
    # six layers: the sixth attends to the whole prefix, the others slide (llama.cpp's pattern)
    "gemma3": Case("gemma3", Gemma3TextConfig, {**GEMMA, "num_hidden_layers": 6}, read_by_transformers=True),
    # a final cap, linear scaling of the full layers' rotation, and 6 embedding rows beyond the vocabulary
    "gemma3-scaled": Case("gemma3", Gemma3TextConfig, {
        "head_dim": 16, "num_hidden_layers": 6, "sliding_window": 5,
        "final_logit_softcapping": 5.0, "query_pre_attn_scalar": 16, "vocab_size": len(TOKENS) + 6,
        "rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e5, "factor": 2.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}}),
    "olmo2": Case("olmo2", Olmo2Config, {"rope_theta": 5e5}),
    "phi3": Case("phi3", Phi3Config, {}, read_by_transformers=True),
    "phi3-partial": Case("phi3", Phi3Config, {"partial_rotary_factor": 0.5, "sliding_window": 4}),
}
FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "olmo2", "phi3"]


def mix(name: str) -> Q:
    """Block types of a quantized file: 8-bit embedding, 4-bit queries and feed-forward, 5-bit the rest."""
    if name == "token_embd.weight":
        return Q.Q8_0
    return Q.Q4_0 if "ffn" in name or "attn_q" in name else Q.Q5_0


def hf_model(name: str) -> torch.nn.Module:
    """The case's model with every weight drawn from N(0, 0.2) and every norm's gain from N(1, 0.2) (Gemma's
    x / rms(x) * (1 + w) stores w: from N(0, 0.2))."""
    case = CASES[name]
    config = case.config(**{**SIZES, **case.fields})
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    generator = torch.Generator().manual_seed(1)
    unit = 0.0 if case.arch.startswith("gemma") else 1.0
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + unit * (tensor.dim() == 1))
    return model.eval()


def write(path: Path, name: str, quant=Q.F32, **changes) -> tuple[Path, torch.nn.Module]:
    """Writes the case's model as llama.cpp's converter does: what a checkpoint stores (no tied lm_head)."""
    hf = hf_model(name)
    stored = {key: tensor.numpy() for key, tensor in hf.state_dict().items()
              if key != "lm_head.weight" or not hf.config.tie_word_embeddings}
    write_gguf(path, CASES[name].arch, weights=stored, config=hf.config, quant=quant, **changes)
    return path, hf


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(file, the transformers model written into it) of each case and block types, written once."""
    files = {}

    def get(name: str, quant=Q.F32):
        key = (name, quant)
        if key not in files:
            files[key] = write(tmp_path_factory.mktemp(name) / "model.gguf", name, quant)
        return files[key]

    return get


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)


@pytest.mark.parametrize("name", list(CASES))
def test_logits_equal_those_of_the_model_written(name: str, written) -> None:
    path, hf = written(name)
    ours = logits(load_model(path, "cpu", dequantize=True).model)
    with torch.no_grad():
        expected = hf(IDS).logits[..., : len(TOKENS)]  # Gemma 3's file keeps the vocabulary's rows only
    assert ours.shape == expected.shape
    assert expected.abs().mean() > 0.05  # far above the tolerance, so a misplaced weight shows
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("quant", [Q.F32, mix], ids=["F32", "mix"])
@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.read_by_transformers])
def test_transformers_reads_the_file_as_attn_does(name: str, quant, written) -> None:
    path, _ = written(name, quant)
    ours = load_model(path, "cpu", dequantize=True).model
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                  attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(logits(ours), theirs(IDS).logits, atol=1e-4, rtol=0)
        prompt = IDS[:, :5]
        greedy = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=2)
    assert generate(ours, prompt.tolist(), GenerationConfig(max_new_tokens=8)) == greedy[:, 5:].tolist()


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_kept_quantized_file_loads_and_decodes(arch: str, written) -> None:
    """4-bit blocks as int4 layers (Phi-3's fused ones included), 5-bit as int8 rows; next-token distributions
    close to the dequantized model's; each cached step's token is the full forward's best."""
    path, _ = written(arch, mix)
    kept = load_model(path, "cpu").model
    floats = load_model(path, "cpu", dequantize=True).model
    block = kept.blocks[0]
    assert isinstance(block.ffn.w1, Int4Linear) and isinstance(block.attn.out, Int8Linear)
    assert isinstance(block.attn.qkv, Int4Linear if arch == "phi3" else Int8Linear)  # q, k and v in one block type
    p, q = logits(floats).log_softmax(-1), logits(kept).log_softmax(-1)
    assert float((p.exp() * (p - q)).sum(-1).mean()) < 0.02  # mean KL of the next-token distributions
    prompt = IDS[0, :4].tolist()
    new = generate(kept, [prompt], GenerationConfig(max_new_tokens=6))[0]
    with torch.no_grad():
        for i, token in enumerate(new):
            step = kept(torch.tensor([prompt + new[:i]]))[0, -1]
            assert step[token] >= step.max() - 2**-7 * step.abs().max(), i


def test_a_soft_capped_output_tied_to_a_quantized_embedding_stays_float(written) -> None:
    """Gemma 2's file has no output matrix: its capped projection takes the embedding's rows in float32."""
    path, _ = written("gemma2", mix)
    kept = load_model(path, "cpu").model
    floats = load_model(path, "cpu", dequantize=True).model
    assert isinstance(kept.lm_head, SoftCappedProjection) and kept.lm_head.cap == 30.0
    assert torch.equal(kept.lm_head.weight, floats.embeddings.tokens.weight)


def test_gemma_stores_every_norm_plus_one_and_the_reader_takes_it_off(written) -> None:
    path, hf = written("gemma3")
    raw = {tensor.name: np.array(tensor.data) for tensor in GGUFReader(path).tensors}
    weights = read_gguf(path).weights
    state = hf.state_dict()
    norms = sorted(name for name in state if name.endswith("norm.weight"))
    assert len(norms) == 6 * 6 + 1  # four per layer around attention and feed-forward, q and k, the final one
    shifted = sorted(name for name, tensor in weights.items() if tensor.offset == 1.0)
    assert shifted == norms
    for name in norms:
        torch.testing.assert_close(weights[name].floats(), state[name], atol=1e-6, rtol=0)
    assert np.array_equal(raw["blk.0.post_ffw_norm.weight"],
                          state["model.layers.0.post_feedforward_layernorm.weight"].numpy() + np.float32(1))
    assert np.array_equal(raw["blk.0.attn_q.weight"], state["model.layers.0.self_attn.q_proj.weight"].numpy())


def test_the_config_is_that_of_the_model_written(written) -> None:
    """Fields the files hold as keys or as llama.cpp's rules: scale, caps, windows, local rope base, rotation."""
    expected = {
        "gemma2-capped": {"query_pre_attn_scalar": 16, "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0,
                          "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]},
        "gemma2-27b": {"query_pre_attn_scalar": 16, "head_dim": 8},
        "gemma3-scaled": {"final_logit_softcapping": 5.0, "rope_local_base_freq": 1000.0, "rope_theta": 1e5,
                          "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "vocab_size": len(TOKENS),
                          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
        "phi3-partial": {"partial_rotary_factor": 0.5, "sliding_window": 4},
        "phi3": {"partial_rotary_factor": 1.0, "sliding_window": None},
    }
    for name, fields in expected.items():
        config = read_gguf(written(name)[0]).hf_config
        assert {key: config[key] for key in fields} == fields, name


REFUSED = {
    "a key Gemma 3 does not read": ("gemma3", {"changes": {"gemma3.attn_logit_softcapping": 50.0}},
                                    "gemma3.attn_logit_softcapping"),
    "OLMo 3's sliding layers": ("olmo2", {"changes": {"olmo2.attention.sliding_window": 4096}},
                                "olmo2.attention.sliding_window"),
    "a norm missing": ("gemma2", {"skip": {"blk.1.post_ffw_norm.weight"}}, "missing tensor.*blk.1.post_ffw_norm"),
    "Phi-3's long-context factors": ("phi3", {"extra": {"rope_factors_long.weight": np.ones(8, np.float32)}},
                                     "unexpected tensor.*rope_factors_long.weight"),
    "Phi-3's long rope": ("phi3", {"changes": {"phi3.rope.scaling.type": "longrope"}}, "rope scaling 'longrope'"),
    "a part of Gemma's heads rotated": ("gemma2", {"changes": {"gemma2.rope.dimension_count": 128}},
                                        "rotary embedding over 128 of the 256"),
}


@pytest.mark.parametrize("what", list(REFUSED))
def test_what_attn_does_not_compute_is_refused_by_name(tmp_path: Path, what: str) -> None:
    name, changes, message = REFUSED[what]
    path, _ = write(tmp_path / "m.gguf", name, **changes)
    with pytest.raises(CheckpointError, match=message):
        load_model(path, "cpu")

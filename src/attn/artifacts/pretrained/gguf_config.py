"""A GGUF file's metadata as the config.json that `transformers` would hold for the model.

Linear rope scaling is read from the metadata; Llama 3's, which llama.cpp stores as per-frequency factors
(`rope_freqs.weight`), is recovered from them by `llama3_scaling`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from attn.artifacts.pretrained.gguf_file import GgufTensorInfo, Metadata, check_dequantizable, tensor_bytes
from attn.core.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class GgufArchitecture:
    """How one GGUF architecture maps to its Hugging Face model."""

    model_type: str
    hf_class: str
    permuted: bool  # llama.cpp reordered the rows of q_proj and k_proj (see `attn.artifacts.pretrained.gguf`)
    qkv_bias: bool  # q_proj, k_proj and v_proj have biases
    qk_norm: bool  # an RMSNorm over each head of q and of k
    states_head_dim: bool  # config.json has head_dim; otherwise it must be hidden_size / heads
    config: Mapping[str, Any]  # config.json fields the architecture fixes


ARCHITECTURES: dict[str, GgufArchitecture] = {
    "llama": GgufArchitecture("llama", "LlamaForCausalLM", permuted=True, qkv_bias=False, qk_norm=False,
                              states_head_dim=True, config={"attention_bias": False, "mlp_bias": False}),
    "qwen2": GgufArchitecture("qwen2", "Qwen2ForCausalLM", permuted=False, qkv_bias=True, qk_norm=False,
                              states_head_dim=False, config={"use_sliding_window": False}),
    "qwen3": GgufArchitecture("qwen3", "Qwen3ForCausalLM", permuted=False, qkv_bias=False, qk_norm=True,
                              states_head_dim=True, config={"attention_bias": False, "use_sliding_window": False}),
}


@dataclasses.dataclass(frozen=True)
class HyperParameters:
    """The hyper-parameters that a GGUF file's metadata (`{architecture}.*`) gives."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    eps: float
    theta: float
    rope_scaling: dict[str, Any] | None


def hyper_parameters(meta: Metadata, arch: str, family: GgufArchitecture, tokens: int) -> HyperParameters:
    """The hyper-parameters of `{arch}.*`, checked against each other."""
    heads = meta.count(f"{arch}.attention.head_count")
    hidden = meta.count(f"{arch}.embedding_length")
    head_dim = meta.count(f"{arch}.attention.key_length", hidden // heads)
    hyper = HyperParameters(
        layers=meta.count(f"{arch}.block_count"),
        hidden=hidden,
        ffn=meta.count(f"{arch}.feed_forward_length"),
        heads=heads,
        kv_heads=meta.count(f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        vocab=meta.count(f"{arch}.vocab_size", tokens),
        context=meta.count(f"{arch}.context_length"),
        eps=meta.get(f"{arch}.attention.layer_norm_rms_epsilon", "float"),
        theta=meta.get(f"{arch}.rope.freq_base", "float", 10000.0),  # llama.cpp's default
        rope_scaling=_rope_scaling(meta, arch),
    )
    value_dim = meta.count(f"{arch}.attention.value_length", head_dim)
    rotary = meta.count(f"{arch}.rope.dimension_count", head_dim)
    checks = [
        (heads % hyper.kv_heads != 0, f"{heads} heads are not a multiple of {hyper.kv_heads} key/value heads"),
        (value_dim != head_dim, f"value heads of {value_dim} differ from key heads of {head_dim}"),
        (rotary != head_dim, f"rotary embedding over {rotary} of the {head_dim} dimensions of a head"),
        (head_dim % 2 or head_dim == 0, f"head size {head_dim}, not a positive even number"),
        (not family.states_head_dim and head_dim * heads != hidden,
         f"heads of {head_dim} where {family.model_type} needs {hidden} / {heads}"),
        (tokens > hyper.vocab, f"{tokens} tokens for {hyper.vocab} embedding rows"),
        (hyper.layers > len(meta.reader.tensors), f"{hyper.layers} layers in {len(meta.reader.tensors)} tensors"),
    ]
    problems = [message for failed, message in checks if failed]
    if problems:
        raise CheckpointError(f"{meta.path}: inconsistent or unsupported hyper-parameters: {'; '.join(problems)}; "
                              f"the file is corrupt, or a variant of {arch} attn does not read")
    return hyper


def _rope_scaling(meta: Metadata, arch: str) -> dict[str, Any] | None:
    """config.json's rope_scaling: None, or linear position interpolation."""
    kind = meta.get(f"{arch}.rope.scaling.type", "str", "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise CheckpointError(f"{meta.path}: rope scaling {kind!r} is not supported; attn reads GGUF files with "
                              "no rope scaling or linear scaling")
    return {"rope_type": "linear", "factor": meta.get(f"{arch}.rope.scaling.factor", "float")}


_LLAMA3_CONTEXT = 8192  # Llama 3's original_max_position_embeddings, the unit of its rope scaling's wavelengths


def llama3_scaling(meta: Metadata, tensor: GgufTensorInfo, hyper: HyperParameters) -> dict[str, Any]:
    """config.json's "llama3" rope scaling that gives the per-frequency factors of `rope_freqs.weight`.

    llama.cpp's converter divides rotary frequency i by factor f_i: 1 where the wavelength w_i is
    below L / high, `factor` where it is above L / low, and 1 / ((1 - s) / factor + s) between,
    with s = (L / w_i - low) / (high - low). Between the two ends s is a line in 1 / w_i, which two
    or more such frequencies fix; L scales low and high together, so it is taken as Llama 3's 8192.
    The result is checked by computing the factors back.
    """
    path, half = meta.path, hyper.head_dim // 2
    if hyper.rope_scaling is not None or tuple(int(n) for n in tensor.shape) != (half,):
        raise CheckpointError(f"{path}: rope_freqs.weight has dimensions {[int(n) for n in tensor.shape]}, expected "
                              f"[{half}], or the file sets another rope scaling too; convert the file again")
    check_dequantizable(path, tensor)
    factors = gguf.quants.dequantize(tensor_bytes(path, tensor), tensor.tensor_type).astype(np.float64)
    wavelengths = 2 * np.pi * hyper.theta ** (np.arange(half) * 2 / hyper.head_dim)
    scaling = _fit_llama3(factors, wavelengths)
    if scaling is None or not np.allclose(_llama3_factors(scaling, wavelengths), factors, rtol=1e-4):
        raise CheckpointError(f"{path}: rope_freqs.weight holds per-frequency rotary factors that are not Llama "
                              "3's rope scaling; attn reads no other")
    return scaling


def _fit_llama3(factors: np.ndarray, wavelengths: np.ndarray) -> dict[str, Any] | None:
    """The llama3 parameters of the line through the factors between the two ends, or None where there is none."""
    factor = float(factors.max())
    between = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    if not (np.isfinite(factors).all() and factors.min() > 0 and between.sum() >= 2):
        return None
    smooth = (1 / factors[between] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(1 / wavelengths[between], smooth, 1)  # s = slope / w + intercept
    if slope <= 0:
        return None
    low, high = -intercept * _LLAMA3_CONTEXT / slope, (1 - intercept) * _LLAMA3_CONTEXT / slope
    return {"rope_type": "llama3", "factor": _short(factor), "low_freq_factor": _short(low),
            "high_freq_factor": _short(high), "original_max_position_embeddings": _LLAMA3_CONTEXT}


def _short(value: float) -> float:
    """`value` to 6 significant digits: the round numbers that config.json held (1.0, not 0.9999997)."""
    return float(f"{value:.6g}")


def _llama3_factors(scaling: Mapping[str, Any], wavelengths: np.ndarray) -> np.ndarray:
    """What Llama 3's rope scaling divides each rotary frequency by, given the frequencies' wavelengths."""
    context, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    smooth = np.clip((context / wavelengths - low) / (high - low), 0.0, 1.0)
    return 1 / ((1 - smooth) / factor + smooth)


def hf_config(
    family: GgufArchitecture, hyper: HyperParameters, ids: Mapping[str, int | None], tied: bool
) -> dict[str, Any]:
    """The config.json of the model: bos, eos and pad are `ids`' own; `tied` when the file has no `output.weight`."""
    config = {
        "model_type": family.model_type,
        "architectures": [family.hf_class],
        "vocab_size": hyper.vocab,
        "hidden_size": hyper.hidden,
        "intermediate_size": hyper.ffn,
        "num_hidden_layers": hyper.layers,
        "num_attention_heads": hyper.heads,
        "num_key_value_heads": hyper.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": hyper.context,
        "rms_norm_eps": hyper.eps,
        "rope_theta": hyper.theta,
        "rope_scaling": hyper.rope_scaling,
        "attention_dropout": 0.0,
        "tie_word_embeddings": tied,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        **family.config,
    }
    if family.states_head_dim:
        config["head_dim"] = hyper.head_dim
    return config

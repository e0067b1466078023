"""A GGUF file's metadata as the config.json that `transformers` would hold for the model.

Each architecture reads the keys llama.cpp's converter writes for it and no others: a key under
`{architecture}.` that it does not know is refused, since it would change what the model computes.
Linear rope scaling is read from the metadata; Llama 3's, which llama.cpp stores as per-frequency factors
(`rope_freqs.weight`), is recovered from them by `llama3_scaling`. What the files leave out is taken as
llama.cpp takes it: Gemma's score scale (`query_pre_attn_scalar`), Gemma 2's soft caps and window where absent,
Gemma 3's local rope base, and which layers slide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import gguf
import numpy as np

from attn.artifacts.pretrained.gguf_file import GgufTensorInfo, Metadata, check_dequantizable, tensor_bytes
from attn.core.config import NormPlacement, QKNorm
from attn.core.errors import CheckpointError

# The keys under `{architecture}.` that every architecture reads (some of them by refusing values it lacks).
COMMON_KEYS = frozenset({
    "block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "rope.scaling.type",
    "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.finetuned",
})


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
    rotary: int  # dimensions of a head that rotate


def _no_fields(meta: Metadata, arch: str, hyper: HyperParameters) -> dict[str, Any]:
    return {}


@dataclasses.dataclass(frozen=True)
class GgufArchitecture:
    """How one GGUF architecture maps to its Hugging Face model.

    Attributes:
        permuted: llama.cpp reordered the rows of q_proj and k_proj (see `attn.artifacts.pretrained.gguf`).
        qkv_bias: q_proj, k_proj and v_proj have biases.
        qk_norm: an RMSNorm over each head of q and of k (HEAD), or over all of q and of k (PROJECTION).
        norms: where the layer's RMSNorms sit, which names them (`attn_norm`, `post_attention_norm`, ...).
        fused: q, k and v are one `attn_qkv`, gate and up one `ffn_up`, as in the Hugging Face checkpoint.
        norm_offset: what the converter added to every norm weight (Gemma's x / rms(x) * (1 + w) stores w).
        states_head_dim: config.json has head_dim; otherwise it must be hidden_size / heads.
        partial_rotary: `rope.dimension_count` may be a part of the head (config.json's partial_rotary_factor).
        config: config.json fields the architecture fixes.
        keys: metadata keys under `{architecture}.` read besides `COMMON_KEYS`.
        fields: config.json fields read from those keys.
    """

    model_type: str
    hf_class: str
    permuted: bool = False
    qkv_bias: bool = False
    qk_norm: QKNorm = QKNorm.NONE
    norms: NormPlacement = NormPlacement.PRE
    fused: bool = False
    norm_offset: float = 0.0
    states_head_dim: bool = True
    partial_rotary: bool = False
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    keys: frozenset[str] = frozenset()
    fields: Callable[[Metadata, str, HyperParameters], dict[str, Any]] = _no_fields


def _gemma_scale(hyper: HyperParameters, layers_27b: int) -> int:
    """Gemma's query_pre_attn_scalar, which GGUF files do not hold: llama.cpp scales scores by 1 / sqrt(hidden /
    heads) for the 27B models (recognised by their layer count, as it recognises them) and by 1 / sqrt(head_dim)
    for the others, as their config.json files say."""
    return hyper.hidden // hyper.heads if hyper.layers == layers_27b else hyper.head_dim


def _layer_types(layers: int, period: int) -> list[str]:
    """Every `period`-th layer attends to the whole prefix, the others slide (llama.cpp's pattern)."""
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)]


def _gemma2_fields(meta: Metadata, arch: str, hyper: HyperParameters) -> dict[str, Any]:
    """Soft caps and window default to gemma-2's (50, 30, 4096), as in llama.cpp."""
    return {
        "query_pre_attn_scalar": _gemma_scale(hyper, layers_27b=46),
        "attn_logit_softcapping": meta.get(f"{arch}.attn_logit_softcapping", "float", 50.0),
        "final_logit_softcapping": meta.get(f"{arch}.final_logit_softcapping", "float", 30.0),
        "sliding_window": meta.count(f"{arch}.attention.sliding_window", 4096),
        "layer_types": _layer_types(hyper.layers, 2),
    }


def _gemma3_fields(meta: Metadata, arch: str, hyper: HyperParameters) -> dict[str, Any]:
    """Without `attention.sliding_window` no layer slides; the sliding layers rotate with their own base, unscaled."""
    window = meta.get(f"{arch}.attention.sliding_window", "int", 0)
    return {
        "query_pre_attn_scalar": _gemma_scale(hyper, layers_27b=62),
        "final_logit_softcapping": meta.get(f"{arch}.final_logit_softcapping", "float", None),
        "sliding_window": window or None,
        "layer_types": _layer_types(hyper.layers, 6 if window else 1),
        "rope_local_base_freq": meta.get(f"{arch}.rope.freq_base_swa", "float", 10000.0),
    }


def _phi3_fields(meta: Metadata, arch: str, hyper: HyperParameters) -> dict[str, Any]:
    """A window of 0 is none (the converter's word for Phi-4's); llama.cpp ignores Phi-3's window, transformers
    applies it, and so does attn."""
    return {"sliding_window": meta.get(f"{arch}.attention.sliding_window", "int", 0) or None,
            "partial_rotary_factor": hyper.rotary / hyper.head_dim}


SILU = {"hidden_act": "silu"}
GEMMA = {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False}
ARCHITECTURES: dict[str, GgufArchitecture] = {
    "llama": GgufArchitecture("llama", "LlamaForCausalLM", permuted=True,
                              config={**SILU, "attention_bias": False, "mlp_bias": False}),
    "qwen2": GgufArchitecture("qwen2", "Qwen2ForCausalLM", qkv_bias=True, states_head_dim=False,
                              config={**SILU, "use_sliding_window": False}),
    "qwen3": GgufArchitecture("qwen3", "Qwen3ForCausalLM", qk_norm=QKNorm.HEAD,
                              config={**SILU, "attention_bias": False, "use_sliding_window": False}),
    "gemma2": GgufArchitecture(
        "gemma2", "Gemma2ForCausalLM", norms=NormPlacement.PRE_POST, norm_offset=1.0, config=GEMMA,
        keys=frozenset({"attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"}),
        fields=_gemma2_fields),
    "gemma3": GgufArchitecture(
        "gemma3_text", "Gemma3ForCausalLM", qk_norm=QKNorm.HEAD, norms=NormPlacement.PRE_POST, norm_offset=1.0,
        config=GEMMA, keys=frozenset({"final_logit_softcapping", "attention.sliding_window", "rope.freq_base_swa"}),
        fields=_gemma3_fields),
    "olmo2": GgufArchitecture("olmo2", "Olmo2ForCausalLM", qk_norm=QKNorm.PROJECTION, norms=NormPlacement.OUTPUT,
                              states_head_dim=False, config={**SILU, "attention_bias": False}),
    "phi3": GgufArchitecture("phi3", "Phi3ForCausalLM", fused=True, states_head_dim=False, partial_rotary=True,
                             config=SILU, keys=frozenset({"attention.sliding_window"}), fields=_phi3_fields),
}


def hyper_parameters(meta: Metadata, arch: str, family: GgufArchitecture, tokens: int) -> HyperParameters:
    """The hyper-parameters of `{arch}.*`, checked against each other."""
    _check_keys(meta, arch, family)
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
        rotary=meta.count(f"{arch}.rope.dimension_count", head_dim),
    )
    value_dim, rotary = meta.count(f"{arch}.attention.value_length", head_dim), hyper.rotary
    checks = [
        (heads % hyper.kv_heads != 0, f"{heads} heads are not a multiple of {hyper.kv_heads} key/value heads"),
        (value_dim != head_dim, f"value heads of {value_dim} differ from key heads of {head_dim}"),
        (rotary != head_dim and not (family.partial_rotary and 0 < rotary < head_dim and rotary % 2 == 0),
         f"rotary embedding over {rotary} of the {head_dim} dimensions of a head"),
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


def _check_keys(meta: Metadata, arch: str, family: GgufArchitecture) -> None:
    """Refuses a key under `{arch}.` that the architecture does not read: a variant it would compute wrongly."""
    known = COMMON_KEYS | family.keys
    unknown = sorted(key for key in meta.reader.fields if key.startswith(f"{arch}.")
                     and key.removeprefix(f"{arch}.") not in known)
    if unknown:
        raise CheckpointError(f"{meta.path}: metadata key(s) {', '.join(unknown[:5])} are not among those attn "
                              f"reads for {arch}, which llama.cpp's converter writes: the file holds a variant of "
                              f"{arch} attn does not compute; use a file of {family.hf_class}")


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
    meta: Metadata, family: GgufArchitecture, hyper: HyperParameters, ids: Mapping[str, int | None], tied: bool
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
        **family.fields(meta, meta.get("general.architecture", "str"), hyper),
    }
    if family.states_head_dim:
        config["head_dim"] = hyper.head_dim
    return config

"""Tiny GGUF files written with `gguf.GGUFWriter`, for the tests of `attn.artifacts.pretrained.gguf`.

`write_gguf` writes a model the way llama.cpp's converter (convert_hf_to_gguf.py) does: Hugging Face
weights (drawn at random, or a `transformers` model's) under GGUF's names, q_proj and k_proj rows
reordered for "llama"'s interleaved rotary layout, 1 added to Gemma's norms, Gemma 2's output
projection left out and Gemma 3's embedding cut to the vocabulary, and a byte-level BPE vocabulary in
the metadata. `converted_metadata` gives the `{arch}.*` keys the converter writes for a `transformers`
config. `write_gguf` returns the Hugging Face state dict it wrote, so that a test compares what the
reader gives back with what went in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from libgguf import quantize_rows
from tokenizers import pre_tokenizers

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, HEAD_DIM = 2, 32, 4, 2, 64, 8
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TOKENS = [*SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet()), "Ġt", "he", "Ġthe"]
TOKEN_TYPES = [3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS))


TOKENIZER = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt-2",
    "tokenizer.ggml.tokens": TOKENS,
    "tokenizer.ggml.token_type": TOKEN_TYPES,
    "tokenizer.ggml.merges": MERGES,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.padding_token_id": 2,
    "tokenizer.ggml.unknown_token_id": 0,
    "tokenizer.ggml.add_bos_token": False,
    "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
}


def metadata(arch: str = "llama", vocab: int = len(TOKENS)) -> dict[str, Any]:
    """The key-value metadata of a tiny model of `arch` (the architecture key itself excluded)."""
    return {
        f"{arch}.block_count": LAYERS,
        f"{arch}.context_length": 128,
        f"{arch}.embedding_length": HIDDEN,
        f"{arch}.feed_forward_length": FFN,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.rope.dimension_count": HEAD_DIM,
        f"{arch}.vocab_size": vocab,
        **TOKENIZER,
    }


def converted_metadata(config: Any) -> dict[str, Any]:
    """The `{arch}.*` keys llama.cpp's converter writes for a `transformers` config of a Llama-style decoder."""
    arch = ARCHES.get(config.model_type, config.model_type)
    rope = config.rope_parameters
    full, local = rope.get("full_attention", rope), rope.get("sliding_attention", {})
    keys = {
        "block_count": config.num_hidden_layers, "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads, "attention.head_count_kv": config.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps), "rope.freq_base": float(full["rope_theta"]),
    }
    if "head_dim" in config.to_dict():  # written where config.json states it
        keys |= {"attention.key_length": config.head_dim, "attention.value_length": config.head_dim}
    if full.get("rope_type") == "linear":
        keys |= {"rope.scaling.type": "linear", "rope.scaling.factor": float(full["factor"])}
    if arch == "gemma2":  # Gemma2Model writes no rope base
        del keys["rope.freq_base"]
        keys |= {"attn_logit_softcapping": float(config.attn_logit_softcapping),
                 "final_logit_softcapping": float(config.final_logit_softcapping),
                 "attention.sliding_window": config.sliding_window}
    if arch == "gemma3":
        if config.final_logit_softcapping:
            keys["final_logit_softcapping"] = float(config.final_logit_softcapping)
        if "sliding_attention" in config.layer_types:
            keys["attention.sliding_window"] = config.sliding_window
        keys["rope.freq_base_swa"] = float(local["rope_theta"])
    if arch == "phi3":
        rotary = int(full.get("partial_rotary_factor", 1.0) * config.hidden_size) // config.num_attention_heads
        keys |= {"rope.dimension_count": rotary, "attention.sliding_window": config.sliding_window or 0,
                 "rope.scaling.original_context_length": config.original_max_position_embeddings}
    return {f"{arch}.{key}": value for key, value in keys.items()}


def hf_weights(
    arch: str = "llama", vocab: int = len(TOKENS), tied: bool = True, head_dim: int = HEAD_DIM, seed: int = 0,
    hidden: int = HIDDEN, ffn: int = FFN,
) -> dict[str, np.ndarray]:
    """A random Hugging Face state dict of the tiny model (float32; Linear weights (out, in))."""
    rng = np.random.default_rng(seed)
    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, hidden)
    layer = {
        "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
        "mlp.gate_proj.weight": (ffn, hidden), "mlp.up_proj.weight": (ffn, hidden), "mlp.down_proj.weight": (hidden, ffn),
    }
    if arch == "qwen2":
        layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if arch == "qwen3":
        layer |= {"self_attn.q_norm.weight": (head_dim,), "self_attn.k_norm.weight": (head_dim,)}
    for i in range(LAYERS):
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
    return {name: rng.normal(0, 0.2, shape).astype(np.float32) for name, shape in shapes.items()}


ARCHES = {"gemma3_text": "gemma3"}  # GGUF's architecture of a transformers model_type, where they differ
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
POST_NORMED = {"gemma2", "gemma3", "olmo2"}  # post_attention_layernorm follows attention: post_attention_norm
NORM_PLUS_ONE = {"gemma2", "gemma3"}  # the converter stores Gemma's norms as 1 + w


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    """llama.cpp's name of a Hugging Face tensor: model.layers.0.mlp.up_proj.weight -> blk.0.ffn_up.weight."""
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    _, _, layer, *module, suffix = hf_name.split(".")
    name = ".".join(module)
    ours = "post_attention_norm" if arch in POST_NORMED and name == "post_attention_layernorm" else GGUF_NAMES[name]
    return f"blk.{layer}.{ours}.{suffix}"


def converted(arch: str, hf_name: str, tensor: np.ndarray, heads: tuple[int, int],
              tokens: int) -> np.ndarray | None:
    """A Hugging Face tensor as llama.cpp's converter stores it (before quantization), or None where it leaves it
    out; `heads` are the model's query and key/value heads, `tokens` the vocabulary's size."""
    if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        return permute(tensor, heads[0] if hf_name.endswith("q_proj.weight") else heads[1])
    if arch in NORM_PLUS_ONE and hf_name.endswith("norm.weight"):
        return tensor + np.float32(1)
    if arch == "gemma2" and hf_name == "lm_head.weight":
        return None
    if arch == "gemma3" and hf_name == "model.embed_tokens.weight":  # the rows of the vocabulary's tokens only
        return tensor[:tokens]
    return tensor


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of q_proj/k_proj rows: per head, row r * d/2 + j becomes row 2j + r."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def llama3_rope_factors(theta: float, head_dim: int, factor: float, low: float, high: float, context: int) -> np.ndarray:
    """`rope_freqs.weight` as llama.cpp's converter computes it from Llama 3's rope scaling."""
    factors = []
    for frequency in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelength = 2 * np.pi / frequency
        if wavelength < context / high:
            factors.append(1.0)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_llama3_scaled(path: Path, factors: np.ndarray) -> None:
    """A tiny llama with heads of 64 and Llama 3's rope base (500000), whose `rope_freqs.weight` is `factors`."""
    write_gguf(path, weights=hf_weights(head_dim=64), extra={"rope_freqs.weight": factors}, changes={
        "llama.attention.key_length": 64, "llama.rope.dimension_count": 64, "llama.rope.freq_base": 500000.0})


def _typed(value: Any) -> tuple[Any, GGUFValueType]:
    if isinstance(value, bool):
        return value, GGUFValueType.BOOL
    if isinstance(value, int):
        return value, GGUFValueType.UINT32
    if isinstance(value, float):
        return value, GGUFValueType.FLOAT32
    if isinstance(value, str):
        return value, GGUFValueType.STRING
    return list(value), GGUFValueType.ARRAY


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    weights: Mapping[str, np.ndarray] | None = None,
    quant: GGMLQuantizationType | Callable[[str], GGMLQuantizationType] = GGMLQuantizationType.F32,
    changes: Mapping[str, Any] | None = None,
    skip: Collection[str] = (),
    extra: Mapping[str, np.ndarray] | None = None,
    config: Any = None,
) -> dict[str, np.ndarray]:
    """Writes a tiny GGUF model of `arch` at `path`.

    Args:
        path: the file to write.
        arch: `general.architecture`.
        weights: the Hugging Face state dict to store (default `hf_weights(arch)`).
        quant: the block format of the matrices, or a function of the GGUF name that gives it (norms and biases
            stay F32, as llama.cpp keeps them); blocks are made by `libgguf`, GGUF's reference quantization.
        changes: metadata to set (None removes a key), over `metadata(arch)`.
        skip: GGUF tensor names to leave out.
        extra: GGUF tensors to add as they are.
        config: a `transformers` config of the weights: the metadata is then the converter's for it
            (`converted_metadata`) and the tokenizer's.

    Returns:
        The Hugging Face state dict, before any permutation or quantization.
    """
    weights = dict(weights if weights is not None else hf_weights(arch))
    model = metadata(arch) if config is None else {**converted_metadata(config), **TOKENIZER}
    values = {**model, **(changes or {})}
    writer = GGUFWriter(path, arch)
    for key, value in values.items():
        if value is not None:
            writer.add_key_value(key, *_typed(value))
    heads = (HEADS, KV_HEADS) if config is None else (config.num_attention_heads, config.num_key_value_heads)
    for hf_name, stored in weights.items():
        name = gguf_name(hf_name, arch)
        tensor = converted(arch, hf_name, stored, heads, len(values["tokenizer.ggml.tokens"]))
        if tensor is None or name in skip:
            continue
        kind = quant(name) if callable(quant) else quant
        if tensor.ndim == 2 and kind != GGMLQuantizationType.F32:
            writer.add_tensor(name, quantize_rows(tensor, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, tensor)
    for name, tensor in (extra or {}).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights

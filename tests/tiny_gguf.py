"""Tiny GGUF files written with `gguf.GGUFWriter`, for the tests of `attn.artifacts.pretrained.gguf`.

`write_gguf` writes a model of the Llama family the way llama.cpp's converter does: Hugging Face
weights (drawn at random) under GGUF's names, q_proj and k_proj rows reordered for "llama"'s
interleaved rotary layout, and a byte-level BPE vocabulary in the metadata. It returns the Hugging
Face state dict it wrote, so that a test compares what the reader gives back with what went in.
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


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name of a Hugging Face tensor: model.layers.0.mlp.up_proj.weight -> blk.0.ffn_up.weight."""
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    _, _, layer, *module, suffix = hf_name.split(".")
    return f"blk.{layer}.{GGUF_NAMES['.'.join(module)]}.{suffix}"


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

    Returns:
        The Hugging Face state dict, before any permutation or quantization.
    """
    weights = dict(weights if weights is not None else hf_weights(arch))
    values = {**metadata(arch), **(changes or {})}
    writer = GGUFWriter(path, arch)
    for key, value in values.items():
        if value is not None:
            writer.add_key_value(key, *_typed(value))
    tensors = {gguf_name(name): tensor for name, tensor in weights.items()}
    for name, tensor in tensors.items():
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            tensor = permute(tensor, HEADS if ".attn_q." in name else KV_HEADS)
        if name in skip:
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

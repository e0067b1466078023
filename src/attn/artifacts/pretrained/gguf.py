"""GGUF files (llama.cpp's format) of the Llama family: config, weights, tokenizer and chat template.

`read_gguf(path)` reads one file into a `GgufModel`: the config.json that `transformers` would hold for the model,
its weights under Hugging Face's names (`GgufTensor`s, read from disk when asked), its tokenizer and chat template. The Hugging Face
importer takes it from there; nothing here knows our own model. Architectures: `llama`, `qwen2` and `qwen3`
(Mistral's files are `llama`); tokenizers: byte-level BPE.

What the reader undoes of llama.cpp's conversion:
- Names: `blk.{i}.attn_q.weight` is `model.layers.{i}.self_attn.q_proj.weight`, and so on (`_tensor_table`).
- Dimensions: GGUF lists a tensor's dimensions innermost first, [in, out] for a linear map; the arrays `gguf`
  gives are row-major (out, in), the layout of `torch.nn.Linear.weight`.
- Rotary layout (`llama` only): llama.cpp rotates interleaved pairs (2j, 2j+1) where Hugging Face rotates two
  halves (j, j + d/2), so its converter reorders the rows of every head of q_proj and k_proj; `GgufTensor` puts
  them back.
- Rope scaling: llama.cpp stores Llama 3's as per-frequency factors (`rope_freqs.weight`).
- Floats: each metadata float32 becomes the shortest decimal that reads back as it (`gguf_file.Metadata`).

Files come from strangers. Every defect is a `CheckpointError` that names the file and the fix, found from the
header alone before any tensor is read; no read may pass the end of the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attn.artifacts.pretrained.gguf_config import (
    ARCHITECTURES,
    GgufArchitecture,
    HyperParameters,
    hf_config,
    hyper_parameters,
    llama3_scaling,
)
from attn.artifacts.pretrained.gguf_file import GgufTensorInfo, Metadata, check_dequantizable, open_gguf
from attn.artifacts.pretrained.gguf_tokenizer import tokenizer_of
from attn.artifacts.pretrained.gguf_weights import GgufTensor
from attn.core.errors import CheckpointError
from attn.data.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class GgufModel:
    """What a GGUF file holds, in Hugging Face's terms.

    Attributes:
        architecture: its `general.architecture`: "llama", "qwen2" or "qwen3".
        hf_config: the config.json of the model, bos/eos/pad ids included.
        weights: Hugging Face state-dict names -> the file's tensors: linear maps (out, in), norms (d,); no
            `lm_head.weight` when the embedding is tied.
        tokenizer: control tokens are special (matched whole, left out by `decode`), user-defined tokens are
            matched whole and kept.
        eot_id: the token that ends a turn (`tokenizer.ggml.eot_token_id`), or None where the file has none.
        add_bos: whether llama.cpp puts bos before a prompt; `tokenizer.encode(text, add_special=True)` does too.
    """

    path: Path
    architecture: str
    hf_config: dict[str, Any]
    weights: dict[str, GgufTensor]
    tokenizer: Tokenizer
    chat_template: str | None
    eot_id: int | None
    add_bos: bool


def read_gguf(path: str | Path) -> GgufModel:
    """Reads a GGUF file of the Llama family: config, weights (left on disk), tokenizer, chat template.

    Raises:
        CheckpointError: the file is not GGUF, is cut short or inconsistent, or holds an architecture, tokenizer,
            rope scaling or block format this reader does not support.
    """
    path = Path(path)
    meta = Metadata(open_gguf(path), path)
    architecture = meta.get("general.architecture", "str")
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"{path}: architecture {architecture!r} is not supported; attn reads GGUF files of "
                              f"{', '.join(ARCHITECTURES)}")
    family = ARCHITECTURES[architecture]
    tokenizer, ids, add_bos = tokenizer_of(meta)
    chat_template = meta.get("tokenizer.chat_template", "str", None)
    hyper = hyper_parameters(meta, architecture, family, tokenizer.vocab_size)
    tensors = {tensor.name: tensor for tensor in meta.reader.tensors}
    if "rope_freqs.weight" in tensors:
        hyper = dataclasses.replace(hyper, rope_scaling=llama3_scaling(meta, tensors.pop("rope_freqs.weight"), hyper))
    table = _tensor_table(family, hyper)
    _check_tensors(meta, tensors, table, hyper)
    config = hf_config(family, hyper, ids, tied="output.weight" not in tensors)
    weights = {table[name][0]: GgufTensor(path, tensor, table[name][2]) for name, tensor in tensors.items()}
    return GgufModel(path, architecture, config, weights, tokenizer, chat_template, ids["eot"], add_bos)


# -- tensors --------------------------------------------------------------------------------------


def _tensor_table(
    family: GgufArchitecture, hyper: HyperParameters
) -> dict[str, tuple[str, tuple[int, ...], int | None]]:
    """GGUF tensor name -> (Hugging Face name, GGUF dimensions (innermost first), heads whose rows
    llama.cpp reordered or None)."""
    d, q, kv = hyper.hidden, hyper.heads * hyper.head_dim, hyper.kv_heads * hyper.head_dim
    permuted = family.permuted
    layer = {
        "attn_norm.weight": ("input_layernorm.weight", (d,), None),
        "attn_q.weight": ("self_attn.q_proj.weight", (d, q), hyper.heads if permuted else None),
        "attn_k.weight": ("self_attn.k_proj.weight", (d, kv), hyper.kv_heads if permuted else None),
        "attn_v.weight": ("self_attn.v_proj.weight", (d, kv), None),
        "attn_output.weight": ("self_attn.o_proj.weight", (q, d), None),
        "ffn_norm.weight": ("post_attention_layernorm.weight", (d,), None),
        "ffn_gate.weight": ("mlp.gate_proj.weight", (d, hyper.ffn), None),
        "ffn_up.weight": ("mlp.up_proj.weight", (d, hyper.ffn), None),
        "ffn_down.weight": ("mlp.down_proj.weight", (hyper.ffn, d), None),
    }
    if family.qkv_bias:
        layer |= {f"attn_{x}.bias": (f"self_attn.{x}_proj.bias", (n,), None) for x, n in (("q", q), ("k", kv), ("v", kv))}
    if family.qk_norm:
        layer |= {f"attn_{x}_norm.weight": (f"self_attn.{x}_norm.weight", (hyper.head_dim,), None) for x in "qk"}
    table = {
        "token_embd.weight": ("model.embed_tokens.weight", (d, hyper.vocab), None),
        "output_norm.weight": ("model.norm.weight", (d,), None),
        "output.weight": ("lm_head.weight", (d, hyper.vocab), None),
    }
    for i in range(hyper.layers):
        table |= {f"blk.{i}.{ours}": (f"model.layers.{i}.{hf_name}", dims, heads)
                  for ours, (hf_name, dims, heads) in layer.items()}
    return table


def _check_tensors(meta: Metadata, tensors: Mapping[str, GgufTensorInfo],
                   table: Mapping[str, tuple[str, tuple[int, ...], int | None]], hyper: HyperParameters) -> None:
    """Checks each tensor's name, dimensions and block format; `output.weight` is absent when tied."""
    path = meta.path
    unknown = sorted(set(tensors) - set(table))
    missing = sorted(set(table) - set(tensors) - {"output.weight"})
    for names, what in ((unknown, "unexpected"), (missing, "missing")):
        if names:
            raise CheckpointError(f"{path}: {what} tensor(s) {', '.join(names[:5])} for a {hyper.layers}-layer "
                                  f"{meta.get('general.architecture', 'str')} model; the file is incomplete, or a "
                                  "variant attn does not read: convert or download it again")
    for name, tensor in tensors.items():
        dims, expected = tuple(int(n) for n in tensor.shape), table[name][1]
        if dims != expected:
            raise CheckpointError(f"{path}: tensor {name} has dimensions {list(dims)}, but the metadata make it "
                                  f"{list(expected)} ({hyper.heads} heads of {hyper.head_dim}, "
                                  f"{hyper.kv_heads} key/value heads, width {hyper.hidden}, feed-forward "
                                  f"{hyper.ffn}, {hyper.vocab} tokens); the file is inconsistent: convert it again")
        check_dequantizable(path, tensor)

"""GGUF files (llama.cpp's format) of Llama-style decoders: config, weights, tokenizer and chat template.

`read_gguf(path)` reads one file into a `GgufModel`: the config.json that `transformers` would hold for the model,
its weights under Hugging Face's names (`GgufTensor`s, read from disk when asked), its tokenizer and chat template.
The Hugging Face importer takes it from there; nothing here knows our own model. Architectures: `llama` (Mistral's
files are `llama`), `qwen2`, `qwen3`, `gemma2`, `gemma3` (its text model), `olmo2` and `phi3`; tokenizers:
byte-level BPE and SentencePiece (`gguf_tokenizer`).

What the reader undoes of llama.cpp's conversion:
- Names: `blk.{i}.attn_q.weight` is `model.layers.{i}.self_attn.q_proj.weight`, and so on (`tensor_table`);
  a layer's norms are named by their place (`NORMS`). Phi-3's fused `attn_qkv` and `ffn_up` (gate, then up)
  are its checkpoint's `qkv_proj` and `gate_up_proj` as they are.
- Gemma's norms: its converter adds 1 to every norm weight (`*norm.weight`, q and k norms included), storing the
  1 + w that x / rms(x) * (1 + w) multiplies by; `GgufTensor` subtracts it.
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
from typing import Any, NamedTuple

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
from attn.core.config import NormPlacement, QKNorm
from attn.core.errors import CheckpointError
from attn.data.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class GgufModel:
    """What a GGUF file holds, in Hugging Face's terms.

    Attributes:
        architecture: its `general.architecture`, a key of `ARCHITECTURES`.
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
    """Reads a GGUF file of a Llama-style decoder: config, weights (left on disk), tokenizer, chat template.

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
    table = tensor_table(family, hyper)
    _check_tensors(meta, tensors, table, hyper)
    config = hf_config(meta, family, hyper, ids, tied="output.weight" not in tensors)
    weights = {table[name].hf_name: GgufTensor(path, tensor, table[name].heads, table[name].offset)
               for name, tensor in tensors.items()}
    return GgufModel(path, architecture, config, weights, tokenizer, chat_template, ids["eot"], add_bos)


# -- tensors --------------------------------------------------------------------------------------


class _Entry(NamedTuple):
    """Where a GGUF tensor goes: its Hugging Face name, its GGUF dimensions (innermost first), the heads whose rows
    llama.cpp reordered (or None), and what its converter added to each value."""

    hf_name: str
    dims: tuple[int, ...]
    heads: int | None = None
    offset: float = 0.0


# A layer's norms, by place: GGUF name -> Hugging Face name.
NORMS: dict[NormPlacement, dict[str, str]] = {
    NormPlacement.PRE: {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"},
    NormPlacement.PRE_POST: {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    NormPlacement.OUTPUT: {"post_attention_norm": "post_attention_layernorm",
                           "post_ffw_norm": "post_feedforward_layernorm"},
}


def tensor_table(family: GgufArchitecture, hyper: HyperParameters) -> dict[str, _Entry]:
    """GGUF tensor name -> where it goes, for every tensor of the model (`output.weight` absent when tied)."""
    d, ffn, q, kv = hyper.hidden, hyper.ffn, hyper.heads * hyper.head_dim, hyper.kv_heads * hyper.head_dim
    permuted = family.permuted
    if family.fused:
        layer = {"attn_qkv.weight": _Entry("self_attn.qkv_proj.weight", (d, q + 2 * kv)),
                 "ffn_up.weight": _Entry("mlp.gate_up_proj.weight", (d, 2 * ffn))}
    else:
        layer = {
            "attn_q.weight": _Entry("self_attn.q_proj.weight", (d, q), hyper.heads if permuted else None),
            "attn_k.weight": _Entry("self_attn.k_proj.weight", (d, kv), hyper.kv_heads if permuted else None),
            "attn_v.weight": _Entry("self_attn.v_proj.weight", (d, kv)),
            "ffn_gate.weight": _Entry("mlp.gate_proj.weight", (d, ffn)),
            "ffn_up.weight": _Entry("mlp.up_proj.weight", (d, ffn)),
        }
    layer |= {"attn_output.weight": _Entry("self_attn.o_proj.weight", (q, d)),
              "ffn_down.weight": _Entry("mlp.down_proj.weight", (ffn, d))}
    norms = {f"{ours}.weight": (f"{theirs}.weight", d) for ours, theirs in NORMS[family.norms].items()}
    if family.qk_norm != QKNorm.NONE:
        whole = family.qk_norm == QKNorm.PROJECTION
        norms |= {f"attn_{x}_norm.weight": (f"self_attn.{x}_norm.weight", width if whole else hyper.head_dim)
                  for x, width in (("q", q), ("k", kv))}
    layer |= {name: _Entry(hf_name, (width,), offset=family.norm_offset) for name, (hf_name, width) in norms.items()}
    if family.qkv_bias:
        layer |= {f"attn_{x}.bias": _Entry(f"self_attn.{x}_proj.bias", (n,)) for x, n in (("q", q), ("k", kv), ("v", kv))}
    table = {
        "token_embd.weight": _Entry("model.embed_tokens.weight", (d, hyper.vocab)),
        "output_norm.weight": _Entry("model.norm.weight", (d,), offset=family.norm_offset),
        "output.weight": _Entry("lm_head.weight", (d, hyper.vocab)),
    }
    for i in range(hyper.layers):
        table |= {f"blk.{i}.{name}": entry._replace(hf_name=f"model.layers.{i}.{entry.hf_name}")
                  for name, entry in layer.items()}
    return table


def _check_tensors(meta: Metadata, tensors: Mapping[str, GgufTensorInfo], table: Mapping[str, _Entry],
                   hyper: HyperParameters) -> None:
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
        dims, expected = tuple(int(n) for n in tensor.shape), table[name].dims
        if dims != expected:
            raise CheckpointError(f"{path}: tensor {name} has dimensions {list(dims)}, but the metadata make it "
                                  f"{list(expected)} ({hyper.heads} heads of {hyper.head_dim}, "
                                  f"{hyper.kv_heads} key/value heads, width {hyper.hidden}, feed-forward "
                                  f"{hyper.ffn}, {hyper.vocab} tokens); the file is inconsistent: convert it again")
        check_dequantizable(path, tensor)

"""GGUF files (llama.cpp's format) of the Llama family: config, weights, tokenizer and chat template.

`read_gguf(path)` reads one file into a `GgufModel`: the config.json that `transformers` would hold
for the model, its weights under Hugging Face's names as float tensors, the tokenizer its metadata
describes and its chat template. The Hugging Face importer (`files`, `keymap`) takes it from
there; nothing here knows our own model. Architectures: `llama`, `qwen2` and `qwen3` (Mistral's
files are `llama`). Tokenizers: byte-level BPE (`tokenizer.ggml.model` "gpt2") with the
pre-tokenizers of `PRE_TOKENIZERS`.

What the reader undoes of llama.cpp's conversion:
- Names: `blk.{i}.attn_q.weight` is `model.layers.{i}.self_attn.q_proj.weight`, and so on (`_tensor_table`).
- Dimensions: GGUF lists a tensor's dimensions innermost first, [in, out] for a linear map; the
  arrays `gguf` gives are row-major (out, in), the layout of `torch.nn.Linear.weight`.
- Rotary layout (`llama` only): llama.cpp rotates interleaved pairs of a head's dimensions
  (2j, 2j+1) where Hugging Face rotates its two halves (j, j + d/2), so llama.cpp's converter
  reorders the rows of every head of q_proj and k_proj; `_unpermute` puts them back.
- Rope scaling: llama.cpp stores Llama 3's as per-frequency factors (`rope_freqs.weight`);
  `_llama3_scaling` recovers config.json's parameters from them.
- Quantization: `gguf.quants.dequantize` turns every block format (Q4_1, Q8_0, the K-quants, ...)
  into float32.
- Floats: metadata floats are float32; each becomes the shortest decimal that reads back as the
  same float32 (1e-05 rather than 9.999999747378752e-06), the value config.json held.

Files come from strangers. Every defect is a `CheckpointError` that names the file and the fix,
found from the header alone before any tensor is dequantized: not GGUF, cut short (no read may
pass the end of the file, so a length field that lies cannot send the parser past it), an
unknown architecture, tokenizer or block format, a missing or ill-typed metadata value, and a
tensor that is missing, unknown or shaped otherwise than the hyper-parameters say.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import tokenizers as hf
import torch
from gguf import ReaderTensor
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from torch import Tensor

from attn.artifacts.pretrained.gguf_file import Metadata, open_gguf
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError, ConfigError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types: special tokens, and added tokens that are not special


@dataclasses.dataclass(frozen=True)
class GgufModel:
    """What a GGUF file holds, in Hugging Face's terms.

    Attributes:
        path: the file.
        architecture: its `general.architecture`: "llama", "qwen2" or "qwen3".
        hf_config: the config.json of the model (`LlamaConfig`'s fields for "llama", `Qwen2Config`'s
            for "qwen2", `Qwen3Config`'s for "qwen3"), bos/eos/pad ids included.
        weights: Hugging Face state-dict names (`model.layers.0.self_attn.q_proj.weight`, ...) ->
            tensors: linear maps (out, in), norms (d,); no `lm_head.weight` when the embedding is tied.
        tokenizer: the file's tokenizer (kind "gguf"): bos, eos, pad and unk are the file's ids,
            control tokens are special (matched whole in a text, left out by `decode`), user-defined
            tokens are matched whole and kept.
        chat_template: the Jinja template of `tokenizer.chat_template`, or None.
        eot_id: the token that ends a turn (`tokenizer.ggml.eot_token_id`), or None where the file has none.
        add_bos: whether llama.cpp puts bos before a prompt; `tokenizer.encode(text, add_special=True)`
            does the same.
    """

    path: Path
    architecture: str
    hf_config: dict[str, Any]
    weights: dict[str, Tensor]
    tokenizer: Tokenizer
    chat_template: str | None
    eot_id: int | None
    add_bos: bool


@dataclasses.dataclass(frozen=True)
class _Family:
    """How one GGUF architecture maps to its Hugging Face model."""

    model_type: str
    hf_class: str
    permuted: bool  # llama.cpp reordered the rows of q_proj and k_proj (see the module docstring)
    qkv_bias: bool  # q_proj, k_proj and v_proj have biases
    qk_norm: bool  # an RMSNorm over each head of q and of k
    states_head_dim: bool  # config.json has head_dim; otherwise it must be hidden_size / heads
    config: Mapping[str, Any]  # config.json fields the architecture fixes


ARCHITECTURES: dict[str, _Family] = {
    "llama": _Family("llama", "LlamaForCausalLM", permuted=True, qkv_bias=False, qk_norm=False,
                     states_head_dim=True, config={"attention_bias": False, "mlp_bias": False}),
    "qwen2": _Family("qwen2", "Qwen2ForCausalLM", permuted=False, qkv_bias=True, qk_norm=False,
                     states_head_dim=False, config={"use_sliding_window": False}),
    "qwen3": _Family("qwen3", "Qwen3ForCausalLM", permuted=False, qkv_bias=False, qk_norm=True,
                     states_head_dim=True, config={"attention_bias": False, "use_sliding_window": False}),
}


@dataclasses.dataclass(frozen=True)
class _PreTokenizer:
    """How llama.cpp cuts a text into words for one value of `tokenizer.ggml.pre` (its llama-vocab.cpp)."""

    split: str | None  # the regex whose matches and the text between them are the words; None: GPT-2's own
    digits: bool = False  # every digit is a word of its own first
    ignore_merges: bool = False  # a word that is a token of the vocabulary is that token, merges or not
    add_bos: bool = False  # bos goes before a prompt unless `tokenizer.ggml.add_bos_token` says otherwise


def _words(digits: str) -> str:
    """The word regex of Llama 3 and Qwen2, which differ in how many digits make one word."""
    return (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits
            + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


_LLAMA3 = _PreTokenizer(_words(r"\p{N}{1,3}"), ignore_merges=True, add_bos=True)
PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    "gpt-2": _PreTokenizer(None),
    "smollm": _PreTokenizer(None, digits=True),
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _PreTokenizer(_words(r"\p{N}")),
}


def read_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> GgufModel:
    """Reads a GGUF file of the Llama family: config, dequantized weights, tokenizer, chat template.

    Args:
        path: the `.gguf` file.
        dtype: the floating dtype of the weights (dequantized to float32 first).

    Returns:
        The `GgufModel`.

    Raises:
        CheckpointError: the file is not GGUF, is cut short or inconsistent, or holds an architecture,
            tokenizer, rope scaling or block format this reader does not support (named in the message).
        ConfigError: `dtype` is not a floating dtype.
    """
    if not dtype.is_floating_point:
        raise ConfigError("dtype", f"{dtype} is not a floating dtype; use torch.float32, torch.bfloat16, ...")
    path = Path(path)
    meta = Metadata(open_gguf(path), path)
    architecture = meta.get("general.architecture", "str")
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"{path}: architecture {architecture!r} is not supported; attn reads GGUF files of "
                              f"{', '.join(ARCHITECTURES)}")
    family = ARCHITECTURES[architecture]
    tokenizer, ids, add_bos = _tokenizer(meta)
    chat_template = meta.get("tokenizer.chat_template", "str", None)
    hyper = _hyper(meta, architecture, family, tokenizer.vocab_size)
    tensors = {tensor.name: tensor for tensor in meta.reader.tensors}
    if "rope_freqs.weight" in tensors:
        hyper = dataclasses.replace(hyper, rope_scaling=_llama3_scaling(meta, tensors.pop("rope_freqs.weight"), hyper))
    table = _tensor_table(family, hyper)
    _check_tensors(meta, tensors, table, hyper)
    config = _hf_config(family, hyper, ids, tied="output.weight" not in tensors)
    weights = {table[name][0]: _dequantized(tensor, table[name][2], dtype) for name, tensor in tensors.items()}
    return GgufModel(path, architecture, config, weights, tokenizer, chat_template, ids["eot"], add_bos)


# -- hyper-parameters and the config --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Hyper:
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


def _hyper(meta: Metadata, arch: str, family: _Family, tokens: int) -> _Hyper:
    """The hyper-parameters of `{arch}.*`, checked against each other."""
    heads = meta.count(f"{arch}.attention.head_count")
    hidden = meta.count(f"{arch}.embedding_length")
    head_dim = meta.count(f"{arch}.attention.key_length", hidden // heads)
    hyper = _Hyper(
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


def _llama3_scaling(meta: Metadata, tensor: ReaderTensor, hyper: _Hyper) -> dict[str, Any]:
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
    _check_dequantizable(path, tensor)
    factors = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
    wavelengths = 2 * np.pi * hyper.theta ** (np.arange(half) * 2 / hyper.head_dim)
    scaling = _fit_llama3(factors, wavelengths)
    if scaling is None or not np.allclose(_llama3_factors(scaling, wavelengths), factors, rtol=1e-4):
        raise CheckpointError(f"{path}: rope_freqs.weight holds per-frequency rotary factors that are not Llama "
                              "3's rope scaling; attn reads no other")
    return scaling


def _fit_llama3(factors: np.ndarray, wavelengths: np.ndarray) -> dict[str, Any] | None:
    """The llama3 parameters of the line through the factors between the two ends, or None where
    there is no such line (fewer than two such factors, or factors that are not positive numbers)."""
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


def _hf_config(family: _Family, hyper: _Hyper, ids: Mapping[str, int | None], tied: bool) -> dict[str, Any]:
    """The config.json of the model."""
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


# -- tensors --------------------------------------------------------------------------------------


def _tensor_table(family: _Family, hyper: _Hyper) -> dict[str, tuple[str, tuple[int, ...], int | None]]:
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


def _check_tensors(meta: Metadata, tensors: Mapping[str, ReaderTensor],
                   table: Mapping[str, tuple[str, tuple[int, ...], int | None]], hyper: _Hyper) -> None:
    """Checks that every tensor is expected, of the expected dimensions and of a block format that
    `gguf` dequantizes, and that every expected tensor is there (`output.weight` is absent when tied)."""
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
        _check_dequantizable(path, tensor)


def _check_dequantizable(path: Path, tensor: ReaderTensor) -> None:
    """Checks that `gguf.quants.dequantize` handles the tensor's block format, tried on one block of zeros."""
    _, block_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    try:
        gguf.quants.dequantize(np.zeros((1, block_bytes), np.uint8), tensor.tensor_type)
    except NotImplementedError:
        raise CheckpointError(f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the "
                              "gguf package cannot dequantize; use a file quantized to a common type "
                              "(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, ...)") from None


def _dequantized(tensor: ReaderTensor, permuted_heads: int | None, dtype: torch.dtype) -> Tensor:
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # (out, in) or (d,), float32
    if permuted_heads is not None:
        values = _unpermute(values, permuted_heads)
    return torch.from_numpy(np.array(values, dtype=np.float32)).to(dtype)  # a copy: the file stays untouched


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of q_proj or k_proj (heads * d, ...) back from llama.cpp's order to Hugging Face's.

    llama.cpp keeps row r * d/2 + j of a head (half r, dimension j) as row 2j + r of that head.
    """
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# -- the tokenizer --------------------------------------------------------------------------------


def _tokenizer(meta: Metadata) -> tuple[Tokenizer, dict[str, int | None], bool]:
    """The tokenizer of the metadata, the special ids (bos, eos, pad, unk, eot) and whether bos
    starts a prompt."""
    path = meta.path
    model = meta.get("tokenizer.ggml.model", "str")
    if model != "gpt2":
        kind = "a SentencePiece vocabulary" if model == "llama" else "this vocabulary"
        raise CheckpointError(f"{path}: tokenizer.ggml.model is {model!r} ({kind}); attn reads byte-level BPE "
                              "vocabularies ('gpt2') only")
    pre_name = meta.get("tokenizer.ggml.pre", "str", None)
    if pre_name not in PRE_TOKENIZERS:
        raise CheckpointError(f"{path}: tokenizer.ggml.pre is {pre_name!r}, a pre-tokenizer attn does not know; "
                              f"it knows {', '.join(PRE_TOKENIZERS)}")
    pre = PRE_TOKENIZERS[pre_name]
    tokens = meta.get("tokenizer.ggml.tokens", "str[]")
    types = meta.get("tokenizer.ggml.token_type", "int[]", [1] * len(tokens))
    if len(types) != len(tokens):
        raise CheckpointError(f"{path}: {len(tokens)} tokens but {len(types)} token types; convert the file again")
    ids = {role: meta.count(f"tokenizer.ggml.{key}_token_id", None, below=len(tokens)) for role, key in
           (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"), ("eot", "eot"))}
    added = {role: meta.get(f"tokenizer.ggml.add_{role}_token", "bool", pre.add_bos and role == "bos")
             for role in ("bos", "eos")}
    for role in ("bos", "eos"):
        if added[role] and ids[role] is None:
            raise CheckpointError(f"{path}: tokenizer.ggml.add_{role}_token is set, but the file names no {role} "
                                  "token; convert the file again")
    backend = hf.Tokenizer(_bpe(path, tokens, meta.get("tokenizer.ggml.merges", "str[]"), pre.ignore_merges))
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED])
    if added["bos"] or added["eos"]:  # the frame of `encode(text, add_special=True)`
        single = ["$A"]
        if added["bos"]:
            single.insert(0, tokens[ids["bos"]])
        if added["eos"]:
            single.append(tokens[ids["eos"]])
        ends = {tokens[ids[role]]: ids[role] for role in ("bos", "eos") if added[role]}
        backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=list(ends.items()))
    tokenizer = Tokenizer(backend, "gguf", {role: ids[role] for role in ("bos", "eos", "pad", "unk")})
    if tokenizer.vocab_size != len(tokens):
        raise CheckpointError(f"{path}: the vocabulary of {len(tokens)} tokens reads as {tokenizer.vocab_size}; "
                              "convert the file again")
    return tokenizer, ids, added["bos"]


def _bpe(path: Path, tokens: list[str], merges: list[str], ignore_merges: bool) -> models.BPE:
    """The BPE model of a byte-level vocabulary (tokens spelt in GPT-2's byte alphabet) and its merges."""
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        twice = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise CheckpointError(f"{path}: token {twice!r} is in the vocabulary twice; convert the file again")
    pairs = [tuple(merge.split(" ")) for merge in merges]
    bad = next((merges[i] for i, pair in enumerate(pairs) if len(pair) != 2), None)
    if bad is not None:
        raise CheckpointError(f"{path}: merge {bad!r} is not two tokens apart by one space; convert the file again")
    try:
        return models.BPE(vocab, pairs, ignore_merges=ignore_merges)
    except Exception as err:  # `tokenizers` reports a merge of unknown tokens as a plain Exception
        raise CheckpointError(f"{path}: the merges do not fit the vocabulary ({err}); convert the file again") from err


def _pre_tokenizer(pre: _PreTokenizer) -> pre_tokenizers.PreTokenizer:
    """The `tokenizers` pre-tokenizer that cuts words as llama.cpp does, then spells their bytes."""
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre.digits else []
    if pre.split is not None:
        steps.append(pre_tokenizers.Split(Regex(pre.split), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre.split is None))
    return pre_tokenizers.Sequence(steps)

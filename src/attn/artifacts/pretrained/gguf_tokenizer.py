"""The tokenizer that a GGUF file's metadata describes (`tokenizer.ggml.*`), as a `Tokenizer` of kind "gguf".

attn reads byte-level BPE vocabularies (`tokenizer.ggml.model` "gpt2"): the words are cut as llama.cpp cuts
them, then spelt in GPT-2's byte alphabet. `add_special=True` puts bos (and eos) around a text where the file
asks for them, as llama.cpp does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tokenizers as hf
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from attn.artifacts.pretrained.gguf_file import Metadata
from attn.core.errors import CheckpointError
from attn.data.tokenizers import Tokenizer

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types: special tokens, and added tokens that are not special


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


def tokenizer_of(meta: Metadata) -> tuple[Tokenizer, dict[str, int | None], bool]:
    """The tokenizer, the special ids (bos, eos, pad, unk, eot) and whether bos starts a prompt."""
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

"""The tokenizer that a GGUF file's metadata describes (`tokenizer.ggml.*`), as a `Tokenizer` of kind "gguf".

Two kinds of vocabulary (`tokenizer.ggml.model`), each encoded as llama.cpp's llama-vocab.cpp encodes it:
- "gpt2", byte-level BPE (SmolLM2, Llama 3, Qwen2): the words are cut as llama.cpp cuts them for the file's
  `tokenizer.ggml.pre`, then spelt in GPT-2's byte alphabet and merged by the file's merges.
- "llama", SentencePiece (Llama 2, Mistral 7B, Gemma, Phi-3): spaces become "▁", a "▁" goes before every run of
  text that starts the prompt or follows a special token (unless `tokenizer.ggml.add_space_prefix` is false, as
  in Gemma's files), and the whole run is merged pair by pair, the pair that joins into the best-scored token
  first; a character no token spells becomes its byte tokens (`<0xAB>`). Decoding turns "▁" back into spaces,
  byte tokens into bytes, and drops the first space of the text, as SentencePiece does.

Control and unknown tokens are special: matched whole in a text, left out by `decode`. User-defined tokens are
matched whole and kept. `add_special=True` puts bos (and eos) around a text where the file asks for them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import tokenizers as hf
from gguf import TokenType
from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from attn.artifacts.pretrained.gguf_file import Metadata
from attn.core.errors import CheckpointError
from attn.data.tokenizers import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")  # the spelling `tokenizers`' byte fallback looks up
_SPACE = "▁"  # U+2581, SentencePiece's space


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
# llama.cpp's special ids of a SentencePiece vocabulary whose file names none (if the vocabulary has them)
_SENTENCEPIECE_IDS = {"bos": 1, "eos": 2, "unk": 0}
_ID_KEYS = {"bos": "bos", "eos": "eos", "pad": "padding", "unk": "unknown", "eot": "eot"}


def tokenizer_of(meta: Metadata) -> tuple[Tokenizer, dict[str, int | None], bool]:
    """The tokenizer, the special ids (bos, eos, pad, unk, eot) and whether bos starts a prompt.

    Raises:
        CheckpointError: a vocabulary attn does not read, or metadata that disagree with one another (lengths,
            ids out of range, a byte token not spelt `<0xAB>`), naming the file and the key.
    """
    path = meta.path
    model = meta.get("tokenizer.ggml.model", "str")
    if model not in ("gpt2", "llama"):
        raise CheckpointError(f"{path}: tokenizer.ggml.model is {model!r}; attn reads byte-level BPE ('gpt2') and "
                              "SentencePiece ('llama') vocabularies")
    sentencepiece = model == "llama"
    tokens = meta.get("tokenizer.ggml.tokens", "str[]")
    types = _per_token(meta, "tokenizer.ggml.token_type", "int[]", tokens,
                       None if sentencepiece else [TokenType.NORMAL] * len(tokens))
    defaults = {role: i for role, i in _SENTENCEPIECE_IDS.items() if sentencepiece and i < len(tokens)}
    ids = {role: meta.count(f"tokenizer.ggml.{key}_token_id", defaults.get(role), below=len(tokens))
           for role, key in _ID_KEYS.items()}
    if sentencepiece:
        backend, add_bos = _sentencepiece(meta, tokens, types, ids["unk"]), True
    else:
        backend, add_bos = _byte_level(meta, tokens)
    added = {"bos": meta.get("tokenizer.ggml.add_bos_token", "bool", add_bos),
             "eos": meta.get("tokenizer.ggml.add_eos_token", "bool", False)}
    for role in ("bos", "eos"):
        if added[role] and ids[role] is None:
            raise CheckpointError(f"{path}: tokenizer.ggml.add_{role}_token is set, but the file names no {role} "
                                  "token; convert the file again")
    kinds = list(zip(tokens, types, strict=True))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in kinds if kind in (TokenType.UNKNOWN, TokenType.CONTROL)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in kinds if kind == TokenType.USER_DEFINED])
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


def _per_token(meta: Metadata, key: str, kind: str, tokens: list[str], default: list | None) -> list:
    """An array of the metadata with one entry per token (`default` where the file has none)."""
    values = meta.get(key, kind) if default is None else meta.get(key, kind, default)
    if len(values) != len(tokens):
        raise CheckpointError(f"{meta.path}: {len(tokens)} tokens (tokenizer.ggml.tokens) but {len(values)} entries "
                              f"in {key}; convert the file again")
    return values


def _vocabulary(path: Path, tokens: list[str]) -> dict[str, int]:
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        twice = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise CheckpointError(f"{path}: token {twice!r} is in tokenizer.ggml.tokens twice; convert the file again")
    return vocab


# -- byte-level BPE ("gpt2") ----------------------------------------------------------------------


def _byte_level(meta: Metadata, tokens: list[str]) -> tuple[hf.Tokenizer, bool]:
    """The pipeline of a byte-level vocabulary and whether its pre-tokenizer puts bos first by default."""
    path = meta.path
    pre_name = meta.get("tokenizer.ggml.pre", "str", None)
    if pre_name not in PRE_TOKENIZERS:
        raise CheckpointError(f"{path}: tokenizer.ggml.pre is {pre_name!r}, a pre-tokenizer attn does not know; "
                              f"it knows {', '.join(PRE_TOKENIZERS)}")
    pre = PRE_TOKENIZERS[pre_name]
    merges = meta.get("tokenizer.ggml.merges", "str[]")
    pairs = [tuple(merge.split(" ")) for merge in merges]
    bad = next((merges[i] for i, pair in enumerate(pairs) if len(pair) != 2), None)
    if bad is not None:
        raise CheckpointError(f"{path}: merge {bad!r} is not two tokens apart by one space; convert the file again")
    try:
        model = models.BPE(_vocabulary(path, tokens), pairs, ignore_merges=pre.ignore_merges)
    except Exception as err:  # `tokenizers` reports a merge of unknown tokens as a plain Exception
        raise CheckpointError(f"{path}: the merges do not fit the vocabulary ({err}); convert the file again") from err
    backend = hf.Tokenizer(model)
    backend.pre_tokenizer = word_cutter(pre)
    backend.decoder = decoders.ByteLevel()
    return backend, pre.add_bos


def word_cutter(pre: _PreTokenizer) -> pre_tokenizers.PreTokenizer:
    """The `tokenizers` pre-tokenizer that cuts words as llama.cpp does for `pre`, spelt in GPT-2's byte alphabet."""
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre.digits else []
    if pre.split is not None:
        steps.append(pre_tokenizers.Split(Regex(pre.split), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre.split is None))
    return pre_tokenizers.Sequence(steps)


# -- SentencePiece ("llama") ----------------------------------------------------------------------


def _sentencepiece(meta: Metadata, tokens: list[str], types: list[int], unk: int | None) -> hf.Tokenizer:
    """The pipeline of a SentencePiece vocabulary: "▁" for spaces, merges by score, byte fallback."""
    path = meta.path
    scores = _per_token(meta, "tokenizer.ggml.scores", "float[]", tokens, None)
    bytes_ = (t for t, kind in zip(tokens, types, strict=True) if kind == TokenType.BYTE)
    misspelt = next((t for t in bytes_ if not _BYTE_TOKEN.fullmatch(t)), None)
    if misspelt is not None:
        raise CheckpointError(f"{path}: tokenizer.ggml.token_type makes {misspelt!r} a byte token, but byte tokens "
                              "are spelt <0x00> to <0xFF>; convert the file again")
    vocab = _vocabulary(path, tokens)
    backend = hf.Tokenizer(models.BPE(vocab, _merges_by_score(tokens, scores, vocab), byte_fallback=True,
                                      fuse_unk=True, unk_token=None if unk is None else tokens[unk]))
    prefix = meta.get("tokenizer.ggml.add_space_prefix", "bool", True)
    # A normalizer, not a pre-tokenizer, so that the "▁" goes before every run of text between special tokens,
    # even one that starts with a space, as llama.cpp puts it.
    spaces = [normalizers.Replace(" ", _SPACE)]
    texts = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        spaces.insert(0, normalizers.Prepend(_SPACE))
        texts.append(decoders.Strip(" ", 1, 0))
    backend.normalizer = normalizers.Sequence(spaces)
    backend.decoder = decoders.Sequence(texts)
    return backend


def _merges_by_score(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every pair of tokens that joins into a token, the best-scored join first.

    llama.cpp merges the adjacent pair whose join is the token of highest score; as BPE merges, that is these
    pairs in this order. Joins of equal score: the longer left part first, as transformers orders them.
    """
    ranked = []
    for index, (token, score) in enumerate(zip(tokens, scores, strict=True)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, -cut, cut - len(token), index, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


# -- the other way: metadata of a tokenizer -------------------------------------------------------


def tokenizer_metadata(tokenizer: Tokenizer, rows: int) -> dict[str, Any]:
    """The `tokenizer.ggml.*` metadata that `tokenizer_of` reads back as `tokenizer`.

    A pipeline with byte fallback is SentencePiece's ("llama"): each token's score ranks the first merge that
    makes it, so that merging by score merges in the same order. Any other BPE is byte-level ("gpt2"), its
    pre-tokenizer one of `PRE_TOKENIZERS`. The vocabulary is padded to the model's `rows` with unused tokens,
    as llama.cpp's converter pads it.

    Raises:
        CheckpointError: the tokenizer is of a kind GGUF files do not hold, or has more tokens than `rows`.
    """
    pipeline = tokenizer.pipeline()
    model = (pipeline or {}).get("model", {})
    if model.get("type") != "BPE" or tokenizer.vocab_size > rows:
        raise CheckpointError(f"a {tokenizer.kind} tokenizer of {tokenizer.vocab_size} tokens cannot go into a GGUF "
                              f"file of {rows} embedding rows: GGUF holds byte-level BPE and SentencePiece "
                              "vocabularies no larger than the embedding")
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    added = {token["id"]: token["special"] for token in pipeline["added_tokens"]}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    roles, sentencepiece = tokenizer.roles, bool(model.get("byte_fallback"))
    types = [_token_type(i, token, added, roles["unk"], sentencepiece) for i, token in enumerate(tokens)]
    padding = [f"[PAD{i}]" for i in range(len(tokens), rows)]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "llama" if sentencepiece else "gpt2",
        "tokenizer.ggml.tokens": tokens + padding,
        "tokenizer.ggml.token_type": [int(kind) for kind in types] + [int(TokenType.UNUSED)] * len(padding),
    }
    if sentencepiece:
        meta["tokenizer.ggml.scores"] = _scores(tokens, merges) + [-1e9] * len(padding)
        prepends = [step for step in _steps(pipeline.get("normalizer")) if step["type"] == "Prepend"]
        meta["tokenizer.ggml.add_space_prefix"] = bool(prepends)
    else:
        meta["tokenizer.ggml.pre"] = _pre_name(pipeline, bool(model.get("ignore_merges")))
        meta["tokenizer.ggml.merges"] = [" ".join(pair) for pair in merges]
        meta["tokenizer.ggml.add_space_prefix"] = False
    for role, key in _ID_KEYS.items():
        if roles.get(role) is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = roles[role]
    framed = tokenizer.encode("a", add_special=True)
    meta["tokenizer.ggml.add_bos_token"] = roles["bos"] is not None and framed[0] == roles["bos"]
    if roles["eos"] is not None and framed[-1] == roles["eos"]:  # written only when set, as llama.cpp's converter
        meta["tokenizer.ggml.add_eos_token"] = True
    return meta


def _token_type(index: int, token: str, added: dict[int, bool], unk: int | None, sentencepiece: bool) -> TokenType:
    if sentencepiece and index == unk and added.get(index):
        return TokenType.UNKNOWN
    if index in added:
        return TokenType.CONTROL if added[index] else TokenType.USER_DEFINED
    if sentencepiece and _BYTE_TOKEN.fullmatch(token):
        return TokenType.BYTE
    return TokenType.NORMAL


def _scores(tokens: list[str], merges: list[tuple[str, ...]]) -> list[float]:
    """Minus the rank of the first merge that makes each token; the tokens no merge makes score below them all."""
    first: dict[str, int] = {}
    for rank, pair in enumerate(merges):
        first.setdefault("".join(pair), rank)
    return [-float(first.get(token, len(merges))) for token in tokens]


def _steps(part: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The steps of a pipeline part, a Sequence's in order."""
    if part is None:
        return []
    inner = part.get("pretokenizers", part.get("normalizers"))
    return inner if part["type"] == "Sequence" and inner is not None else [part]


def _pre_name(pipeline: dict[str, Any], ignore_merges: bool) -> str:
    """The `tokenizer.ggml.pre` whose words are the pipeline's."""
    def plain(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:  # trim_offsets moves offsets, not ids
        return [{key: value for key, value in step.items() if key != "trim_offsets"} for step in steps]

    ours = plain(_steps(pipeline.get("pre_tokenizer")))
    for name, pre in PRE_TOKENIZERS.items():
        theirs = plain(_steps(json.loads(word_cutter(pre).__getstate__())))
        if theirs == ours and pre.ignore_merges == ignore_merges:
            return name
    raise CheckpointError(f"the tokenizer cuts words with {json.dumps(pipeline.get('pre_tokenizer'))}, which is none "
                          f"of the pre-tokenizers llama.cpp names ({', '.join(PRE_TOKENIZERS)}); a GGUF file "
                          "cannot hold it")

"""The Hugging Face `tokenizers` pipelines that `attn.data.tokenizers.Tokenizer` wraps: those it trains (normaliser,
pre-tokenizer, model, decoder and the frame of `add_special=True`) and those of GPT-2's and BERT's files.

Special-token ids of every tokenizer we *train* are fixed:

| role | id | bpe, byte-bpe, unigram, chars | wordpiece |
| --- | --- | --- | --- |
| pad | 0 | `<pad>` | `[PAD]` |
| unk | 1 | `<unk>` | `[UNK]` |
| bos | 2 | `<s>` | `<s>` |
| eos | 3 | `</s>` | `</s>` |
| cls | 4 | `<cls>` | `[CLS]` |
| sep | 5 | `<sep>` | `[SEP]` |
| mask | 6 | `<mask>` | `[MASK]` |

Every trained pipeline frames a text as `<s> … </s>`, `wordpiece` as `[CLS] … [SEP]`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import tokenizers as hf
from tokenizers import (
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from attn.data.checks import check_at_least
from attn.data.files import read_tokenizer_file
from attn.core.errors import ConfigError

SEQ_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "<cls>", "<sep>", "<mask>")
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "<s>", "</s>", "[CLS]", "[SEP]", "[MASK]")
GPT2_SPECIAL = "<|endoftext|>"
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def bpe_pipeline(texts: Iterable[str], vocab_size: int, byte_level: bool) -> hf.Tokenizer:
    """A BPE pipeline over NFC characters and Metaspace `▁` (`bpe`), or over UTF-8 bytes as GPT-2 (`byte-bpe`)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    check_at_least("vocab_size", vocab_size, minimum_vocab_size("byte-bpe" if byte_level else "bpe"))
    if byte_level:
        backend = hf.Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
    else:
        backend = hf.Tokenizer(models.BPE(unk_token="<unk>"))
        _set_metaspace_pipeline(backend)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SEQ_SPECIALS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    backend.train_from_iterator(_non_empty(texts), trainer)
    return _framed(backend, SEQ_SPECIALS, "<s>", "</s>")


def unigram_pipeline(texts: Iterable[str], vocab_size: int) -> hf.Tokenizer:
    """A Unigram language-model pipeline (SentencePiece's algorithm) over the NFC + Metaspace pipeline of `bpe`."""
    check_at_least("vocab_size", vocab_size, minimum_vocab_size("unigram"))
    backend = hf.Tokenizer(models.Unigram())
    _set_metaspace_pipeline(backend)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=list(SEQ_SPECIALS), unk_token="<unk>", show_progress=False
    )
    alphabet: set[str] = set()
    stream = _noting_alphabet(*_metaspace_parts(), _non_empty(texts), alphabet)
    try:
        backend.train_from_iterator(stream, trainer)
    except Exception as err:  # the Rust trainer's own failures are plain Exceptions
        if type(err) is not Exception or "not large enough" not in str(err):
            raise
    # Below this size the trainer fails, or keeps every character and overshoots vocab_size.
    smallest = len(alphabet) + len(SEQ_SPECIALS) + 1
    if vocab_size < smallest:
        raise ConfigError("vocab_size", f"is {vocab_size}, but a unigram vocabulary holds every one of the "
                                        f"{len(alphabet)} distinct characters of the training texts besides its "
                                        f"{len(SEQ_SPECIALS)} special tokens, so it needs at least {smallest}; "
                                        "raise it")
    return _framed(backend, SEQ_SPECIALS, "<s>", "</s>")


def wordpiece_pipeline(texts: Iterable[str], vocab_size: int, lowercase: bool) -> hf.Tokenizer:
    """A BERT-style WordPiece pipeline trained on `texts`."""
    check_at_least("vocab_size", vocab_size, minimum_vocab_size("wordpiece"))
    backend = hf.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    _set_bert_pipeline(backend, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(WORDPIECE_SPECIALS), show_progress=False
    )
    backend.train_from_iterator(_non_empty(texts), trainer)
    return _framed(backend, WORDPIECE_SPECIALS, "[CLS]", "[SEP]")


def chars_pipeline(texts: Iterable[str]) -> hf.Tokenizer:
    """A character pipeline: the special tokens, then every distinct character of `texts` in code-point order."""
    alphabet: set[str] = set()
    for text in _non_empty(texts):
        alphabet.update(text)
    vocab = {token: i for i, token in enumerate([*SEQ_SPECIALS, *sorted(alphabet)])}
    # A BPE model without merges is a character model that encodes faster than a one-character word-level split.
    backend = hf.Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    # The vocabulary holds the special tokens already; they still have to be marked special.
    return _framed(backend, SEQ_SPECIALS, "<s>", "</s>")


def gpt2_pipeline(vocab_json: str | Path, merges_txt: str | Path) -> hf.Tokenizer:
    """GPT-2's byte-level BPE read from its `vocab.json` and `merges.txt`; unframed, as in HF's GPT-2."""
    model = read_tokenizer_file(lambda: models.BPE.from_file(str(vocab_json), str(merges_txt)), vocab_json, merges_txt)
    backend = hf.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([GPT2_SPECIAL])
    return backend


def bert_pipeline(vocab_txt: str | Path, lowercase: bool) -> hf.Tokenizer:
    """BERT's WordPiece read from its `vocab.txt`, encoding like HF's `BertTokenizer`."""
    model = read_tokenizer_file(lambda: models.WordPiece.from_file(str(vocab_txt), unk_token="[UNK]"), vocab_txt)
    backend = hf.Tokenizer(model)
    _set_bert_pipeline(backend, lowercase)
    return _framed(backend, [t for t in BERT_SPECIALS if model.token_to_id(t) is not None], "[CLS]", "[SEP]")


def file_pipeline(path: str | Path) -> hf.Tokenizer:
    """The pipeline of a Hugging Face tokenizer.json; CheckpointError when missing, unreadable or broken."""
    return read_tokenizer_file(lambda: _checked_backend(hf.Tokenizer.from_file(str(path))), path)


def _checked_backend(backend: hf.Tokenizer) -> hf.Tokenizer:
    """A loaded pipeline, checked: ValueError for an id at or past its size (no embedding row for it) in the
    vocabulary or the frame; PanicException when the frame (post-processor) names a token it does not hold."""
    backend.no_padding()  # a file's padding to 2**31 tokens would otherwise fill the memory below
    backend.no_truncation()
    size = backend.get_vocab_size(with_added_tokens=True)
    token, top = max(backend.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1], default=("", -1))
    if top >= size:
        raise ValueError(f"token {token!r} has id {top}, but the vocabulary has {size} ids; every id must lie "
                         f"from 0 to {size - 1}")
    framed = backend.encode_batch_fast([""], add_special_tokens=True)[0].ids  # the frame alone: no word to miss
    if max(framed, default=-1) >= size:
        raise ValueError(f"the frame (post_processor) adds id {max(framed)}, but the vocabulary has {size} ids")
    return backend


def minimum_vocab_size(kind: str) -> int:
    """The smallest `vocab_size` a trained kind accepts: its special tokens, the 256 byte symbols of `byte-bpe`,
    and one token more (`unigram` also needs one per character, which `unigram_pipeline` checks)."""
    alphabet = len(pre_tokenizers.ByteLevel.alphabet()) if kind == "byte-bpe" else 0
    return len(WORDPIECE_SPECIALS if kind == "wordpiece" else SEQ_SPECIALS) + alphabet + 1


def _framed(backend: hf.Tokenizer, specials: Sequence[str], first: str, last: str) -> hf.Tokenizer:
    """`backend` with `specials` marked special and `first $A last` as the frame of `add_special=True`."""
    backend.add_special_tokens(list(specials))
    backend.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}",
        special_tokens=[(first, backend.token_to_id(first)), (last, backend.token_to_id(last))],
    )
    return backend


def _metaspace_parts() -> tuple[normalizers.Normalizer, pre_tokenizers.PreTokenizer]:
    return normalizers.NFC(), pre_tokenizers.Metaspace()


def _set_metaspace_pipeline(backend: hf.Tokenizer) -> None:
    backend.normalizer, backend.pre_tokenizer = _metaspace_parts()
    backend.decoder = decoders.Metaspace()


def _set_bert_pipeline(backend: hf.Tokenizer, lowercase: bool) -> None:
    backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()


def _noting_alphabet(
    normalizer: normalizers.Normalizer, pre_tokenizer: pre_tokenizers.PreTokenizer, texts: Iterable[str],
    alphabet: set[str],
) -> Iterator[str]:
    """`texts`, passed on while `alphabet` collects the characters of their pieces (normalised, split).

    The normaliser and pre-tokenizer must not be those of the tokenizer that reads the stream: it holds them
    locked while it trains, so a call to them from the stream would wait forever.
    """
    for text in texts:
        pieces = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
        alphabet.update(*(piece for piece, _ in pieces))
        yield text


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    """The non-empty texts, as a stream; checks (reading up to the first one) that there is one."""
    stream = (text for text in texts if text)
    first = next(stream, None)
    if first is None:
        raise ConfigError("texts", "the training texts are empty; pass at least one non-empty text")
    return itertools.chain([first], stream)

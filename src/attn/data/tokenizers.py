"""Tokenizers: one `Tokenizer` class over Hugging Face `tokenizers` (Rust) pipelines.

Each kind (`Tokenizer.kind`) is described in `attn.data.tokenizer_kinds`. Trained tokenizers get fixed
special-token ids (pad 0, unk 1, bos 2, eos 3, cls 4, sep 5, mask 6); loaded ones keep the ids of their files
(`attn.data.tokenizer_files`). Special-token roles are found by name or declared by a file
(`attn.data.tokenizer_roles`). A tokenizer never pads or truncates: `attn.data.collate` pads batches and bounds lengths.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.core.errors import CheckpointError, ConfigError
from attn.data.files import library_call
from attn.data.marian_tokenizer import MarianSentencePiece
from attn.data.sentencepiece_tokenizer import SentencePieceModel
from attn.data.text import check_unicode
from attn.data.tokenizer_files import (
    Backend,
    read_tokenizer,
    tokenizer_digest,
    write_tokenizer,
)
from attn.data.tokenizer_kinds import (
    KINDS,
    MARIAN_KIND,
    SENTENCEPIECE_KIND,
    TRAINED_KINDS,
)
from attn.data.tokenizer_pipelines import (
    bert_pipeline,
    bpe_pipeline,
    chars_pipeline,
    file_pipeline,
    gpt2_pipeline,
    unigram_pipeline,
    wordpiece_pipeline,
)
from attn.data.tokenizer_roles import checked_roles, find_roles


def _role(role: str) -> property:
    def get(self: Tokenizer) -> int | None:
        return self._role_ids[role]

    return property(get, doc=f"Id of the {role} token, or None when this tokenizer has none.")


class Tokenizer:
    """Text ↔ token ids, wrapping a `tokenizers.Tokenizer`. Build one with a classmethod.

    Example:
        >>> from attn import Tokenizer
        >>> tokenizer = Tokenizer.train_chars(["to be or not to be"])
        >>> ids = tokenizer.encode("to be")
        >>> tokenizer.decode(ids)
        'to be'
    """

    pad_id = _role("pad")
    unk_id = _role("unk")
    bos_id = _role("bos")
    eos_id = _role("eos")
    cls_id = _role("cls")
    sep_id = _role("sep")
    mask_id = _role("mask")

    def __init__(self, backend: Backend, kind: str, roles: Mapping[str, int | None] | None = None) -> None:
        """Wrap a ready pipeline; prefer the `train_*`, `from_*` and `load` constructors.

        Args:
            backend: the pipeline (or its stand-in for `marian-spm` and `sentencepiece`); its padding and
                truncation are switched off.
            roles: role -> id stated by the source file (None: "has none"); other roles are found by name.

        Raises:
            ConfigError: an unknown kind or role, or a role id outside the vocabulary.
        """
        if kind not in KINDS:
            raise ConfigError("kind", f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")
        backend.no_padding()
        backend.no_truncation()
        self._backend = backend
        self._kind = kind
        self._declared = checked_roles(roles, backend.get_vocab_size(with_added_tokens=True)) if roles else {}
        self._role_ids = {**find_roles(backend.get_added_tokens_decoder()), **self._declared}

    # -- training ---------------------------------------------------------------------------

    @classmethod
    def train(cls, kind: str, texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> Tokenizer:
        """Train a tokenizer of any kind of `TRAINED_KINDS`, reading `texts` once, lazily, as a stream.

        Args:
            vocab_size: target vocabulary size, special tokens included (`chars` has its own).
            lowercase: `wordpiece` only: lower-case and strip accents first.

        Raises:
            ConfigError: an unknown kind, a vocabulary below the kind's minimum, or no text.
        """
        if kind not in TRAINED_KINDS:
            raise ConfigError("kind", f"unknown kind {kind!r}; choose one of {', '.join(TRAINED_KINDS)}")
        if kind == "chars":
            return cls.train_chars(texts)
        if kind == "wordpiece":
            return cls.train_wordpiece(texts, vocab_size, lowercase)
        if kind == "unigram":
            return cls.train_unigram(texts, vocab_size)
        return cls.train_bpe(texts, vocab_size, byte_level=kind == "byte-bpe")

    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int, byte_level: bool = False) -> Tokenizer:
        """Train a BPE tokenizer; for translation, train on the texts of both languages.

        Args:
            texts: read once and lazily, so a generator of chunks (`attn.data.text_files.text_chunks`)
                trains on a corpus larger than memory.
            vocab_size: target vocabulary size, special tokens included.
            byte_level: split UTF-8 bytes (kind `byte-bpe`, never unknown) instead of NFC characters (`bpe`).
        """
        return cls(bpe_pipeline(texts, vocab_size, byte_level), "byte-bpe" if byte_level else "bpe")

    @classmethod
    def train_unigram(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """Train a Unigram language-model tokenizer (SentencePiece's algorithm) with `tokenizers`.

        Args:
            vocab_size: special tokens included; it must hold every character of `texts` besides.

        Raises:
            ConfigError: `vocab_size` is below the minimum or cannot hold the characters of `texts`.
        """
        return cls(unigram_pipeline(texts, vocab_size), "unigram")

    @classmethod
    def train_wordpiece(cls, texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> Tokenizer:
        """Train a BERT-style WordPiece tokenizer (for encoder models).

        Args:
            vocab_size: target vocabulary size, special tokens included.
            lowercase: lower-case and strip accents first, as uncased BERT does.
        """
        return cls(wordpiece_pipeline(texts, vocab_size, lowercase), "wordpiece")

    @classmethod
    def train_chars(cls, texts: Iterable[str]) -> Tokenizer:
        """Build a character-level tokenizer: one id per distinct character of `texts`, read once and lazily.

        Characters get ids in code-point order after the special tokens; an unseen character encodes to unk.
        """
        return cls(chars_pipeline(texts), "chars")

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def from_gpt2_files(cls, vocab_json: str | Path, merges_txt: str | Path) -> Tokenizer:
        """Load GPT-2's byte-level BPE from its `vocab.json` and `merges.txt`.

        Returns:
            The tokenizer (kind `gpt2`); `<|endoftext|>` is bos and eos, pad and unk are None.

        Raises:
            CheckpointError: a file is missing or unreadable.
        """
        return cls(gpt2_pipeline(vocab_json, merges_txt), "gpt2")

    @classmethod
    def from_bert_vocab(cls, vocab_txt: str | Path, lowercase: bool = True) -> Tokenizer:
        """Load a BERT WordPiece tokenizer (kind `bert`, encodes like HF's `BertTokenizer`) from its `vocab.txt`.

        Args:
            lowercase: whether the model is uncased (lower-cases and strips accents).

        Raises:
            CheckpointError: the file is missing or unreadable.
        """
        return cls(bert_pipeline(vocab_txt, lowercase), "bert")

    @classmethod
    def from_file(cls, tokenizer_json: str | Path) -> Tokenizer:
        """Load any Hugging Face `tokenizer.json` (kind `file`), with its padding and truncation switched off.

        Raises:
            CheckpointError: the file is missing or is not a tokenizer.
        """
        return cls(file_pipeline(tokenizer_json), "file")

    @classmethod
    def from_sentencepiece(cls, model_file: str | Path) -> Tokenizer:
        """Load a SentencePiece model file (`*.model`, `*.spm`): kind `sentencepiece`, with its own ids and text.

        Raises:
            CheckpointError: the file is missing or is not a SentencePiece model.
        """
        return cls(SentencePieceModel.from_file(model_file), SENTENCEPIECE_KIND)

    @classmethod
    def from_marian_files(cls, directory: str | Path) -> Tokenizer:
        """Load a Marian model's tokenizer: `source.spm`, `target.spm`, `vocab.json` (+ `tokenizer_config.json`).

        Args:
            directory: the Hugging Face Marian directory (or a checkpoint saved with this tokenizer).

        Returns:
            The tokenizer (kind `marian-spm`): `</s>` is eos, `<unk>` unk, `<pad>` pad; no bos.

        Raises:
            CheckpointError: a file is missing or corrupt, or the directory has separate vocabularies.
        """
        return cls(MarianSentencePiece.from_directory(directory), MARIAN_KIND)

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer's files and `attn_tokenizer.json` (kind, declared roles) into `directory`.

        Args:
            directory: created if needed; usually the checkpoint's folder.
        """
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        write_tokenizer(folder, self._backend, self._kind, self._declared)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a tokenizer: what `save` wrote, or a Hugging Face or SentencePiece file.

        Args:
            path: a directory written by `save` (or `attn tokenizer train`), or a file or directory of another
                library (`attn.data.tokenizer_files.read_tokenizer` lists them).

        Returns:
            The tokenizer; one written by `save` gives the same ids as the one saved, on every text.

        Raises:
            CheckpointError: nothing loadable there, or a file is missing or corrupt.
        """
        return cls(*read_tokenizer(Path(path)))

    def digest(self) -> str:
        """SHA-256 (64 hex digits) of the files `save` writes: two tokenizers with one digest give the same ids."""
        return tokenizer_digest(self._backend, self._kind, self._declared)

    # -- use --------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """How the tokenizer was made: one of `KINDS`."""
        return self._kind

    @property
    def roles(self) -> dict[str, int | None]:
        """The id of each special-token role (pad, unk, bos, eos, cls, sep, mask); None where it has none."""
        return dict(self._role_ids)

    def pipeline(self) -> dict[str, Any] | None:
        """The Hugging Face pipeline as tokenizer.json holds it; None where the backend is SentencePiece's own
        (kinds `sentencepiece` and `marian-spm`)."""
        to_str = getattr(self._backend, "to_str", None)
        return None if to_str is None else json.loads(to_str())

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (the embedding table's rows)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of one text (`encode_batch` says what it raises).

        Args:
            add_special: add the tokenizer's frame (`<s> … </s>` or `[CLS] … [SEP]`; see `tokenizer_kinds`).
        """
        return self.encode_batch([text], add_special)[0]

    def encode_batch(self, texts: Sequence[str], add_special: bool = False) -> list[list[int]]:
        """Token ids of many texts, encoded in parallel; `add_special` as in `encode`.

        Raises:
            TextError: a text is not valid Unicode (`attn.data.text.check_unicode`).
        """
        for number, text in enumerate(texts, start=1):
            check_unicode(text, f"text {number}" if len(texts) > 1 else "text")
        # The offsets that the slower `encode_batch` also computes are never used here.
        encodings = library_call(lambda: self._backend.encode_batch_fast(list(texts), add_special_tokens=add_special),
                                 lambda err: CheckpointError(f"the {self._kind} tokenizer failed on a text ({err}); "
                                                             "its files are corrupt: restore them"))
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of a sequence of ids; `skip_special` leaves out special tokens (pad, bos, eos, unk, ...)."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special: bool = True) -> list[str]:
        """Texts of many id sequences; `skip_special` as in `decode`."""
        return self._backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string, or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token string of an id, or None when the id is out of range."""
        return self._backend.id_to_token(token_id)


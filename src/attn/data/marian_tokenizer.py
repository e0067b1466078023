"""Marian's tokenizer: SentencePiece pieces looked up in the model's own vocabulary.

An opus-mt directory ships `source.spm` and `target.spm` (SentencePiece models) and `vocab.json` (piece -> model
id). The model's ids are not SentencePiece's: a text is cut into pieces by `source.spm`, each piece is looked up
in `vocab.json` (a piece it lacks becomes `<unk>`), and `</s>` ends a framed source. Decoding maps ids back to
pieces through the same vocabulary and joins them with SentencePiece. `MarianSentencePiece` does what
`transformers`' `MarianTokenizer` does, token for token (tests/parity/test_marian_text.py):

- the text of a special token (`</s>`, `<unk>`, `<pad>`) is cut out before SentencePiece sees the rest, and a
  language code `>>xx<<` opening a chunk is one token;
- no other normalisation happens here (`MarianTokenizer.normalize`, the Moses punctuation normaliser, is not part
  of its encoding path); SentencePiece's own rules (NFKC, spaces) apply;
- decoding skips the special tokens, `<unk>` included, when asked; text between two special tokens is joined by
  SentencePiece, `▁` becomes a space and the ends are stripped;
- with one shared vocabulary (`separate_vocabs=false`, every opus-mt model) `MarianTokenizer` decodes with
  `source.spm` (`transformers` 4.x used `target.spm`, which joins pieces the same way unless the two models'
  normalisation rules differ), so this does too. Separate vocabularies are refused.

It implements the part of `tokenizers.Tokenizer` that `attn.data.tokenizers.Tokenizer` uses, as that class's
backend (kind `marian-spm`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers as hf

from attn.data.files import read_sentencepiece, read_tokenizer_file
from attn.core.errors import CheckpointError

SOURCE_SPM = "source.spm"
TARGET_SPM = "target.spm"
VOCAB_FILE = "vocab.json"
SETTINGS_FILE = "tokenizer_config.json"
FILES = (SOURCE_SPM, TARGET_SPM, VOCAB_FILE)
WORD_MARK = "▁"  # SentencePiece's word-start mark
ROLE_DEFAULTS = {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}
# The tokens-cleanup of `transformers` (`clean_up_tokenization`), applied when the settings ask for it.
CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@dataclasses.dataclass(frozen=True)
class Encoding:
    """What `encode_batch_fast` gives per text: `attn.data.tokenizers.Tokenizer` reads only the ids."""

    ids: list[int]


def is_marian_directory(folder: Path) -> bool:
    """Whether `folder` holds Marian's tokenizer files (one SentencePiece model is enough to say so)."""
    return (folder / SOURCE_SPM).exists() or (folder / TARGET_SPM).exists()


class MarianSentencePiece:
    """Marian's source/target SentencePiece models and shared vocabulary. Build one with `from_directory`."""

    def __init__(self, source: Any, target: Any, vocab: Mapping[str, int], settings: Mapping[str, Any]) -> None:
        """Args:
            source, target: the `sentencepiece.SentencePieceProcessor`s of `source.spm` and `target.spm`.
            vocab: `vocab.json`, piece -> id; it holds every special token of `settings`.
            settings: `tokenizer_config.json` (empty when absent), written back by `save_files`.
        """
        self._processors = (source, target)
        self._source = source
        self._decoding = source  # one shared vocabulary: MarianTokenizer decodes with the source model
        self._vocab = dict(vocab)
        self._pieces = {i: piece for piece, i in self._vocab.items()}
        self._settings = dict(settings)
        self._specials = _special_tokens(settings)
        self._special_ids = {self._vocab[t] for t in self._specials}
        self._unk = self._vocab[_token(settings, "unk_token")]
        self._eos = self._vocab[_token(settings, "eos_token")]
        alternatives = "|".join(map(re.escape, sorted(self._specials, key=len, reverse=True)))
        self._splitter = re.compile(f"({alternatives})")
        self._clean_up = bool(settings.get("clean_up_tokenization_spaces", False))

    @classmethod
    def from_directory(cls, folder: str | Path) -> MarianSentencePiece:
        """Reads `source.spm`, `target.spm`, `vocab.json` and the optional `tokenizer_config.json`.

        Raises:
            CheckpointError: a file is missing or unreadable, vocab.json lacks a special token, or the settings ask
                for separate vocabularies.
        """
        folder = Path(folder)
        settings = _json_object(folder / SETTINGS_FILE) if (folder / SETTINGS_FILE).is_file() else {}
        if settings.get("separate_vocabs"):
            raise CheckpointError(
                f"{folder / SETTINGS_FILE}: separate_vocabs=true (a target_vocab.json beside vocab.json) is not "
                "supported; attn reads Marian models with one shared vocabulary"
            )
        for name in FILES:
            if not (folder / name).is_file():
                raise CheckpointError(f"{folder / name}: no such file; a Marian tokenizer needs "
                                      f"{', '.join(FILES)} (MarianTokenizer.save_pretrained writes them)")
        source, target = (read_sentencepiece(folder / name) for name in (SOURCE_SPM, TARGET_SPM))
        vocab = _json_object(folder / VOCAB_FILE)
        if not all(type(i) is int and i >= 0 for i in vocab.values()):
            raise CheckpointError(f"{folder / VOCAB_FILE}: expected an object of pieces to ids >= 0; "
                                  "restore the model's own vocab.json")
        for token in _special_tokens(settings):
            if token not in vocab:
                raise CheckpointError(f"{folder / VOCAB_FILE}: has no {token!r}, a special token of the tokenizer; "
                                      "restore the model's own vocab.json")
        return cls(source, target, vocab, settings)

    def save_files(self, folder: Path) -> None:
        """Writes the files that `from_directory` and `MarianTokenizer.from_pretrained` read."""
        for name, processor in zip((SOURCE_SPM, TARGET_SPM), self._processors, strict=True):
            (folder / name).write_bytes(processor.serialized_model_proto())
        settings = self._settings or {"tokenizer_class": "MarianTokenizer", "separate_vocabs": False}
        for name, data in ((VOCAB_FILE, self._vocab), (SETTINGS_FILE, settings)):
            (folder / name).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    # -- the part of `tokenizers.Tokenizer` that `attn.data.tokenizers.Tokenizer` uses ---------------

    def no_padding(self) -> None:
        """Never pads (nothing to switch off)."""

    def no_truncation(self) -> None:
        """Never truncates (nothing to switch off)."""

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """The number of entries of vocab.json, as `MarianTokenizer.vocab_size`."""
        return len(self._vocab)

    def get_added_tokens_decoder(self) -> dict[int, hf.AddedToken]:
        """The special tokens by id (their names give `attn.data.tokenizers.Tokenizer` its roles)."""
        return {self._vocab[t]: hf.AddedToken(t, special=True) for t in self._specials}

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._pieces.get(token_id)

    def encode_batch_fast(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        """Ids of each text; `add_special_tokens` ends each with `</s>`."""
        frame = [self._eos] if add_special_tokens else []
        return [Encoding(self._encode(text) + frame) for text in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, as `MarianTokenizer.decode`."""
        pieces = [self._piece(i) for i in ids if not (skip_special_tokens and i in self._special_ids)]
        text, run = "", []
        for piece in pieces:
            if piece in self._specials:  # a special token is never given to SentencePiece
                text += self._decoding.decode_pieces(run) + piece + " "
                run = []
            else:
                run.append(piece)
        text = (text + self._decoding.decode_pieces(run)).replace(WORD_MARK, " ").strip()
        if self._clean_up:
            for before, after in CLEANUPS:
                text = text.replace(before, after)
        return text

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    # -- internals ----------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        ids = []
        for chunk in self._splitter.split(text):  # the special tokens, captured, and the text between
            if chunk in self._specials:
                ids.append(self._vocab[chunk])
            elif chunk:
                code, rest = _language_code(chunk)
                pieces = code + self._source.encode(rest, out_type=str)
                ids.extend(self._vocab.get(piece, self._unk) for piece in pieces)
        return ids

    def _piece(self, token_id: int) -> str:
        if token_id in self._pieces:
            return self._pieces[token_id]
        # As MarianTokenizer: an id that vocab.json lacks falls back to the SentencePiece model's piece.
        if 0 <= token_id < self._decoding.get_piece_size():
            return self._decoding.id_to_piece(token_id)
        return self._pieces[self._unk]


def _language_code(chunk: str) -> tuple[list[str], str]:
    """A leading `>>xx<<` of a multilingual model's input, kept as one token (as MarianTokenizer does)."""
    end = chunk.find("<<") if chunk.startswith(">>") else -1
    return ([chunk[: end + 2]], chunk[end + 2 :]) if end != -1 else ([], chunk)


def _token(settings: Mapping[str, Any], role: str) -> str:
    value = settings.get(role) or ROLE_DEFAULTS[role]
    return value["content"] if isinstance(value, dict) else str(value)


def _special_tokens(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """unk, eos, pad and any additional special tokens the settings name."""
    extra = settings.get("additional_special_tokens") or settings.get("extra_special_tokens") or []
    extra = [t["content"] if isinstance(t, dict) else str(t) for t in extra] if isinstance(extra, list) else []
    return tuple(dict.fromkeys([*(_token(settings, role) for role in ROLE_DEFAULTS), *extra]))


def _json_object(path: Path) -> dict[str, Any]:
    data = read_tokenizer_file(lambda: json.loads(path.read_text(encoding="utf-8")), path)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}; restore the file")
    return data

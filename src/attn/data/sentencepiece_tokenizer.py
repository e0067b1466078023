"""A SentencePiece model file (`*.model`, `*.spm`) as the backend of `attn.data.tokenizers.Tokenizer`.

Ids, pieces and text are SentencePiece's own (`sentencepiece.SentencePieceProcessor`):

- `encode` is the processor's `encode`; the text of a control symbol (`<s>`, `</s>`, ...) inside a text is
  ordinary text to SentencePiece, so unlike the other kinds it does not encode to the symbol's id. The frame
  (`add_special_tokens`) is the processor's `add_bos` / `add_eos`, for whichever of bos and eos the model has.
- the special tokens are the model's control symbols and its unknown piece; `decode` with `skip_special_tokens`
  leaves them out and otherwise equals the processor's `decode`; without it their pieces stand in the text where
  their ids are. Ids beyond the model are left out, as Hugging Face's decoders do.
- the roles (pad, bos, ...) are found by name, as for every kind, so SentencePiece's default pieces `<unk>`,
  `<s>`, `</s>` and `<pad>` (and control symbols `<cls>`, `<sep>`, `<mask>`) have them.

It implements the part of `tokenizers.Tokenizer` that `attn.data.tokenizers.Tokenizer` uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers as hf

from attn.data.files import read_sentencepiece
from attn.data.marian_tokenizer import WORD_MARK, Encoding

SUFFIXES = (".model", ".spm")


class SentencePieceModel:
    """One SentencePiece model. Build one with `from_file`."""

    def __init__(self, processor: Any) -> None:
        """Wrap a loaded `sentencepiece.SentencePieceProcessor`."""
        self._processor = processor
        self._size = processor.get_piece_size()
        self._specials = {i for i in range(self._size) if processor.is_control(i) or processor.is_unknown(i)}
        bos, eos = processor.bos_id(), processor.eos_id()
        self._frame = {"add_bos": bos >= 0, "add_eos": eos >= 0}

    @classmethod
    def from_file(cls, path: str | Path) -> SentencePieceModel:
        """Reads a model file that `sentencepiece.SentencePieceTrainer` wrote.

        Raises:
            CheckpointError: the file is missing or is not a SentencePiece model.
        """
        return cls(read_sentencepiece(Path(path)))

    def save_file(self, path: Path) -> None:
        """Writes the model file, byte for byte what `from_file` read."""
        path.write_bytes(self._processor.serialized_model_proto())

    # -- the part of `tokenizers.Tokenizer` that `attn.data.tokenizers.Tokenizer` uses ---------------

    def no_padding(self) -> None:
        """Never pads (nothing to switch off)."""

    def no_truncation(self) -> None:
        """Never truncates (nothing to switch off)."""

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """The number of pieces, control symbols included."""
        return self._size

    def get_added_tokens_decoder(self) -> dict[int, hf.AddedToken]:
        """The control symbols and the unknown piece by id (their names give the Tokenizer its roles)."""
        return {i: hf.AddedToken(self._processor.id_to_piece(i), special=True) for i in sorted(self._specials)}

    def token_to_id(self, token: str) -> int | None:
        token_id = self._processor.piece_to_id(token)
        return token_id if self._processor.id_to_piece(token_id) == token else None

    def id_to_token(self, token_id: int) -> str | None:
        return self._processor.id_to_piece(token_id) if 0 <= token_id < self._size else None

    def encode_batch_fast(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        """Ids of each text; `add_special_tokens` adds the model's bos and eos."""
        frame = self._frame if add_special_tokens else {}
        return [Encoding(ids) for ids in self._processor.encode(list(texts), out_type=int, **frame)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids` (see the module docstring)."""
        known = [i for i in ids if 0 <= i < self._size]
        if skip_special_tokens:
            return self._processor.decode([i for i in known if i not in self._specials])
        text, run = "", []
        for token_id in [*known, None]:  # None ends the last run
            if token_id is not None and token_id not in self._specials:
                run.append(token_id)
                continue
            if run:  # SentencePiece drops the space of the first word of what it decodes; later runs keep it
                space = " " if text and self._processor.id_to_piece(run[0]).startswith(WORD_MARK) else ""
                text += space + self._processor.decode(run)
                run = []
            if token_id is not None:
                text += self._processor.id_to_piece(token_id)
        return text

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

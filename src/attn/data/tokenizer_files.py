"""A tokenizer on disk: the files `Tokenizer.save` writes and every layout `Tokenizer.load` reads.

A tokenizer's kind (`attn.data.tokenizer_kinds`) says which files hold it, and is written beside them in
`attn_tokenizer.json` with the roles its source file declared (`attn.data.tokenizer_roles`):

| kind | files |
| --- | --- |
| `marian-spm` | `source.spm`, `target.spm`, `vocab.json`, `tokenizer_config.json` (as `MarianTokenizer` reads them) |
| `sentencepiece` | `sentencepiece.model` |
| every other | `tokenizer.json`, the Hugging Face pipeline whole |

Besides such a directory, `read_tokenizer` reads a Hugging Face `tokenizer.json` (or a directory holding one), a
SentencePiece model file (`*.model`, `*.spm`) or a Marian directory.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path

import tokenizers as hf

from attn.core.errors import CheckpointError, ConfigError
from attn.data.files import read_tokenizer_file
from attn.data.marian_tokenizer import MarianSentencePiece, is_marian_directory
from attn.data.sentencepiece_tokenizer import SUFFIXES as SENTENCEPIECE_SUFFIXES
from attn.data.sentencepiece_tokenizer import SentencePieceModel
from attn.data.tokenizer_kinds import KINDS, MARIAN_KIND, SENTENCEPIECE_KIND
from attn.data.tokenizer_pipelines import file_pipeline
from attn.data.tokenizer_roles import checked_roles

TOKENIZER_FILE = "tokenizer.json"
META_FILE = "attn_tokenizer.json"
SENTENCEPIECE_FILE = "sentencepiece.model"

Backend = hf.Tokenizer | MarianSentencePiece | SentencePieceModel


def write_tokenizer(folder: Path, backend: Backend, kind: str, roles: Mapping[str, int | None]) -> None:
    """Writes the files of a tokenizer of `kind` into an existing `folder`, and its `attn_tokenizer.json`.

    Args:
        roles: the role ids its source file declared; written only when there are some.
    """
    if kind == MARIAN_KIND:
        backend.save_files(folder)
    elif kind == SENTENCEPIECE_KIND:
        backend.save_file(folder / SENTENCEPIECE_FILE)
    else:
        backend.save(str(folder / TOKENIZER_FILE))
    meta = {"kind": kind, **({"roles": dict(roles)} if roles else {})}
    (folder / META_FILE).write_text(json.dumps(meta) + "\n", encoding="utf-8")


def tokenizer_digest(backend: Backend, kind: str, roles: Mapping[str, int | None]) -> str:
    """SHA-256 of the names and bytes of the files `write_tokenizer` writes (64 hex digits)."""
    sha = hashlib.sha256()
    with tempfile.TemporaryDirectory() as folder:
        write_tokenizer(Path(folder), backend, kind, roles)
        for path in sorted(Path(folder).iterdir()):
            sha.update(path.name.encode("utf-8") + b"\0" + path.read_bytes())
    return sha.hexdigest()


def read_tokenizer(path: Path) -> tuple[Backend, str, dict[str, int | None] | None]:
    """The pipeline, kind and declared roles of the tokenizer at `path` (see the module for what it reads).

    Returns:
        (backend, kind, roles): roles are those `attn_tokenizer.json` declares, checked against the vocabulary, or None.

    Raises:
        CheckpointError: nothing loadable there, or a file is missing or corrupt.
    """
    if path.is_file():
        if path.suffix in SENTENCEPIECE_SUFFIXES:
            return SentencePieceModel.from_file(path), SENTENCEPIECE_KIND, None
        return file_pipeline(path), "file", None
    if (path / META_FILE).is_file():
        return _read_saved(path)
    if (path / TOKENIZER_FILE).is_file():
        return file_pipeline(path / TOKENIZER_FILE), "file", None
    if is_marian_directory(path):
        return MarianSentencePiece.from_directory(path), MARIAN_KIND, None
    reason = "no tokenizer there" if path.is_dir() else "no such file or directory"
    raise CheckpointError(
        f"{path}: {reason}; give a directory written by `attn tokenizer train` or Tokenizer.save "
        f"({META_FILE}), a Hugging Face {TOKENIZER_FILE} (or its directory) or a SentencePiece .model file"
    )


def _read_saved(directory: Path) -> tuple[Backend, str, dict[str, int | None] | None]:
    """What `write_tokenizer` wrote; the kind is checked before any other file is read."""
    meta_path = directory / META_FILE
    meta = read_tokenizer_file(lambda: json.loads(meta_path.read_text(encoding="utf-8")), meta_path)
    kind = meta.get("kind") if isinstance(meta, dict) else None
    if kind not in KINDS:
        raise CheckpointError(
            f"{meta_path}: kind is {kind!r}, expected one of {', '.join(KINDS)}; "
            "save the tokenizer again with Tokenizer.save"
        )
    if kind == MARIAN_KIND:
        return MarianSentencePiece.from_directory(directory), kind, None
    if kind == SENTENCEPIECE_KIND:
        return SentencePieceModel.from_file(directory / SENTENCEPIECE_FILE), kind, None
    backend = file_pipeline(directory / TOKENIZER_FILE)
    roles = meta.get("roles")
    if not roles:
        return backend, kind, None
    try:
        return backend, kind, checked_roles(roles, backend.get_vocab_size(with_added_tokens=True))
    except ConfigError as err:  # roles that are not a mapping of role names to ids of this vocabulary
        raise CheckpointError(f"{meta_path}: {err}; save the tokenizer again with Tokenizer.save") from err

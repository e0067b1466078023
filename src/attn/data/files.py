"""Reading the files data and tokenizers come from, with errors that name the file and the fix, and
writing a file or a directory atomically (token caches, checkpoints, trained tokenizers)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from attn.core.errors import CheckpointError, ConfigError
from attn.core.faults import fault_point
from attn.shipped import locate

T = TypeVar("T")

GLOB_CHARACTERS = "*?["


def read_tokenizer_file(loader: Callable[[], T], *paths: str | Path) -> T:
    """Runs `loader` (which reads `paths`), turning a missing or unreadable file into a CheckpointError."""
    for path in paths:
        if not Path(path).is_file():
            raise CheckpointError(
                f"{path}: no such file; check the path (in a checkpoint, Tokenizer.save writes it)"
            )
    where = ", ".join(str(p) for p in paths)
    return library_call(loader, lambda err: CheckpointError(f"{where}: cannot be read as a tokenizer file ({err}); "
                                                            "write it again"))


def library_call(call: Callable[[], T], failed: Callable[[BaseException], Exception]) -> T:
    """`call()`, a compiled library's Exception or Rust panic raised as `failed(err)`.

    `tokenizers` raises plain Exception for every failure, and pyo3's PanicException derives from BaseException,
    so `except Exception` alone would let a panic through."""
    try:
        return call()
    except BaseException as err:
        if not isinstance(err, Exception) and type(err).__name__ != "PanicException":
            raise  # Ctrl-C, exit
        raise failed(err) from err


def read_sentencepiece(path: Path) -> Any:  # a sentencepiece.SentencePieceProcessor
    """Loads a SentencePiece model file (Marian's `source.spm`, a trained `*.model`).

    Raises:
        CheckpointError: the file is missing, is not a SentencePiece model, or the package is absent.
    """
    try:
        import sentencepiece
    except ImportError as err:
        raise CheckpointError(f"{path}: reading SentencePiece models needs the sentencepiece package: "
                              "pip install sentencepiece") from err
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; check the path of the SentencePiece model")
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except Exception as err:  # sentencepiece raises OSError or RuntimeError, depending on the defect
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: not a SentencePiece model ({reason}); restore the model's own file") from err
    _check_pieces(processor, path)
    return processor


def _check_pieces(processor: Any, path: Path) -> None:
    """Refuses a model with a piece that is not UTF-8: SentencePiece loads it, but then `id_to_piece` (which
    finds the special tokens) fails with a UnicodeDecodeError."""
    for piece_id in range(processor.get_piece_size()):
        try:
            processor.id_to_piece(piece_id)
        except UnicodeDecodeError as err:
            raise CheckpointError(f"{path}: piece {piece_id} is not UTF-8 text (byte {err.start} of the piece: "
                                  f"{err.reason}); the model file is damaged: restore the model's own file") from None


def input_files(patterns: Sequence[str], key: str = "inputs") -> list[Path]:
    """The files that paths, directories and glob patterns name, in the order given; one named twice comes once.

    A directory stands for every file below it that is not hidden (name starting with "."), a glob (`*`, `?`,
    `[...]`, `**` for any depth) for the files it matches, each group sorted by name. A `data/...` path names the
    shipped corpus file when the working directory lacks it. `key` names the setting in messages ("data.train").

    Raises:
        ConfigError: no pattern given, a path that does not exist, or a directory or glob that holds no file.
    """
    if not patterns:
        raise ConfigError(key, "no input files given; name text files, directories or glob patterns")
    found: dict[Path, None] = {}
    for pattern in patterns:
        for path in _files_of(pattern, key):
            found.setdefault(path)
    return list(found)


def _files_of(pattern: str, key: str) -> list[Path]:
    if any(c in pattern for c in GLOB_CHARACTERS):
        paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not paths:
            raise ConfigError(key, f"the pattern {pattern!r} matches no file; check it (quote it so that "
                                        "the shell does not expand it)")
        return paths
    path = locate(pattern)
    if path.is_dir():
        paths = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
        if not paths:
            raise ConfigError(key, f"the directory {pattern!r} holds no file; give one with text files")
        return paths
    if not path.exists():
        raise ConfigError(key, f"{pattern}: no such file or directory; check the path")
    return [path]


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


# -- writing a directory atomically -------------------------------------------------------------


def write_directory(path: Path, write: Callable[[Path], None], fault: str) -> Path:
    """Writes the directory `path` so that it appears whole or not at all; returns `path`.

    `write` fills a temporary sibling directory, whose files are flushed to disk before it is renamed to `path`; a
    directory already at `path` is replaced only then. Whatever happens before the rename leaves `path` as it was
    and no temporary directory (a killed process leaves a `.tmp-*` sibling, never a half-written `path`). The parent
    of `path` is created; `fault` is the crash-test point reached once every file is written (`attn.core.faults`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        write(staging)
        fault_point(fault)
        for file in staging.iterdir():
            fsync(file)
        fsync(staging)
        _move_into_place(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def write_file(path: Path, write: Callable[[IO[bytes]], T], fault: str = "") -> T:
    """Writes the file `path` so that it appears whole or not at all; returns what `write` returned.

    `write` fills a temporary file in the same, existing folder (`.NAME.*.tmp`), which is flushed to disk and then
    renamed to `path`, and the folder is flushed too. Whatever happens before the rename leaves `path` as it was and
    no temporary file (a killed process leaves the temporary file). `fault` is the crash-test point reached once the
    file is flushed, before the rename (`attn.core.faults`).
    """
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            result = write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        fault_point(fault)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    fsync(path.parent)
    return result


def fsync(path: Path) -> None:
    """Flushes a file or directory to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _move_into_place(staging: Path, path: Path) -> None:
    # A directory can only be renamed onto an empty one, so an existing one is first moved aside; it is deleted
    # only once the new one is in place.
    old = None
    if path.exists():
        old = path.parent / f".old-{path.name}-{uuid.uuid4().hex[:8]}"
        os.replace(path, old)
    try:
        os.replace(staging, path)
    except OSError:
        if old is not None:
            os.replace(old, path)
        raise
    fsync(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

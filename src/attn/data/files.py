"""Reading the files data and tokenizers come from, with errors that name the file and the fix;
flushing what was written to disk."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from attn.errors import CheckpointError

T = TypeVar("T")


def read_tokenizer_file(loader: Callable[[], T], *paths: str | Path) -> T:
    """Runs `loader` (which reads `paths`), turning a missing or unreadable file into a CheckpointError."""
    for path in paths:
        if not Path(path).is_file():
            raise CheckpointError(
                f"{path}: no such file; check the path (in a checkpoint, Tokenizer.save writes it)"
            )
    try:
        return loader()
    except Exception as err:  # the Rust side raises plain Exception for every failure
        where = ", ".join(str(p) for p in paths)
        raise CheckpointError(f"{where}: cannot be read as a tokenizer file ({err}); write it again") from err


def fsync(path: Path) -> None:
    """Flushes a file, or a directory's entries (a rename into it), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

"""A corpus tokenized once into a memory-mapped file of token ids, reused while nothing changes.

A cache is two files named by a stem, e.g. `RUN_DIR/data/train`:

- `train.tokens`: the ids of the corpus text (`attn.data.text_files`), raw little-endian integers of the smallest
  unsigned NumPy type that holds every id of the tokenizer (`id_dtype`), read back with `np.memmap`;
- `train.json`, the manifest: `format`, `files` (resolved path, size and modification time of each file),
  `tokenizer` (`Tokenizer.digest`), `vocab_size`, `dtype` and `tokens` (the number of ids).

`token_ids` reuses a cache whose manifest names the same files, sizes, modification times and tokenizer digest,
and rebuilds it otherwise. Sizes and times rather than a hash of the contents: one `stat` per file however large
the corpus, where a hash would read all of it at every start of a run. An edit that keeps a file's size and its
modification time to the nanosecond (a deliberate `touch -d`) goes unseen; delete the cache then.

Crash safety: the ids are written to a temporary file in the same folder, flushed to disk and renamed over
`.tokens`; the manifest is deleted before that rename and written the same way after it. So a manifest always
describes the ids next to it, and a build cut short leaves none, which means "rebuild"; the next build deletes
its temporary files. Processes that want the same cache at once (the ranks of a run) take turns under a lock on
the folder, so one builds it and the others find it built.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from attn.data.files import fsync, write_file
from attn.data.text_files import text_chunks
from attn.data.tokenizers import Tokenizer
from attn.core.errors import ConfigError, DataFormatError

FORMAT = 1
ID_TYPES = ("uint8", "uint16", "uint32")
ENCODE_PIECES = 4  # text pieces tokenized per call, in parallel
TOKENS_SUFFIX, MANIFEST_SUFFIX = ".tokens", ".json"
FAULT = "token-cache-write"


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned NumPy integer type (little-endian) that holds ids 0 .. vocab_size - 1."""
    for name in ID_TYPES:
        if vocab_size - 1 <= np.iinfo(name).max:
            return np.dtype(name).newbyteorder("<")
    raise ConfigError("vocab_size", f"is {vocab_size}, more ids than uint32 holds; use a smaller vocabulary")


def token_ids(files: Sequence[Path], tokenizer: Tokenizer, stem: Path, progress: str = "") -> np.memmap:
    """The ids of the corpus `files` as `tokenizer` encodes its whole text, from the cache at `stem`.

    The cache is built first when it is missing or stale. No special tokens are added.

    Args:
        files: the corpus files, in order (`attn.data.text_files.corpus_files`).
        stem: the cache's path without suffix, e.g. RUN_DIR/data/train; its folder is created.
        progress: a description for a progress bar over the bytes read while building; "" shows none.

    Returns:
        The ids, shape (N,), a read-only memory map of dtype `id_dtype(tokenizer.vocab_size)`.

    Raises:
        DataFormatError: a corpus file cannot be read or holds no text; or the cache's manifest contradicts its
            ids or the tokenizer.
    """
    stem.parent.mkdir(parents=True, exist_ok=True)
    wanted = {"format": FORMAT, "files": describe_files(files), "tokenizer": tokenizer.digest()}
    with _locked(stem.parent):
        found = _read_manifest(stem)
        if found is None or {key: found.get(key) for key in wanted} != wanted:
            _build(files, tokenizer, stem, wanted, progress)
        return open_token_cache(stem, tokenizer)


def open_token_cache(stem: Path, tokenizer: Tokenizer) -> np.memmap:
    """The ids of an existing cache, shape (N,), a read-only memory map, checked against the tokenizer.

    Raises:
        DataFormatError: no manifest, or one whose tokenizer, vocabulary size or id type is not this tokenizer's,
            or whose count of ids does not match the size of the ids file.
    """
    manifest = _read_manifest(stem)
    where = str(_path(stem, MANIFEST_SUFFIX))
    fix = f"delete {stem}.* to have it built again"
    if manifest is None:
        raise DataFormatError(where, f"no token cache here (missing or unreadable manifest); {fix}")
    expected = {"tokenizer": tokenizer.digest(), "vocab_size": tokenizer.vocab_size,
                "dtype": id_dtype(tokenizer.vocab_size).name}
    for key, value in expected.items():
        if manifest.get(key) != value:
            message = f"the cache has {key} {manifest.get(key)!r}, but the tokenizer reading it needs {value!r}; {fix}"
            raise DataFormatError(where, message)
    dtype = id_dtype(tokenizer.vocab_size)
    ids_path = _path(stem, TOKENS_SUFFIX)
    count = manifest.get("tokens")
    size = ids_path.stat().st_size if ids_path.is_file() else None
    if not isinstance(count, int) or count < 1 or size != count * dtype.itemsize:
        message = f"the manifest counts {count!r} ids, but {ids_path.name} holds {size} bytes of {dtype.name}; {fix}"
        raise DataFormatError(where, message)
    return np.memmap(ids_path, dtype=dtype, mode="r", shape=(count,))


def describe_files(files: Sequence[Path]) -> list[dict[str, Any]]:
    """What the manifest records of each corpus file: resolved path, size, modification time (ns)."""
    stats = [(path.resolve(), path.stat()) for path in files]
    return [{"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns} for path, stat in stats]


def _path(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix)


def _read_manifest(stem: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads(_path(stem, MANIFEST_SUFFIX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Holds an exclusive lock on `folder` (the lock goes with the descriptor, even on a crash)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _build(files: Sequence[Path], tokenizer: Tokenizer, stem: Path, manifest: dict[str, Any], progress: str) -> None:
    for stale in stem.parent.glob(f".{stem.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    _path(stem, MANIFEST_SUFFIX).unlink(missing_ok=True)
    fsync(stem.parent)
    dtype = id_dtype(tokenizer.vocab_size)
    count = write_file(
        _path(stem, TOKENS_SUFFIX), lambda out: _write_ids(out, files, tokenizer, dtype, progress), FAULT
    )
    described = {**manifest, "vocab_size": tokenizer.vocab_size, "dtype": dtype.name, "tokens": count}
    text = json.dumps(described, indent=1) + "\n"
    write_file(_path(stem, MANIFEST_SUFFIX), lambda out: out.write(text.encode("utf-8")), FAULT)


def _write_ids(out: IO[bytes], files: Sequence[Path], tokenizer: Tokenizer, dtype: np.dtype, progress: str) -> int:
    """Tokenizes the corpus piece by piece into `out`; returns the number of ids written."""
    pieces = text_chunks(files, cut_anywhere=tokenizer.kind == "chars", progress=progress)
    count = 0
    while batch := list(itertools.islice(pieces, ENCODE_PIECES)):
        for ids in tokenizer.encode_batch(batch):
            array = np.array(ids, dtype=dtype)  # NumPy refuses an id the type cannot hold
            out.write(array.tobytes())
            count += len(array)
    return count

"""The header of a GGUF file: opened without reading past its end, and its metadata read by type.

Every defect is a `CheckpointError` naming the file and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType, ReaderTensor

from attn.core.errors import CheckpointError


class _CutShort(Exception):
    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _BoundedReader(GGUFReader):
    """`gguf.GGUFReader` whose every read must lie inside the file.

    `GGUFReader` reads past the end as an empty array and goes on, so a lying array length would have it loop
    (and allocate) for as long as that length says.
    """

    def _get(self, offset: int, dtype: Any, count: int = 1, *args: Any, **kwargs: Any) -> np.ndarray:
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > self.data.size:
            raise _CutShort(end)
        return super()._get(offset, dtype, count, *args, **kwargs)


def open_gguf(path: Path) -> GGUFReader:
    """The parsed header of the file (the tensors stay on disk, memory-mapped)."""
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
        size = path.stat().st_size
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err}); give the path of a .gguf file") from err
    if magic != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF'); give a model file "
                              "in llama.cpp's GGUF format")
    try:
        reader = _BoundedReader(path)
    except _CutShort as err:
        raise CheckpointError(f"{path}: the file is cut short: its header and tensors reach byte {err.end:,}, "
                              f"but it has {size:,} bytes; download it again") from None
    # What GGUFReader raises for a malformed header: a bad version, type code or alignment, a key or
    # tensor named twice, a name that is not UTF-8, tensor dimensions that do not fit its block
    # format, arrays nested too deep.
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, RecursionError) as err:
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err}); it is corrupt, or "
                              "newer than the installed gguf package reads: download it again or upgrade gguf") from err
    if reader.byte_order != "I":
        raise CheckpointError(f"{path}: a GGUF file of the other byte order than this machine's; convert the "
                              "model again on a little-endian machine")
    return reader


_REQUIRED = object()
_INTEGERS = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
             GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}
_KINDS = {
    "int": _INTEGERS,
    "float": {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, *_INTEGERS},
    "str": {GGUFValueType.STRING},
    "bool": {GGUFValueType.BOOL},
}


class Metadata:
    """Typed reads of a GGUF file's key-value metadata."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.reader = reader
        self.path = path

    def get(self, key: str, kind: str, default: Any = _REQUIRED) -> Any:
        """The value of `key`: kind "int", "float", "str" or "bool", or a list of one ("int[]", "str[]").

        Raises CheckpointError when the key is missing (and has no default) or holds another type.
        """
        field = self.reader.get_field(key)
        if field is None:
            if default is _REQUIRED:
                raise CheckpointError(f"{self.path}: metadata key {key!r} is missing; the file is incomplete: "
                                      "convert or download it again")
            return default
        item = kind.removesuffix("[]")
        types = field.types
        if item != kind:  # an array: [ARRAY, item type], or [ARRAY] alone when empty
            fits = types[:1] == [GGUFValueType.ARRAY] and (len(types) == 1 or (len(types) == 2 and types[1] in _KINDS[item]))
        else:
            fits = len(types) == 1 and types[0] in _KINDS[item]
        if not fits:
            raise CheckpointError(f"{self.path}: metadata key {key!r} holds {'/'.join(t.name for t in types)}, "
                                  f"expected {kind}; the file is corrupt: convert or download it again")
        try:
            value = field.contents()
        except UnicodeDecodeError as err:
            raise CheckpointError(f"{self.path}: metadata key {key!r} is not UTF-8 text ({err}); "
                                  "convert or download the file again") from err
        if item == "float" and types[-1] == GGUFValueType.FLOAT32:
            value = float(str(np.float32(value)))  # the shortest decimal of that float32
        return value

    def count(self, key: str, default: Any = _REQUIRED, below: int | None = None) -> Any:
        """A positive integer (`default` where absent), or, given `below`, an id from 0 to below - 1."""
        value = self.get(key, "int", default)
        if self.reader.get_field(key) is None:
            return value
        low, high = (1, None) if below is None else (0, below)
        if value < low or (high is not None and value >= high):
            allowed = f"from 0 to {high - 1}" if high is not None else "at least 1"
            raise CheckpointError(f"{self.path}: metadata key {key!r} is {value}, expected {allowed}; "
                                  "the file is corrupt: convert or download it again")
        return value


def check_dequantizable(path: Path, tensor: ReaderTensor) -> None:
    """Checks that `gguf.quants.dequantize` handles the tensor's block format, tried on one block of zeros."""
    _, block_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    try:
        gguf.quants.dequantize(np.zeros((1, block_bytes), np.uint8), tensor.tensor_type)
    except NotImplementedError:
        raise CheckpointError(f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the "
                              "gguf package cannot dequantize; use a file quantized to a common type "
                              "(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, ...)") from None

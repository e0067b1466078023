"""The header of a GGUF file, parsed without reading past its end, and its metadata read by type.

The parser reads the header front to back through a window of the file: each array of numbers in one read, strings
as bytes (decoded when asked for). Every count and length is checked against the bytes left in the file before
anything is read or allocated, so a lying length costs nothing. Tensor data stays on disk. Every defect is a
`CheckpointError` naming the file and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from attn.core.errors import CheckpointError

VERSIONS = (2, 3)  # the GGUF versions read, little-endian only
MAX_DEPTH = 8  # arrays of arrays of ... nested deeper than this are refused
DEFAULT_ALIGNMENT = 32  # of the data section, where `general.alignment` is absent
_WINDOW = 1 << 20  # bytes read from the file at a time

_FORMATS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
            GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
            GGUFValueType.FLOAT32: "f", GGUFValueType.FLOAT64: "d", GGUFValueType.BOOL: "?"}
_SCALARS = {kind: struct.Struct("<" + code) for kind, code in _FORMATS.items()}
_DTYPES = {kind: np.dtype("<" + code) for kind, code in _FORMATS.items()}
_LEAST_BYTES = {**{kind: s.size for kind, s in _SCALARS.items()}, GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}
_LEAST_FIELD = 8 + 4 + 1  # a metadata entry: the key's length, the value's type, one byte of value
_LEAST_TENSOR = 8 + 4 + 4 + 8  # a tensor entry: the name's length, the dimension count, the block type, the offset
_VALUE_TYPES = {int(kind): kind for kind in GGUFValueType}
_BLOCK_TYPES = {int(kind): kind for kind in gguf.GGML_QUANT_SIZES}
_U32, _U64 = _SCALARS[GGUFValueType.UINT32], _SCALARS[GGUFValueType.UINT64]
_CORRUPT = "the file is corrupt: convert or download it again"
_UNKNOWN = ("which the installed gguf package does not know; the file is corrupt, or newer than that package: "
            "download it again or upgrade gguf")


@dataclasses.dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor's entry in the header; its data stays in the file.

    Attributes:
        shape: the dimensions, innermost first, as GGUF lists them ([in, out] for a linear map).
        n_bytes: the size of its data, whole blocks of `tensor_type`.
        data_offset: where its data starts in the file.
    """

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int


@dataclasses.dataclass(frozen=True, eq=False)
class GgufField:
    """One metadata value as stored: strings as bytes, arrays of numbers as numpy arrays, arrays of anything
    else as lists.

    Attributes:
        types: the value's type, then for an array its first item's types: [UINT32], [STRING], [ARRAY, STRING],
            [ARRAY, ARRAY, INT32]; [ARRAY] alone for an empty array.
    """

    types: list[GGUFValueType]
    stored: Any

    def contents(self) -> Any:
        """The value: str, int, float, bool, or a list of them (of lists for arrays of arrays).

        Raises:
            UnicodeDecodeError: a string of it is not UTF-8.
        """
        return _python(self.stored)


def _python(stored: Any) -> Any:
    if isinstance(stored, bytes):
        return stored.decode("utf-8")
    if isinstance(stored, np.ndarray):
        return stored.tolist()
    if isinstance(stored, list):
        return [_python(item) for item in stored]
    return stored


@dataclasses.dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's metadata, key -> field in file order, and its tensors' entries in file order."""

    fields: dict[str, GgufField]
    tensors: list[GgufTensorInfo]

    def get_field(self, key: str) -> GgufField | None:
        return self.fields.get(key)


def open_gguf(path: Path) -> GgufHeader:
    """The parsed header of the file, checked: every tensor's data lies inside the file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            return _Parser(handle, path, size).header()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err}); give the path of a .gguf file") from err


def tensor_bytes(path: Path, tensor: GgufTensorInfo, start: int = 0, count: int | None = None) -> np.ndarray:
    """`count` bytes of the tensor's data from its byte `start` (all of it by default), uint8, read from the file:
    not through a memory map, whose pages would stay resident."""
    count = tensor.n_bytes - start if count is None else count
    return np.fromfile(path, np.uint8, count=count, offset=tensor.data_offset + start)


class _Parser:
    """Reads one header front to back. `window` holds the file's bytes from offset `start`; `pos` is the next
    byte to read in it."""

    def __init__(self, handle: BinaryIO, path: Path, size: int) -> None:
        self.handle, self.path, self.size = handle, path, size
        self.window, self.start, self.pos = b"", 0, 0

    def header(self) -> GgufHeader:
        magic = self.handle.read(4)
        if magic != b"GGUF":
            raise CheckpointError(f"{self.path}: not a GGUF file (it starts with {magic!r}, not b'GGUF'); give a "
                                  "model file in llama.cpp's GGUF format")
        self.start = 4
        self._version(self.scalar(_U32))
        tensor_count, field_count = self.scalar(_U64), self.scalar(_U64)
        self.fits(field_count * _LEAST_FIELD + tensor_count * _LEAST_TENSOR)
        fields: dict[str, GgufField] = {}
        for _ in range(field_count):
            key = self.text("metadata key")
            if key in fields:
                raise CheckpointError(f"{self.path}: metadata key {key!r} appears twice; {_CORRUPT}")
            fields[key] = GgufField(*self.value(key, self.scalar(_U32), 0))
        entries = [self.tensor_entry() for _ in range(tensor_count)]
        alignment = self._alignment(fields.get("general.alignment"))
        data_start = -(-(self.start + self.pos) // alignment) * alignment
        tensors: dict[str, GgufTensorInfo] = {}
        for name, shape, kind, offset in entries:
            if name in tensors:
                raise CheckpointError(f"{self.path}: tensor {name} appears twice; {_CORRUPT}")
            tensors[name] = self._tensor(name, shape, kind, data_start + offset)
        end = max((t.data_offset + t.n_bytes for t in tensors.values()), default=0)
        if end > self.size:
            raise self.cut_short(end)
        return GgufHeader(fields, list(tensors.values()))

    # -- reads ------------------------------------------------------------------------------------

    def need(self, count: int) -> None:
        """Makes the next `count` bytes readable in the window, or raises the cut-short error."""
        if self.pos + count <= len(self.window):
            return
        self.fits(count)
        end = self.start + self.pos + count
        rest = self.window[self.pos:]
        self.start, self.pos = self.start + self.pos, 0
        self.window = rest + self.handle.read(max(count - len(rest), _WINDOW))
        if len(self.window) < count:  # the file shrank while it was read
            raise self.cut_short(end)

    def fits(self, count: int) -> None:
        """Raises the cut-short error where the next `count` bytes reach past the end of the file."""
        if self.start + self.pos + count > self.size:
            raise self.cut_short(self.start + self.pos + count)

    def scalar(self, kind: struct.Struct) -> Any:
        self.need(kind.size)
        (value,) = kind.unpack_from(self.window, self.pos)
        self.pos += kind.size
        return value

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        self.need(count * dtype.itemsize)
        values = np.frombuffer(self.window, dtype, count, self.pos).copy()
        self.pos += count * dtype.itemsize
        return values

    def string(self) -> bytes:
        length = self.scalar(_U64)
        self.need(length)
        self.pos += length
        return self.window[self.pos - length:self.pos]

    def text(self, what: str) -> str:
        at = self.start + self.pos
        try:
            return self.string().decode("utf-8")
        except UnicodeDecodeError as err:
            raise CheckpointError(f"{self.path}: the {what} at byte {at:,} is not UTF-8 text ({err}); "
                                  f"{_CORRUPT}") from None

    def value(self, key: str, code: int, depth: int) -> tuple[list[GGUFValueType], Any]:
        """The types and stored value of a metadata value of type `code` (of key `key`, `depth` arrays deep)."""
        kind = self._value_type(key, code)
        if kind == GGUFValueType.STRING:
            return [kind], self.string()
        if kind != GGUFValueType.ARRAY:
            return [kind], self.scalar(_SCALARS[kind])
        if depth == MAX_DEPTH:
            raise CheckpointError(f"{self.path}: metadata key {key!r} holds arrays nested more than {MAX_DEPTH} "
                                  f"deep; {_CORRUPT}")
        item_code, count = self.scalar(_U32), self.scalar(_U64)
        item = self._value_type(key, item_code)
        self.fits(count * _LEAST_BYTES[item])
        types = [kind, item] if count else [kind]  # as gguf's reader types an array: by its first item
        if item in _DTYPES:
            return types, self.array(_DTYPES[item], count)
        if item == GGUFValueType.STRING:
            return types, [self.string() for _ in range(count)]
        items = [self.value(key, item_code, depth + 1) for _ in range(count)]
        return [kind, *(items[0][0] if items else [])], [stored for _, stored in items]

    def tensor_entry(self) -> tuple[str, tuple[int, ...], int, int]:
        """A tensor's name, dimensions, block type code and data offset in the data section."""
        name = self.text("tensor name")
        shape = tuple(self.array(_DTYPES[GGUFValueType.UINT64], self.scalar(_U32)).tolist())
        return name, shape, self.scalar(_U32), self.scalar(_U64)

    # -- checks -----------------------------------------------------------------------------------

    def cut_short(self, end: int) -> CheckpointError:
        return CheckpointError(f"{self.path}: the file is cut short: its header and tensors reach byte {end:,}, "
                               f"but it has {self.size:,} bytes; download it again")

    def _version(self, version: int) -> None:
        if version in VERSIONS:
            return
        if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
            raise CheckpointError(f"{self.path}: a GGUF file of the other byte order (big-endian); convert the "
                                  "model again on a little-endian machine")
        raise CheckpointError(f"{self.path}: GGUF version {version}; attn reads versions "
                              f"{' and '.join(map(str, VERSIONS))}: convert the model again with a current llama.cpp")

    def _value_type(self, key: str, code: int) -> GGUFValueType:
        if code not in _VALUE_TYPES:
            raise CheckpointError(f"{self.path}: metadata key {key!r} has value type {code}, {_UNKNOWN}")
        return _VALUE_TYPES[code]

    def _alignment(self, field: GgufField | None) -> int:
        """`general.alignment`: the data section starts at a multiple of it, a power of two."""
        if field is None:
            return DEFAULT_ALIGNMENT
        if field.types != [GGUFValueType.UINT32]:
            raise CheckpointError(f"{self.path}: general.alignment holds {'/'.join(t.name for t in field.types)}, "
                                  f"expected UINT32; {_CORRUPT}")
        if field.stored == 0 or field.stored & (field.stored - 1):
            raise CheckpointError(f"{self.path}: general.alignment is {field.stored}, not a power of two; {_CORRUPT}")
        return field.stored

    def _tensor(self, name: str, shape: tuple[int, ...], code: int, data_offset: int) -> GgufTensorInfo:
        if code not in _BLOCK_TYPES:
            raise CheckpointError(f"{self.path}: tensor {name} has block type {code}, {_UNKNOWN}")
        kind = _BLOCK_TYPES[code]
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        row = shape[0] if shape else 1
        if row % block:
            raise CheckpointError(f"{self.path}: tensor {name} has rows of {row} values, not whole {kind.name} "
                                  f"blocks of {block}; {_CORRUPT}")
        n_elements = math.prod(shape)
        return GgufTensorInfo(name, kind, shape, n_elements, n_elements // block * block_bytes, data_offset)


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

    def __init__(self, reader: GgufHeader, path: Path) -> None:
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
        if kind == "float" and types[-1] == GGUFValueType.FLOAT32:
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


def check_dequantizable(path: Path, tensor: GgufTensorInfo) -> None:
    """Checks that `gguf.quants.dequantize` handles the tensor's block format, tried on one block of zeros."""
    _, block_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    try:
        gguf.quants.dequantize(np.zeros((1, block_bytes), np.uint8), tensor.tensor_type)
    except NotImplementedError:
        raise CheckpointError(f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the "
                              "gguf package cannot dequantize; use a file quantized to a common type "
                              "(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, ...)") from None

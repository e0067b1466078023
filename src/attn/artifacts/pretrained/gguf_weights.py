"""A GGUF file's weights, read one tensor at a time into the layers that hold them: no float copy of the model.

| block type | held as | exact? |
|---|---|---|
| Q4_0, Q4_1, Q4_K | `Int4Linear`: the file's 4-bit codes, groups of 32 with a scale and a minimum each | codes exact; scale and zero rounded to bfloat16 |
| F32, F16, BF16 | float32 | exact |
| every other type `gguf` dequantizes (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Q2_K, Q3_K, IQ*, TQ*) | `Int8Linear`: int8 rows, one scale per row | re-quantized from the dequantized row |

A fused projection (q, k and v stacked) is int4 when all its parts are 4-bit and fit the kernel, float when all are
floats, else int8 rows. A token embedding stored quantized becomes int8 rows (`Int8Embedding`); a tied output
projection shares them, or, soft-capped (Gemma 2's), takes them in float32. Every
other tensor (norms, biases) is float32. What keeping a file's blocks costs against its dequantized float32 model
is measured by `benchmarks/quantized.py` (its "gguf" rows), and per block type by `benchmarks/probes/gguf-types.py`.

Loading holds one tensor's temporaries at a time: int8 rows are dequantized a slice at a time, and the heap's freed
pages go back to the system after each layer; what a file costs in memory and load time beside llama.cpp is measured
by `benchmarks/gguf_memory.py`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import Tensor, nn

from attn.artifacts.pretrained.gguf_file import GgufTensorInfo, tensor_bytes
from attn.artifacts.pretrained.keymap import KeyTable
from attn.core.errors import CheckpointError
from attn.core.layers import Embeddings, SoftCappedProjection
from attn.core.quantized import DEQUANTIZED_WEIGHTS, GROUP, Int4Linear, Int8Embedding, Int8Linear, quantize_rows

INT4_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q4_K)
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)


@dataclasses.dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file, read from disk when asked (each call reads it again).

    Attributes:
        heads: the heads whose rows llama.cpp reordered for its rotary layout (q and k of "llama"), or None.
        offset: what llama.cpp's converter added to every value (1 to Gemma's norms), taken off again by `floats`.
    """

    path: Path
    tensor: GgufTensorInfo
    heads: int | None = None
    offset: float = 0.0

    @property
    def shape(self) -> tuple[int, ...]:
        """(out, in) for a matrix, (d,) for a vector: GGUF lists dimensions innermost first."""
        return tuple(int(n) for n in reversed(self.tensor.shape))

    @property
    def type(self) -> Q:
        return self.tensor.tensor_type

    def numel(self) -> int:
        return int(self.tensor.n_elements)

    def floats(self, rows: slice = slice(None)) -> Tensor:
        """The dequantized float32 values (of `rows` of a matrix, whole heads where they were reordered), in Hugging
        Face's row order."""
        values = torch.from_numpy(gguf.quants.dequantize(self._bytes(rows), self.type).copy())
        if self.offset:
            values -= self.offset
        if len(self.shape) == 1:
            return values.view(-1)
        heads = None if self.heads is None else self.heads * values.size(0) // self.shape[0]
        return _unpermuted(values, heads)

    def row_slices(self) -> list[slice]:
        """The rows of a matrix in slices of whole heads, each of at most DEQUANTIZED_WEIGHTS weights (or one head)."""
        count, width = self.shape
        unit = count // self.heads if self.heads else 1
        step = max(unit, DEQUANTIZED_WEIGHTS // width // unit * unit)
        return [slice(start, min(start + step, count)) for start in range(0, count, step)]

    def groups(self, rows: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """A 4-bit tensor's codes (out, in) uint8 in 0..15 and scales (out, in / 32, 2) float32 [scale, minimum]
        per group of 32 (of `rows`, whole heads where they were reordered), with W = scale q + minimum exactly as
        `gguf.quants.dequantize` computes it."""
        stored = self._bytes(rows)
        count, size = stored.shape[0], self.shape[1]
        codes, scale, low = _GROUPS[self.type](stored.reshape(-1, gguf.GGML_QUANT_SIZES[self.type][1]))
        scales = torch.from_numpy(np.stack([scale, low], -1).reshape(count, size // GROUP, 2))
        codes = torch.from_numpy(codes.reshape(count, size))
        heads = None if self.heads is None else self.heads * count // self.shape[0]
        return _unpermuted(codes, heads), _unpermuted(scales, heads)

    def _bytes(self, rows: slice) -> np.ndarray:
        """The stored bytes of `rows`, (rows, bytes per row), read from the file (`tensor_bytes`)."""
        count = self.shape[0] if len(self.shape) == 2 else 1
        start, stop, _ = rows.indices(count)
        row_bytes = int(self.tensor.n_bytes) // count
        return tensor_bytes(self.path, self.tensor, start * row_bytes, (stop - start) * row_bytes).reshape(
            stop - start, row_bytes)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale = blocks[:, :2].view(np.float16).astype(np.float32)
    return _nibbles(blocks[:, 2:]), scale, -8 * scale


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    halves = blocks[:, :4].view(np.float16).astype(np.float32)
    return _nibbles(blocks[:, 4:]), halves[:, :1], halves[:, 1:]


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Super-blocks of 256: eight groups of 32 with 6-bit scales and minimums of d and dmin; each 32 bytes of codes
    hold a group in their low nibbles and the next in their high ones."""
    d, dmin = blocks[:, :4].view(np.float16).astype(np.float32).T
    sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (qs & 15).reshape(-1, 256), d[:, None] * sc.astype(np.float32), -(dmin[:, None] * m.astype(np.float32))


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """A Q4_0 or Q4_1 block's 32 codes: the low nibbles of its 16 bytes, then the high ones."""
    return np.concatenate([qs & 15, qs >> 4], -1)


_GROUPS = {Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q4_K: _q4_k}


def _unpermuted(rows: Tensor, heads: int | None) -> Tensor:
    """Rows of q_proj or k_proj (heads * d, ...) back from llama.cpp's order to Hugging Face's: llama.cpp keeps row
    r * d/2 + j of a head (half r, dimension j) as row 2j + r of that head."""
    if heads is None:
        return rows
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def load_quantized(model: nn.Module, table: KeyTable, weights: Mapping[str, GgufTensor], source: str,
                   keep: bool = True) -> None:
    """Fills `model`, built with its parameters on the meta device, from the file's tensors under Hugging Face's
    names: linear layers and the token embedding as the module docstring says, every other tensor in float32; or,
    without `keep`, every tensor as a trainable float32 parameter.

    Raises:
        CheckpointError: a tensor of the model that no rule fills (the key table and the model disagree).
    """
    parts = {r.ours: [weights[name] for name in r.theirs] for r in table.expanded(table.is_prefixed(weights))
             if all(name in weights for name in r.theirs)}
    names = {module: name for name, module in model.named_modules()}
    tied: dict[int, list[str]] = {}  # every name of each parameter as built (tied ones share one)
    for name, tensor in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(tensor), []).append(name)
    embedded: dict[int, Int8Embedding] = {}  # id of a meta weight -> the int8 rows that replaced it
    for owner in list(model.modules()) if keep else []:
        if isinstance(owner, Embeddings) and isinstance(owner.tokens, nn.Embedding):
            found = parts[names[owner.tokens] + ".weight"]
            if found[0].type not in FLOAT_TYPES:
                embedded[id(owner.tokens.weight)] = owner.tokens = Int8Embedding(*_int8_rows(found[0]))
                _release_freed_memory()
    for owner in list(model.modules()) if keep else []:
        for child_name, child in list(owner.named_children()):
            if isinstance(child, nn.Linear) and not isinstance(child, SoftCappedProjection):
                layer = _linear(child, names[child], parts, embedded)
                if layer is not None:
                    setattr(owner, child_name, layer)
                    _release_freed_memory()
    # Parameters still empty take float32, a soft-capped output projection tied to int8 rows among them.
    empty: dict[int, list[str]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        if tensor.is_meta:
            empty.setdefault(id(tensor), []).append(name)
    for key, group in empty.items():
        stored = [name for name in tied[key] if name in parts]
        if not stored:
            raise CheckpointError(f"{source}: nothing in the file fills {group[0]}; the file is incomplete")
        value = nn.Parameter(torch.cat([part.floats() for part in parts[stored[0]]]), requires_grad=not keep)
        for name in group:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, value)
        _release_freed_memory()
    model.requires_grad_(not keep)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def _release_freed_memory() -> None:
    """Hands the pages of freed heap memory back to the system. Each tensor's temporaries (its bytes read, its
    codes and scales decoded) are freed between the weights kept before and after them; glibc keeps such holes
    resident, and a large file's load would peak far above the weights it holds (`benchmarks/gguf_memory.py`)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _linear(layer: nn.Linear, name: str, parts: Mapping[str, list[GgufTensor]],
            embedded: Mapping[int, Int8Embedding]) -> nn.Module | None:
    """The layer that holds `name`'s weight: int4, int8 rows, or None to keep the float layer (filled later)."""
    found = parts.get(name + ".weight")
    if found is None:  # a projection tied to the embedding
        rows = embedded.get(id(layer.weight))
        return None if rows is None else Int8Linear(rows.weight, rows.scale, _bias(name, parts))
    if all(p.type in FLOAT_TYPES for p in found):
        return None
    bias = _bias(name, parts)
    fits = layer.in_features % GROUP == 0 and layer.out_features % 16 == 0
    if fits and all(p.type in INT4_TYPES for p in found):
        return Int4Linear(*_int4_groups(found, layer), bias)
    rows, scales = zip(*(_int8_rows(p) for p in found), strict=True)
    return Int8Linear(torch.cat(rows), torch.cat(scales), bias)


def _bias(name: str, parts: Mapping[str, list[GgufTensor]]) -> Tensor | None:
    return torch.cat([p.floats() for p in parts[name + ".bias"]]) if name + ".bias" in parts else None


def _int4_groups(parts: list[GgufTensor], layer: nn.Linear) -> tuple[Tensor, Tensor]:
    """The 4-bit parts of `layer`, stacked, as `Int4Linear` takes them: codes two to a byte (even columns in the low
    nibble) and the groups' scales and minimums; filled a slice of rows at a time."""
    packed = torch.empty(layer.out_features, layer.in_features // 2, dtype=torch.uint8)
    scales = torch.empty(layer.out_features, layer.in_features // GROUP, 2)
    start = 0
    for part in parts:
        for rows in part.row_slices():
            codes, groups = part.groups(rows)
            done = slice(start + rows.start, start + rows.stop)
            packed[done], scales[done] = codes[:, 0::2] | (codes[:, 1::2] << 4), groups
        start += part.shape[0]
    return packed, scales


def _int8_rows(tensor: GgufTensor) -> tuple[Tensor, Tensor]:
    """A matrix as int8 rows (out, in) and their scales (out,), dequantized a slice of rows at a time."""
    count, width = tensor.shape
    rows, scale = torch.empty(count, width, dtype=torch.int8), torch.empty(count)
    for part in tensor.row_slices():
        rows[part], scales = quantize_rows(tensor.floats(part))
        scale[part] = scales.squeeze(-1)
    return rows, scale

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
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import gguf
import torch
from gguf import GGMLQuantizationType as Q
from torch import Tensor, nn

from attn.artifacts.pretrained.gguf_file import GgufTensorInfo, tensor_bytes
from attn.artifacts.pretrained.keymap import KeyTable
from attn.core.errors import CheckpointError
from attn.core.layers import Embeddings, SoftCappedProjection
from attn.core.quantized import (DEQUANTIZED_WEIGHTS, GROUP, Int4Linear, Int8Embedding, Int8Linear, int4_kernel_block,
                                 quantize_rows)

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
        stored = self._bytes(rows)
        decode = _FLOATS.get(self.type)
        if decode is None:
            values = torch.from_numpy(gguf.quants.dequantize(stored.numpy(), self.type).copy())
        else:
            values = decode(stored.view(-1, gguf.GGML_QUANT_SIZES[self.type][1])).view(stored.size(0), -1)
        if self.offset:
            values -= self.offset
        return values.view(-1) if len(self.shape) == 1 else values

    def row_slices(self, together: int = 1) -> list[slice]:
        """The rows of a matrix in slices of whole heads and of a multiple of `together` rows, each of at most
        DEQUANTIZED_WEIGHTS weights (or one such unit)."""
        count, width = self.shape
        unit = math.lcm(count // self.heads if self.heads else 1, together)
        step = max(unit, DEQUANTIZED_WEIGHTS // width // unit * unit)
        return [slice(start, min(start + step, count)) for start in range(0, count, step)]

    def groups(self, rows: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """A 4-bit tensor's codes (out, in) uint8 in 0..15 and scales (out, in / 32, 2) float32 [scale, minimum]
        per group of 32 (of `rows`, whole heads where they were reordered), with W = scale q + minimum exactly as
        `gguf.quants.dequantize` computes it."""
        stored = self._bytes(rows)
        count, size = stored.size(0), self.shape[1]
        codes, scale, low = _GROUPS[self.type](stored.view(-1, gguf.GGML_QUANT_SIZES[self.type][1]))
        return codes.view(count, size), torch.stack([scale, low], -1).view(count, size // GROUP, 2)

    def _bytes(self, rows: slice) -> Tensor:
        """The stored bytes of `rows`, (rows, bytes per row), read from the file (`tensor_bytes`), whole heads
        where they were reordered put back in Hugging Face's order."""
        count = self.shape[0] if len(self.shape) == 2 else 1
        start, stop, _ = rows.indices(count)
        row_bytes = int(self.tensor.n_bytes) // count
        stored = torch.from_numpy(tensor_bytes(self.path, self.tensor, start * row_bytes, (stop - start) * row_bytes))
        heads = None if self.heads is None else self.heads * (stop - start) // self.shape[0]
        return _unpermuted(stored.view(stop - start, row_bytes), heads)


# Each block type's decoder takes its blocks (n, bytes per block) uint8 and computes what gguf.quants.dequantize
# does, operation for operation in float32, so the values are the same to the bit (tests/unit/test_gguf_blocks.py).

def _halves(stored: Tensor) -> Tensor:
    """float16 numbers stored in bytes, as float32."""
    return stored.view(torch.float16).float()


def _nibbles(stored: Tensor) -> Tensor:
    """(..., n) bytes -> (..., 2, n): their low nibbles, then their high ones."""
    stored = stored.contiguous()  # a strided view of the blocks costs each operation more than this copy
    codes = stored.new_empty(*stored.shape[:-1], 2, stored.size(-1))
    torch.bitwise_and(stored, 15, out=codes.select(-2, 0))
    torch.bitwise_right_shift(stored, 4, out=codes.select(-2, 1))
    return codes


def _q4_0(blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    scale = _halves(blocks[:, :2]).squeeze(-1)
    return _nibbles(blocks[:, 2:]), scale, -8 * scale


def _q4_1(blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    halves = _halves(blocks[:, :4])
    return _nibbles(blocks[:, 4:]), halves[:, 0], halves[:, 1]


def _k_scales(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K's and Q5_K's eight scales and minimums (n, 8) float32: 6-bit numbers times d and dmin, unpacked from
    their 12 bytes four at a time (in 32-bit words)."""
    d, dmin = _halves(blocks[:, :4]).unbind(-1)
    low, high, rest = blocks[:, 4:16].view(torch.int32).unbind(-1)
    six = torch.stack([low & 0x3F3F3F3F, (rest & 0x0F0F0F0F) | ((low >> 2) & 0x30303030),
                       high & 0x3F3F3F3F, ((rest >> 4) & 0x0F0F0F0F) | ((high >> 2) & 0x30303030)], -1)
    scales, mins = six.view(torch.uint8).float().view(-1, 2, 8).unbind(1)
    return d[:, None] * scales, dmin[:, None] * mins


def _q4_k(blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Super-blocks of 256: eight groups of 32 with 6-bit scales and minimums of d and dmin; each 32 bytes of codes
    hold a group in their low nibbles and the next in their high ones."""
    scale, low = _k_scales(blocks)
    return _nibbles(blocks[:, 16:].reshape(-1, 4, 32)), scale, -low


def _q8_0(blocks: Tensor) -> Tensor:
    return blocks[:, 2:].view(torch.int8).float() * _halves(blocks[:, :2])


def _fifth_bits(stored: Tensor) -> Tensor:
    """(n, bytes) -> (n, 8, bytes) uint8: bit b of each byte at place 4 (16) of row b."""
    stored = stored.contiguous()
    return torch.stack([(stored << 4) & 16, (stored << 3) & 16, (stored << 2) & 16, (stored << 1) & 16,
                        stored & 16, (stored >> 1) & 16, (stored >> 2) & 16, (stored >> 3) & 16], 1)


def _q5(blocks: Tensor, start: int) -> Tensor:
    """Q5_0's and Q5_1's 5-bit codes (n, 32) float32: low nibbles as Q4's, the fifth bits from 4 bytes at `start`."""
    high = _fifth_bits(blocks[:, start : start + 4]).transpose(1, 2).reshape(-1, 32)
    return (_nibbles(blocks[:, start + 4 :]).flatten(1) | high).float()


def _q5_0(blocks: Tensor) -> Tensor:
    return _halves(blocks[:, :2]) * (_q5(blocks, 2) - 16)


def _q5_1(blocks: Tensor) -> Tensor:
    halves = _halves(blocks[:, :4])
    return halves[:, :1] * _q5(blocks, 4) + halves[:, 1:]


def _q5_k(blocks: Tensor) -> Tensor:
    scale, low = _k_scales(blocks)
    codes = _nibbles(blocks[:, 48:].reshape(-1, 4, 32)).view(-1, 8, 32) | _fifth_bits(blocks[:, 16:48])
    return (scale[..., None] * codes.float() - low[..., None]).flatten(1)


def _q6_k(blocks: Tensor) -> Tensor:
    """Super-blocks of 256 in two halves of 128, each in four quarters of 32: low nibbles from 64 bytes (quarters 0
    and 1 low, 2 and 3 high), top two bits from 32 bytes (bits 2s and 2s + 1 for quarter s), an int8 scale per
    16, times d."""
    count = blocks.size(0)
    codes = _nibbles(blocks[:, :128].reshape(count, 2, 64)).view(count, 2, 4, 32)
    high = blocks[:, 128:192].contiguous().view(count, 2, 1, 32)
    for quarter, bits in enumerate((high << 4, high << 2, high, high >> 2)):
        codes[:, :, quarter : quarter + 1] |= bits & 0x30
    scale = _halves(blocks[:, 208:]) * blocks[:, 192:208].view(torch.int8).float()
    return codes.view(count, 16, 16).float().sub_(32).mul_(scale.view(count, 16, 1)).flatten(1)


def _grouped(decode: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]) -> Callable[[Tensor], Tensor]:
    """A 4-bit type's values from its codes, scales and minimums: scale q + minimum."""
    def floats(blocks: Tensor) -> Tensor:
        codes, scale, low = decode(blocks)
        return codes.view(-1, GROUP).float().mul_(scale.view(-1, 1)).add_(low.view(-1, 1)).view(blocks.size(0), -1)
    return floats


_GROUPS = {Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q4_K: _q4_k}
_FLOATS = {Q.Q8_0: _q8_0, Q.Q5_0: _q5_0, Q.Q5_1: _q5_1, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k,
           **{kind: _grouped(decode) for kind, decode in _GROUPS.items()}}


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
        return Int4Linear.from_groups(_int4_groups(found), layer.out_features, layer.in_features, bias)
    rows, scales = zip(*(_int8_rows(p) for p in found), strict=True)
    return Int8Linear(torch.cat(rows), torch.cat(scales), bias)


def _bias(name: str, parts: Mapping[str, list[GgufTensor]]) -> Tensor | None:
    return torch.cat([p.floats() for p in parts[name + ".bias"]]) if name + ".bias" in parts else None


def _int4_groups(parts: list[GgufTensor]) -> Iterator[tuple[Tensor, Tensor]]:
    """The codes and scales of 4-bit parts stacked, a slice of rows at a time, as `Int4Linear.from_groups` takes them:
    slices of whole blocks of the kernel's layout, packed as they come where the parts' sizes allow."""
    for part in parts:
        for rows in part.row_slices(together=int4_kernel_block() or 1):
            yield part.groups(rows)


def _int8_rows(tensor: GgufTensor) -> tuple[Tensor, Tensor]:
    """A matrix as int8 rows (out, in) and their scales (out,), dequantized a slice of rows at a time."""
    count, width = tensor.shape
    rows, scale = torch.empty(count, width, dtype=torch.int8), torch.empty(count)
    for part in tensor.row_slices():
        scale[part] = quantize_rows(tensor.floats(part), out=rows[part])[1].squeeze(-1)
    return rows, scale

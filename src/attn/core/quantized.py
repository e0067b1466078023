"""int8 and int4 weights for CPU inference: a quarter or an eighth of float32's bytes per weight read.

`quantize(model)` replaces, in place, each linear layer by an `Int8Linear` and each token embedding by an
`Int8Embedding`. Both keep a matrix W as int8 rows with one float32 scale per row (per output channel, symmetric):
s_i = max_j |W_ij| / 127, Q_ij = round(W_ij / s_i), so W_ij ~ s_i Q_ij with an error of at most s_i / 2. A tied
embedding and output projection share one int8 matrix, as they shared one float matrix. `Int8Linear` multiplies its
float32 input by the int8 rows with PyTorch's weight-only int8 kernel (`torch.ops.aten._weight_int8pack_mm`):
y = (x Q^T) s + b. That kernel reads the weights once for every `KERNEL_ROWS` input rows, so more rows (a batch,
beams, a prompt) are multiplied by the dequantized float32 weight instead, a slice of rows at a time.

`quantize(model, "int8-dynamic")` quantizes each linear layer's input too, per row at run time (as CTranslate2's
int8 and PyTorch's dynamic quantization do): x_t ~ r_t P_t with P_t int8, y = (P Q^T) r s + b, the product summed in
int32 by `torch._int_mm` (oneDNN with VNNI; without VNNI, where its sums are not exact, in float32: correct, not
faster). It is faster than float32 at the row counts of decoding (`benchmarks/results/engines-cpu/`), but its error
grows with the spread of a row's magnitudes, so models whose activations have outlier channels lose more
(`benchmarks/results/quantized-quality/`; `benchmarks/quantized.py` measures each scheme against float32).

`quantize(model, "int4")` gives the linear layers 4-bit weights instead (`Int4Linear`): each group of `GROUP` weights
along a row has a scale and a minimum (asymmetric, as llama.cpp's Q4_1: W ~ s q + m with q in 0..15,
s = (max - min) / 15, m = min), multiplied by `torch.ops.aten._weight_int4pack_mm_for_cpu` in bfloat16 (the codes
exact, scales, zeros, inputs and sums rounded to bfloat16); re-quantizing a GGUF file's dequantized Q4_1 blocks
recovers their codes. A GGUF file's 4-bit blocks become these groups without a float copy
(`attn.artifacts.pretrained.gguf_weights`). The token embedding (and an output projection tied to it) stays int8,
as does a layer whose input size is not a multiple of 32 or output size not a multiple of 16 (the kernel's limits).

A quantized model is for inference: it has no gradients. Gemma 2's soft-capped output projection stays in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from enum import StrEnum

import torch
from torch import Tensor, nn

from attn.core.errors import ConfigError
from attn.core.layers import Embeddings, SoftCappedProjection
from attn.core.linear import linear


class Quantization(StrEnum):
    INT8 = "int8"
    INT8_DYNAMIC = "int8-dynamic"
    INT4 = "int4"


GROUP = 32  # int4 weights per scale and minimum
KERNEL_ROWS = 4  # the int8 and int4 kernels read the weights once per this many input rows
PACK_ROWS = 1024  # rows of an int4 layer packed for its kernel at a time (a multiple of the kernel's blocks of rows)
DEQUANTIZED_WEIGHTS = 2**20  # weights of an int8 layer dequantized at a time for more than KERNEL_ROWS rows


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(..., n) float -> int8 (..., n) and float32 scales (..., 1): x ~ q * scale, per row, symmetric; a row of
    zeros gets scale 1, so nothing divides by zero."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).div_(127)
    scale.masked_fill_(scale == 0, 1.0)
    return (x / scale).round_().to(torch.int8), scale


class QuantizedLinear(nn.Module):
    """What the int8 and int4 layers share: up to KERNEL_ROWS input rows go through the layer's `kernel`, more
    through its `dequantized` float32 weight; (..., in) -> (..., out)."""

    in_features: int
    out_features: int
    bias: Tensor | None

    def kernel(self, rows: Tensor) -> Tensor:
        raise NotImplementedError

    def dequantized(self, rows: slice = slice(None)) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        if rows.size(0) > KERNEL_ROWS:  # a slice of the weight at a time: no float32 copy of a whole large matrix
            step = max(1, DEQUANTIZED_WEIGHTS // self.in_features)
            y = torch.cat([linear(rows, self.dequantized(slice(start, start + step)), None)
                           for start in range(0, self.out_features, step)], dim=1)
        else:
            y = self.kernel(rows)
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


class Int8Linear(QuantizedLinear):
    """y = x W^T + b with W in int8 rows and per-row scales: (..., in) -> (..., out)."""

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        """weight (out, in) int8, scale (out,) float32, bias (out,) or None."""
        super().__init__()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    def dequantized(self, rows: slice = slice(None)) -> Tensor:
        """The float32 weight the int8 rows stand for, (out, in), or its `rows`."""
        return self.weight[rows].float().mul_(self.scale[rows].unsqueeze(1))

    def kernel(self, rows: Tensor) -> Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)


@functools.cache
def int8_products_are_exact() -> bool:
    """Whether `torch._int_mm` sums int8 products exactly on this CPU: without VNNI (AVX2 and older, or oneDNN capped
    there) oneDNN adds pairs of products in saturating int16, so large inputs come out wrong."""
    ones = torch.full((1, 64), 127, dtype=torch.int8)
    return int(torch._int_mm(ones, torch.full((64, 8), 127, dtype=torch.int8))[0, 0]) == 127 * 127 * 64


class DynamicInt8Linear(Int8Linear):
    """y = x W^T + b with W in int8 rows and x quantized per row at run time (see the module's docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        q, scale = quantize_rows(x.reshape(-1, self.in_features))
        if int8_products_are_exact():
            products = torch._int_mm(q, self.weight.t()).float()
        else:
            products = linear(q.float(), self.weight.float(), None)
        y = products.mul_(scale).mul_(self.scale)  # in place: a decode step's layers are small, allocations count
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


def quantize_groups(w: Tensor) -> tuple[Tensor, Tensor]:
    """(out, in) float, in a multiple of GROUP -> 4-bit codes two to a byte (out, in / 2) uint8 (even columns in
    the low nibble) and (out, in / GROUP, 2) float32 [scale, minimum] per group: W ~ scale q + minimum. A group
    whose weights are all equal gets scale 1."""
    out, size = w.shape
    groups = w.float().view(out, size // GROUP, GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (high - low) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.uint8).view(out, size)
    return q[:, 0::2] | (q[:, 1::2] << 4), torch.cat([scale, low], -1)


class Int4Linear(nn.Module):
    """y = x W^T + b with W in 4-bit groups (see the module's docstring): (..., in) -> (..., out).

    The layer holds the kernel's own layout of the codes as `weight` (it differs between AVX2 and AVX-512) and each
    group's scale and zero in bfloat16, the one input type the kernel vectorises: half a byte per weight and an
    eighth of a byte per weight for the scales. Its input rows are multiplied in bfloat16 (summed in float32), whatever
    their number. Its state dict holds the portable form that `quantize_groups` writes, so a file serves every CPU.
    """

    def __init__(self, weight: Tensor, scales: Tensor, bias: Tensor | None) -> None:
        """weight (out, in / 2) uint8 codes, scales (out, in / GROUP, 2) float32 [scale, minimum], bias (out,)
        or None."""
        super().__init__()
        self.in_features, self.out_features = 2 * weight.size(1), weight.size(0)
        self.register_buffer("bias", bias)
        self._pack(weight, scales)
        self.register_load_state_dict_pre_hook(Int4Linear._load_codes)
        self.register_state_dict_post_hook(Int4Linear._save_codes)

    def _pack(self, weight: Tensor, scales: Tensor) -> None:
        # The kernel's layout keeps each block of 64 (AVX-512) or 32 rows together, so slices of PACK_ROWS rows pack
        # alone: the int32 codes the packing takes never exist for the whole matrix at once.
        packed = torch.empty_like(weight)
        for start in range(0, self.out_features, PACK_ROWS):
            part = weight[start : start + PACK_ROWS]
            codes = torch.stack([part & 15, part >> 4], -1).view(part.size(0), self.in_features)
            packed[start : start + PACK_ROWS] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 2)
        self.register_buffer("weight", packed, persistent=False)  # the state dict holds the portable codes
        scale, low = scales.float().unbind(-1)  # the kernel's form: W = (q - 8) scale + zero
        zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).to(torch.bfloat16).contiguous()
        self.register_buffer("scale_and_zero", zeros, persistent=False)  # (in / GROUP, out, 2)

    def codes(self) -> Tensor:
        """The 4-bit codes, (out, in) uint8 in 0..15, read back through the kernel: rows of the identity times the
        codes with scale 1 and zero 0 give q - 8, exact in bfloat16."""
        unit = torch.zeros_like(self.scale_and_zero)
        unit[..., 0] = 1
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        columns = [torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight, GROUP, unit)
                   for rows in eye.split(1024)]  # (in, out) in slices, so no (in, in) product is held twice
        return (torch.cat(columns).t() + 8).to(torch.uint8)

    def scales(self) -> Tensor:
        """(out, in / GROUP, 2) float32 [scale, minimum] per group, as the layer holds them."""
        scale, zero = self.scale_and_zero.float().transpose(0, 1).unbind(-1)
        return torch.stack([scale, zero - 8 * scale], -1)

    def dequantized(self) -> Tensor:
        """The float32 weight the 4-bit groups stand for, (out, in)."""
        scales = self.scales()
        codes = self.codes().view(self.out_features, -1, GROUP).float()
        return (codes * scales[..., :1] + scales[..., 1:]).view(self.out_features, self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight, GROUP, self.scale_and_zero).to(x.dtype)
        y = y if self.bias is None else y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    @staticmethod
    def _save_codes(module: Int4Linear, state: dict[str, Tensor], prefix: str, metadata: object) -> None:
        codes = module.codes()
        state[prefix + "weight"] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        state[prefix + "scales"] = module.scales()

    @staticmethod
    def _load_codes(module: Int4Linear, state: dict[str, Tensor], prefix: str, metadata: object, strict: bool,
                    missing: list[str], unexpected: list[str], errors: list[str]) -> None:
        names = [prefix + "weight", prefix + "scales"]
        if all(name in state for name in names):
            module._pack(*(state.pop(name) for name in names))
        else:
            missing.extend(name for name in names if name not in state)


class Int8Embedding(nn.Module):
    """Token embedding with int8 rows and per-row scales: (...) long -> (..., d) float32."""

    def __init__(self, weight: Tensor, scale: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.weight[tokens].float() * self.scale[tokens].unsqueeze(-1)


def quantize(model: nn.Module, scheme: str = "int8", stored: Collection[str] | None = None) -> nn.Module:
    """Quantizes `model` in place (linear layers and token embeddings, see the module's docstring); returns it.

    Args:
        stored: the state-dict keys of a file the model is about to load: each layer takes the form they hold (int4
            where `<layer>.scales` is stored, int8 rows where `<layer>.scale` is, else float), as a GGUF file's
            mixed blocks were kept.

    Raises:
        ConfigError: an unknown scheme, or a model on another device than the CPU.
    """
    if scheme not in {q.value for q in Quantization}:
        raise ConfigError("quantize", f"unknown quantization {scheme!r}; choose one of "
                                      f"{[q.value for q in Quantization]}")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ConfigError("device", f"{scheme} weights run on the CPU only: load the model with device='cpu' "
                                    "(--device cpu) to quantize it")
    embedded = {id(m.tokens.weight): m.tokens for m in model.modules()
                if isinstance(m, Embeddings) and isinstance(m.tokens, nn.Embedding)}
    rows: dict[int, tuple[Tensor, Tensor]] = {}  # id of a float matrix in `embedded` or `kept` -> int8 rows, scales
    kept: list[Tensor] = []  # the matrices quantized to int8 rows, alive while the model is rebuilt (ids stay theirs)

    names = {module: name for name, module in model.named_modules()}

    def chosen(module: nn.Module, form: str) -> bool:
        owner = embedded.get(id(module.weight), module)  # a tied projection is stored with its embedding
        return stored is None or f"{names[owner]}.{form}" in stored

    def rows_of(weight: Tensor) -> tuple[Tensor, Tensor]:
        if id(weight) not in rows:
            q, scale = quantize_rows(weight.detach())
            rows[id(weight)] = q, scale.squeeze(-1)
            kept.append(weight)
        return rows[id(weight)]

    def replacement(linear: nn.Linear) -> nn.Module:
        bias = linear.bias.detach().float() if linear.bias is not None else None
        tied = id(linear.weight) in embedded  # an output projection tied to an embedding shares its int8 rows
        fits = linear.in_features % GROUP == 0 and linear.out_features % 16 == 0  # what the int4 kernel takes
        int4 = scheme == Quantization.INT4 and not tied and fits if stored is None else chosen(linear, "scales")
        if int4:
            return Int4Linear(*quantize_groups(linear.weight.detach()), bias)
        layer = DynamicInt8Linear if scheme == Quantization.INT8_DYNAMIC else Int8Linear
        return layer(*rows_of(linear.weight), bias)

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and not isinstance(child, SoftCappedProjection):
                if chosen(child, "scale") or chosen(child, "scales"):
                    setattr(parent, name, replacement(child))
    for parent in list(model.modules()):
        if isinstance(parent, Embeddings) and isinstance(parent.tokens, nn.Embedding) and chosen(parent.tokens, "scale"):
            parent.tokens = Int8Embedding(*rows_of(parent.tokens.weight))
    model.requires_grad_(False)
    return model


def quantization_of(model: nn.Module) -> str | None:
    """The scheme `quantize` applied to `model`, or None for a float model."""
    kinds = {type(m) for m in model.modules()}
    for layer, scheme in ((Int4Linear, "int4"), (DynamicInt8Linear, "int8-dynamic"), (Int8Linear, "int8")):
        if layer in kinds:
            return scheme
    return None

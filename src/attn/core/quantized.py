"""int8 and int4 weights for CPU inference: a quarter or an eighth of float32's bytes per weight read.

`quantize(model)` replaces, in place, each linear layer by an `Int8Linear` and each token embedding by an
`Int8Embedding`. Both keep a matrix W as int8 rows with one float32 scale per row (per output channel, symmetric):
s_i = max_j |W_ij| / 127, Q_ij = round(W_ij / s_i), so W_ij ~ s_i Q_ij with an error of at most s_i / 2. A tied
embedding and output projection share one int8 matrix, as they shared one float matrix. `Int8Linear` multiplies its
input by the int8 rows with PyTorch's weight-only int8 kernel (`torch.ops.aten._weight_int8pack_mm`) in bfloat16,
the one input type it vectorises (inputs, scales and outputs rounded to bfloat16, sums in float32):
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
exact, scales, zeros, inputs and sums rounded to bfloat16) up to `INT4_KERNEL_ROWS` rows (a step of a batch), and
more rows (a prompt) by slices of the float32 weight read back from the kernel's layout, as the int8 layers do: the
kernel's time grows with the rows while reading the weight back takes a fixed time, so past a few dozen rows the
read-back and a float32 product are faster (`benchmarks/results/gguf-speed/`); re-quantizing a GGUF file's
dequantized Q4_1 blocks recovers their codes. A GGUF file's 4-bit blocks become these groups without a float copy
(`attn.artifacts.pretrained.gguf_weights`). The token embedding (and an output projection tied to it) stays int8,
as does a layer whose input size is not a multiple of 32 or output size not a multiple of 16 (the kernel's limits).

A quantized layer's weights get no gradient; an input that requires one gets it through the dequantized weight
(`InputGradient`), as LoRA's adapters over a frozen quantized base need (`attn.core.lora`). Gemma 2's soft-capped
output projection stays in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable
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
INT4_KERNEL_ROWS = 64  # the most input rows an int4 layer multiplies through its kernel (see the module docstring)
PACK_ROWS = 1024  # rows of an int4 layer packed for its kernel at a time (a multiple of the kernel's blocks of rows)
DEQUANTIZED_WEIGHTS = 2**20  # weights of a layer dequantized at a time for more rows than its kernel takes


def quantize_rows(x: Tensor, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(..., n) float -> int8 (..., n) and float32 scales (..., 1): x ~ q * scale, per row, symmetric; a row of
    zeros gets scale 1, so nothing divides by zero. Given `out`, the codes go there and float32 `x` is overwritten
    on the way (no temporary the size of x)."""
    x = x.float()
    scale = torch.maximum(x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True).neg_()).div_(127)
    scale.masked_fill_(scale == 0, 1.0)
    if out is None:
        return (x / scale).round_().to(torch.int8), scale
    return out.copy_(x.div_(scale).round_()), scale


class QuantizedLinear(nn.Module):
    """What the int8 and int4 layers share: up to `kernel_rows` input rows go through the layer's `kernel`, more
    through its `dequantized` float32 weight, `slice_rows` rows of it at a time; (..., in) -> (..., out)."""

    kernel_rows = KERNEL_ROWS
    in_features: int
    out_features: int
    bias: Tensor | None

    def kernel(self, rows: Tensor) -> Tensor:
        raise NotImplementedError

    def dequantized(self, rows: slice = slice(None)) -> Tensor:
        raise NotImplementedError

    def slice_rows(self) -> int | None:
        """Rows of the weight dequantized at a time for more than `kernel_rows` input rows; None: the kernel takes
        any number of input rows."""
        return max(1, DEQUANTIZED_WEIGHTS // self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            return InputGradient.apply(x, self)
        return self.product(x)

    def product(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        step = self.slice_rows() if rows.size(0) > self.kernel_rows else None
        if step is not None:  # a slice of the weight at a time: no float32 copy of a whole large matrix
            y = torch.cat([linear(rows, self.dequantized(slice(start, start + step)), None)
                           for start in range(0, self.out_features, step)], dim=1)
        else:
            y = self.kernel(rows)
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


class InputGradient(torch.autograd.Function):
    """y = layer(x) by the layer's own product; dL/dx = dL/dy W with W dequantized a slice of rows at a time."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, layer: QuantizedLinear) -> Tensor:
        ctx.layer, ctx.dtype = layer, x.dtype
        return layer.product(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        layer: QuantizedLinear = ctx.layer
        rows = grad.reshape(-1, layer.out_features).float()
        step = layer.slice_rows() or layer.out_features
        dx = rows.new_zeros(rows.size(0), layer.in_features)
        for start in range(0, layer.out_features, step):
            dx.addmm_(rows[:, start : start + step], layer.dequantized(slice(start, start + step)))
        return dx.view(*grad.shape[:-1], layer.in_features).to(ctx.dtype), None


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
        # bfloat16 in: the kernel's only vectorised input type (float32 takes a scalar loop)
        return torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), self.weight,
                                                  self.scale.to(torch.bfloat16)).float()


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


@functools.cache
def int4_kernel_block() -> int | None:
    """The rows the int4 kernel's layout keeps together (64 with AVX-512, 32 with AVX2) where `_kernel_layout` writes
    it as the kernel's own packing does (checked on random codes); None where it does not: the kernel packs them."""
    codes = torch.randint(0, 16, (128, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 2)
    return next((block for block in (64, 32) if torch.equal(_kernel_layout(codes, block), packed)), None)


def _kernel_layout(codes: Tensor, block: int) -> Tensor:
    """(rows, in) uint8 codes, rows a multiple of `block` -> the int4 kernel's layout, (rows, in / 2) uint8: for each
    block of rows and each column, block / 2 bytes, byte j holding row j's code in its low nibble and row
    j + block / 2's in its high one. Worked in 64-bit words: the rows paired into bytes, then each square of 8 x 8
    bytes transposed by three swaps between words (of bytes, of pairs, of quads), then the words put in order."""
    rows, size = codes.shape
    words = codes.contiguous().view(torch.int64).view(rows // block, 2, block // 2, size // 8)
    paired = (words[:, 1] << 4).bitwise_or_(words[:, 0])  # (blocks, block / 2, in / 8): rows j and j + block / 2
    blocks, eights = paired.size(0), block // 16
    square = paired.view(blocks, eights, 8, size // 8).transpose(1, 2)  # (blocks, 8, eights, in / 8)
    for step, shift, mask in ((1, 8, 0x00FF00FF00FF00FF), (2, 16, 0x0000FFFF0000FFFF), (4, 32, 0xFFFFFFFF)):
        pairs = square.view(blocks, 4 // step, 2, step, eights, size // 8)
        low, high = pairs[:, :, 0], pairs[:, :, 1]
        swapped = (low >> shift).bitwise_xor_(high).bitwise_and_(mask)
        high ^= swapped
        low ^= swapped.bitwise_left_shift_(shift)
    # word (r, e, c) now holds, at column 8c + r, the bytes of the eight rows 8e..8e+7: one column's bytes in a row
    return square.permute(0, 3, 1, 2).contiguous().view(torch.uint8).view(rows, size // 2)


def _layout_codes(weight: Tensor, block: int) -> Tensor:
    """The inverse of the kernel's packing: (rows, in / 2) uint8 in its layout -> (rows, in) uint8 codes. Whole
    blocks of rows as `_kernel_layout` writes them; rows after the last whole block (as the kernel packs them) in
    pairs, for each column a byte holding rows 2j (low nibble) and 2j + 1 (high)."""
    rows, size = weight.size(0), 2 * weight.size(1)
    whole = rows // block * block
    parts = [(weight[:whole].reshape(whole // block, size, block // 2), True),
             (weight[whole:].reshape(1, size, (rows - whole) // 2), False)]
    codes = [torch.cat([part & 15, part >> 4], -1) if halves else torch.stack([part & 15, part >> 4], -1).flatten(2)
             for part, halves in parts if part.numel()]
    return torch.cat([c.transpose(1, 2).reshape(-1, size) for c in codes])


@functools.cache
def int4_readable_block() -> int | None:
    """`int4_kernel_block()` where `_layout_codes` reads the kernel's packing back (whole blocks and the rows after
    them, checked on random codes); None where it does not: the codes are then read through the kernel."""
    block = int4_kernel_block()
    if block is None:
        return None
    codes = torch.randint(0, 16, (2 * block + 16, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 2)
    return block if torch.equal(_layout_codes(packed, block), codes) else None


def _packed(groups: Iterable[tuple[Tensor, Tensor]], out_features: int, in_features: int) -> tuple[Tensor, Tensor]:
    """The int4 kernel's weight (out, in / 2) uint8 and scale_and_zero (in / GROUP, out, 2) bfloat16 of codes
    (rows, in) uint8 and scales (rows, in / GROUP, 2) [scale, minimum] given a slice of rows at a time: rows wait
    for a whole block of the kernel's layout, and the last ones, fewer than a block, the kernel packs itself."""
    block = int4_kernel_block()
    weight = torch.empty(out_features, in_features // 2, dtype=torch.uint8)
    zeros = torch.empty(in_features // GROUP, out_features, 2, dtype=torch.bfloat16)
    packed, waiting = 0, torch.empty(0, in_features, dtype=torch.uint8)
    for codes, scales in groups:
        rows = slice(packed + waiting.size(0), packed + waiting.size(0) + codes.size(0))
        scale, low = scales.float().unbind(-1)  # the kernel's form: W = (q - 8) scale + zero
        zeros[:, rows, 0], zeros[:, rows, 1] = scale.t(), (low + 8 * scale).t()
        codes = torch.cat([waiting, codes]) if waiting.numel() else codes
        whole = codes.size(0) // (block or PACK_ROWS) * (block or PACK_ROWS)
        if whole:
            weight[packed : packed + whole] = (
                _kernel_layout(codes[:whole], block) if block
                else torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes[:whole].int(), 2))
        packed, waiting = packed + whole, codes[whole:]
    if waiting.numel():
        weight[packed:] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(waiting.int(), 2)
    return weight, zeros


class Int4Linear(QuantizedLinear):
    """y = x W^T + b with W in 4-bit groups (see the module's docstring): (..., in) -> (..., out).

    The layer holds the kernel's own layout of the codes as `weight` (it differs between AVX2 and AVX-512) and each
    group's scale and zero in bfloat16, the one input type the kernel vectorises: half a byte per weight and an
    eighth of a byte per weight for the scales. Its state dict holds the portable form that `quantize_groups` writes,
    so a file serves every CPU.
    """

    def __init__(self, weight: Tensor, scales: Tensor, bias: Tensor | None) -> None:
        """weight (out, in / 2) uint8 codes, scales (out, in / GROUP, 2) float32 [scale, minimum], bias (out,)
        or None."""
        super().__init__()
        self._start(weight.size(0), 2 * weight.size(1), bias)
        self._pack(weight, scales)

    @classmethod
    def from_groups(cls, groups: Iterable[tuple[Tensor, Tensor]], out_features: int, in_features: int,
                    bias: Tensor | None) -> Int4Linear:
        """The layer of codes (rows, in) uint8 in 0..15 and scales (rows, in / GROUP, 2) float32 [scale, minimum]
        given a slice of rows at a time, in order: no copy of the whole weight is made but the kernel's."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._start(out_features, in_features, bias)
        layer._hold(*_packed(groups, out_features, in_features))
        return layer

    def _start(self, out_features: int, in_features: int, bias: Tensor | None) -> None:
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", bias)
        self.register_load_state_dict_pre_hook(Int4Linear._load_codes)
        self.register_state_dict_post_hook(Int4Linear._save_codes)

    def _pack(self, weight: Tensor, scales: Tensor) -> None:
        slices = [slice(start, start + PACK_ROWS) for start in range(0, self.out_features, PACK_ROWS)]
        codes = (torch.stack([weight[rows] & 15, weight[rows] >> 4], -1).flatten(1) for rows in slices)
        self._hold(*_packed(zip(codes, (scales[rows] for rows in slices)), self.out_features, self.in_features))

    def _hold(self, weight: Tensor, scale_and_zero: Tensor) -> None:
        self.register_buffer("weight", weight, persistent=False)  # the state dict holds the portable codes
        self.register_buffer("scale_and_zero", scale_and_zero, persistent=False)  # (in / GROUP, out, 2)

    def codes(self, rows: slice = slice(None)) -> Tensor:
        """The 4-bit codes, (out, in) uint8 in 0..15, or those of `rows` (a slice starting at a multiple of 64):
        read from the kernel's layout where `int4_readable_block` knows it, else through the kernel (rows of the
        identity times the codes with scale 1 and zero 0 give q - 8, exact in bfloat16)."""
        block = int4_readable_block()
        if block is not None:
            return _layout_codes(self.weight[rows], block)
        unit = torch.zeros_like(self.scale_and_zero)
        unit[..., 0] = 1
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        columns = [torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight, GROUP, unit)
                   for rows in eye.split(1024)]  # (in, out) in slices, so no (in, in) product is held twice
        return (torch.cat(columns).t() + 8).to(torch.uint8)[rows]

    def scales(self) -> Tensor:
        """(out, in / GROUP, 2) float32 [scale, minimum] per group, as the layer holds them."""
        scale, zero = self.scale_and_zero.float().transpose(0, 1).unbind(-1)
        return torch.stack([scale, zero - 8 * scale], -1)

    def dequantized(self, rows: slice = slice(None)) -> Tensor:
        """The float32 weight the 4-bit groups stand for, (out, in), or its `rows` (as `codes` takes them):
        (q - 8) scale + zero with the layer's bfloat16 scales and zeros."""
        codes = self.codes(rows)
        scale, zero = self.scale_and_zero[:, rows].float().unbind(-1)  # (in / GROUP, rows)
        grouped = codes.view(codes.size(0), -1, GROUP).float().sub_(8)
        return grouped.mul_(scale.t()[..., None]).add_(zero.t()[..., None]).view(codes.size(0), self.in_features)

    kernel_rows = INT4_KERNEL_ROWS

    def slice_rows(self) -> int | None:
        """Whole blocks of 64 rows at a time where the codes can be read back, else None: the kernel."""
        return None if int4_readable_block() is None else max(64, DEQUANTIZED_WEIGHTS // self.in_features // 64 * 64)

    def kernel(self, rows: Tensor) -> Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), self.weight, GROUP,
                                                          self.scale_and_zero).float()

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

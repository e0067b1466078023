"""int8 weights for CPU inference: every linear layer and the token embedding, a quarter of float32's bytes.

`quantize(model)` replaces, in place, each linear layer by an `Int8Linear` and each token embedding by an
`Int8Embedding`. Both keep a matrix W as int8 rows with one float32 scale per row (per output channel,
symmetric): s_i = max_j |W_ij| / 127, Q_ij = round(W_ij / s_i), so W_ij ~ s_i Q_ij with an error of at
most s_i / 2. A tied embedding and output projection share one int8 matrix, as they shared one float
matrix. `Int8Linear` keeps its input in float32 and multiplies it by the int8 rows with PyTorch's
weight-only int8 kernel (`torch.ops.aten._weight_int8pack_mm`, vectorised for AVX2 and AVX-512):
y = (x Q^T) s + b. Quantizing the input too, per token (as CTranslate2 does), broke SmolLM2-135M's
answers (its activations have outlier channels: "What is the capital of France?" was answered
"L'Étoile, la Marseilla, la France, la France, ..."); weight-only int8 answers it as float32 does.

A quantized model is for inference: it has no gradients. Gemma 2's soft-capped output projection stays
in float32.
"""

from __future__ import annotations

from enum import StrEnum

import torch
from torch import Tensor, nn

from attn.errors import ConfigError
from attn.layers import Embeddings, SoftCappedProjection


class Quantization(StrEnum):
    INT8 = "int8"


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(..., n) float -> int8 (..., n) and float32 scales (..., 1): x ~ q * scale, per row, symmetric.

    A row of zeros gets scale 1 (and zeros), so nothing divides by zero.
    """
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).to(torch.int8), scale


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 rows and per-row scales: (..., in) -> (..., out)."""

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        """weight (out, in) int8, scale (out,) float32, bias (out,) or None."""
        super().__init__()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


class Int8Embedding(nn.Module):
    """Token embedding with int8 rows and per-row scales: (...) long -> (..., d) float32."""

    def __init__(self, weight: Tensor, scale: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.weight[tokens].float() * self.scale[tokens].unsqueeze(-1)


def quantize(model: nn.Module, scheme: str = "int8") -> nn.Module:
    """Quantizes `model` in place (linear layers and token embeddings, see the module's docstring); returns it.

    Raises:
        ConfigError: an unknown scheme, or a model on another device than the CPU.
    """
    if scheme not in {q.value for q in Quantization}:
        raise ConfigError("quantize", f"unknown quantization {scheme!r}; choose one of "
                                      f"{[q.value for q in Quantization]}")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ConfigError("device", "int8 weights run on the CPU only: load the model with device='cpu' "
                                    "(--device cpu) to quantize it")
    rows: dict[int, tuple[Tensor, Tensor]] = {}  # id of a float matrix -> its int8 rows and scales, made once

    def rows_of(weight: Tensor) -> tuple[Tensor, Tensor]:
        if id(weight) not in rows:
            q, scale = quantize_rows(weight.detach())
            rows[id(weight)] = q, scale.squeeze(-1)
        return rows[id(weight)]

    for parent in list(model.modules()):
        if isinstance(parent, Embeddings) and isinstance(parent.tokens, nn.Embedding):
            parent.tokens = Int8Embedding(*rows_of(parent.tokens.weight))
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and not isinstance(child, SoftCappedProjection):
                bias = child.bias.detach().float() if child.bias is not None else None
                setattr(parent, name, Int8Linear(*rows_of(child.weight), bias))
    model.requires_grad_(False)
    return model


def quantization_of(model: nn.Module) -> str | None:
    """The scheme `quantize` applied to `model`, or None for a float model."""
    return Quantization.INT8.value if any(isinstance(m, Int8Linear) for m in model.modules()) else None

"""The model's one linear layer: `nn.Linear`, whose float32 inference on a CPU runs through oneDNN.

Without autograd, PyTorch's CPU `F.linear` in float32 calls MKL's sgemm; oneDNN (which PyTorch
ships and already uses for bfloat16) multiplies the same matrices 1.2-2.1x faster for the row counts
of a decode step and a prefill on an AMD EPYC with AVX-512 (`benchmarks/results/linear-cpu/`), which
made a greedy SmolLM2 decode step about 15 % shorter at batch 1 and 8 (case 9 of `benchmarks/`). So
`Linear` calls oneDNN's linear there: `torch.ops.mkldnn._linear_pointwise`, the operator Inductor's
CPU passes emit. It is a private operator (no deprecation notice in torch 2.13; the version is pinned),
taken only when PyTorch was built with oneDNN and `torch.backends.mkldnn` is enabled
(`torch.backends.mkldnn.flags(enabled=False)` turns it off), and `F.linear` serves every other case:
training (autograd), autocast, other dtypes and devices, and `torch.compile`, which chooses its own
kernels.

Parameters and state-dict keys are `nn.Linear`'s, so a weight can be tied to an embedding and
`isinstance(m, nn.Linear)` holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def uses_onednn(x: Tensor, weight: Tensor) -> bool:
    """Whether `Linear` multiplies x by weight with oneDNN: float32 CPU inference outside autocast and compile."""
    return (
        ONEDNN
        and torch.backends.mkldnn.enabled
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x W^T + b with oneDNN where `uses_onednn`, else `F.linear`."""
    if uses_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """y = x W^T + b, (..., in_features) -> (..., out_features)."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

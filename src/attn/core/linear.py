"""The model's one linear layer: `nn.Linear`, whose float32 inference on a CPU runs through oneDNN.

Without autograd, PyTorch's CPU `F.linear` in float32 calls MKL's sgemm; oneDNN (which PyTorch ships) multiplies the
same matrices faster at the row counts of a decode step and a prefill (`benchmarks/results/linear-cpu/`). So
`Linear` calls oneDNN's linear there: `torch.ops.mkldnn._linear_pointwise`, the private operator Inductor's CPU
passes emit (the torch version is pinned), taken only when PyTorch was built with oneDNN and `torch.backends.mkldnn`
is enabled (`torch.backends.mkldnn.flags(enabled=False)` turns it off). `F.linear` serves every other case:
training (autograd), autocast, other dtypes and devices, and `torch.compile`, which chooses its own kernels.

oneDNN multiplies by a weight in its own blocked layout, and reorders a plain (out, in) matrix into it at every call
with several rows. Inside `packed_weights(model)` each `Linear` keeps the reordered copy
(`torch.ops.mkldnn._reorder_linear_weight`) from its second call with several rows on, and drops it at the end; one
row (a decode step at batch 1) multiplies the plain matrix, as fast. The decoding functions, `attn chat` and the
server's engines run inside it (`benchmarks/results/serving/`). It is a scope, not a cache that follows the weights,
because a weight can change without a trace: torch's fused AdamW updates parameters in place without moving their
version counters. While it lasts the weights must not change, and each packed layer holds its weight twice.

Parameters and state-dict keys are `nn.Linear`'s, so weights tie to embeddings and `isinstance(m, nn.Linear)` holds.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

M = TypeVar("M")
P = ParamSpec("P")
R = TypeVar("R")
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


PACKING_ROWS = 8  # the row count oneDNN lays the weight out for: no slower than the plain matrix from 1 to 2048 rows


class Linear(nn.Linear):
    """y = x W^T + b, (..., in_features) -> (..., out_features)."""

    packing = False  # inside `packed_weights`
    _used = False  # called with several rows inside it
    _packed: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.packing and x.numel() > x.size(-1) and uses_onednn(x, self.weight):
            return linear(x, self._packed_weight(), self.bias)
        return linear(x, self.weight, self.bias)

    def _packed_weight(self) -> Tensor:
        """The weight in oneDNN's layout from the second call with several rows on: the first uses the plain
        matrix, so a weight used once (a batch of one's prompt, whose decode steps have one row) is not reordered."""
        packed = self._packed
        if packed is None:
            if not self._used:
                self._used = True
                return self.weight
            packed = self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACKING_ROWS)
        return packed

    def __getstate__(self) -> dict[str, Any]:
        """The module outside any `packed_weights` scope: a packed weight cannot be copied or pickled, and a copy
        is in no scope."""
        state = dict(super().__getstate__())
        for name in ("packing", "_used", "_packed"):
            state.pop(name, None)
        return state


@contextlib.contextmanager
def packed_weights(model: object) -> Iterator[None]:
    """Float32 CPU inference with the model's linear weights in oneDNN's layout (see the module's docstring).

    Nested scopes share the outer one's packed weights; a model that is not an `nn.Module` has nothing to pack.
    """
    modules = model.modules() if isinstance(model, nn.Module) else ()
    layers = [m for m in modules if isinstance(m, Linear) and not m.packing]
    for layer in layers:
        layer._packed, layer._used, layer.packing = None, False, True
    try:
        yield
    finally:
        for layer in layers:
            layer.packing, layer._used, layer._packed = False, False, None


@contextlib.contextmanager
def inference(model: object) -> Iterator[None]:
    """The scope a model answers in: no autograd (`torch.inference_mode`) and its float32 linear weights packed
    (`packed_weights`). Nested scopes share the outer one's packed weights, so an application that answers many
    requests with one model enters it once around them all."""
    with torch.inference_mode(), packed_weights(model):
        yield


def in_inference(fn: Callable[Concatenate[M, P], R]) -> Callable[Concatenate[M, P], R]:
    """`fn(model, ...)` run inside `inference(model)`."""

    @functools.wraps(fn)
    def run(model: M, *args: P.args, **kwargs: P.kwargs) -> R:
        with inference(model):
            return fn(model, *args, **kwargs)

    return run

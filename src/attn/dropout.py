"""Dropout (Srivastava et al., 2014; section 5.4 of the paper) with a cheaper random mask on the CPU.

Dropout zeroes each element with probability p and scales the kept ones by 1 / (1 - p), so the
expectation of every element is unchanged. On the CPU torch draws one 32-bit Mersenne Twister
number per element for its mask, about 12 ns an element on an AVX2 EPYC core: in a MiniLM
fine-tune step that is 5.5-6 % of the time (benchmarks/results/issue22-small-cpu). Here one 64-bit
draw serves four elements: an element is kept when its 16 random bits are at or above
round(p * 2^16). So the probability used, p', is p rounded to a multiple of 2^-16 (|p' - p| <=
7.7e-6), and kept elements are scaled by 1 / (1 - p'), which keeps the expectation exact. The draws
come from torch's default CPU generator (so `torch.manual_seed` and a checkpoint's RNG state
reproduce them), or from the generator a thread set with `thread_generator`. On other devices this
is `torch.nn.functional.dropout` (a GPU's fused kernel is already cheap).

Departure from torch: the mask, not the function, differs; p' instead of p as said above.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16  # one draw of 64 bits gives four 16-bit lanes
INT64_MIN = -(1 << 63)

_local = threading.local()


@contextlib.contextmanager
def thread_generator(generator: torch.Generator | None) -> Iterator[None]:
    """Dropout masks drawn in this thread inside the block come from `generator` (None: torch's default).

    Threads that run parts of one step at the same time each draw from their own generator, so the
    masks do not depend on the order in which the threads happen to run.
    """
    before = getattr(_local, "generator", None)
    _local.generator = generator
    try:
        yield
    finally:
        _local.generator = before


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, generator: torch.Generator | None = None) -> Tensor:
    """A CPU bool mask of `shape`, True = keep, each element kept with probability 1 - p' (see the module).

    Args:
        shape: the mask's shape.
        p: the drop probability, 0 <= p < 1.
        generator: where the bits come from (default: this thread's, see `thread_generator`).

    Returns:
        bool tensor of `shape`.
    """
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64)
    bits.random_(INT64_MIN, None, generator=generator or getattr(_local, "generator", None))  # all 64 bits
    lanes = bits.view(torch.int16)[:n].view(shape)  # uniform on [-2^15, 2^15)
    return lanes >= drop_levels(p) - LEVELS // 2


def drop_levels(p: float) -> int:
    """How many of the 2^16 values of a lane drop the element: round(p * 2^16)."""
    return round(p * LEVELS)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p') (see the module).

    Args:
        x: any shape.
        p: drop probability in [0, 1].
        training: False (or p = 0) returns x itself.

    Returns:
        A tensor of x's shape and dtype.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0:
        return F.dropout(x, p, training=True)
    keep = keep_mask(x.shape, p)
    scale = LEVELS / (LEVELS - drop_levels(p))
    return x * torch.where(keep, scale, 0.0).to(x.dtype)


class Dropout(nn.Module):
    """`dropout` as a module: active in training mode, the identity in eval mode (like `nn.Dropout`)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"

"""Position information, behind one interface (section 3.5 of the paper and its successors).

Each scheme is a module with three hooks, and each hook is a no-op unless the scheme needs it:
- `embed(x, positions)`: absolute schemes add a vector per position to the embeddings
  (sinusoidal, as in the paper, or learned, as in BERT and GPT-2);
- `rotation(positions)`: rotary positions (Su et al. 2021) rotate queries and keys of
  self-attention by angles proportional to their positions;
- `bias(q_positions, k_positions)`: relative position bias (Raffel et al. 2020, T5) adds a learned
  scalar per head and bucketed distance to the attention scores.
`positions` are (B, T) long tensors, so every row of a batch may have its own offsets (left
padding, cached decoding).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attn.config import SinusoidalLayout


def identity(x: Tensor) -> Tensor:
    return x


class NoPositions(nn.Module):
    """No position information: the stack is then permutation equivariant."""

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotation(self, positions: Tensor) -> Callable[[Tensor], Tensor]:
        return identity

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        return None


def sinusoidal_table(max_positions: int, d_model: int, layout: SinusoidalLayout) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Returns:
        (max_positions, d_model). INTERLEAVED puts the sin/cos pair of frequency i in columns
        2i and 2i+1 (the paper); CONCATENATED puts all sines in the first half and all cosines
        in the second (Marian, tensor2tensor).
    """
    pos = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    angles = pos * inv_freq  # (P, d/2)
    if layout == SinusoidalLayout.INTERLEAVED:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (P, d)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (P, d)
    return table[:, :d_model].float()


class SinusoidalPositions(NoPositions):
    """Fixed sinusoids added to the embeddings (the paper's choice)."""

    def __init__(self, max_positions: int, d_model: int, layout: SinusoidalLayout) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model, layout), persistent=False)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table[positions].to(x.dtype)  # (B, T, d_model)


class LearnedPositions(NoPositions):
    """One trained vector per position (BERT, GPT-2)."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_positions, d_model)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table(positions)  # (B, T, d_model)


class RotaryPositions(NoPositions):
    """Rotary position embedding: feature pairs (j, j + d_k/2) rotate by angle pos * base^(-2j/d_k)."""

    def __init__(self, max_positions: int, head_dim: int, base: float) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d_k/2,)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq  # (P, d_k/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, d_k)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def rotation(self, positions: Tensor) -> Callable[[Tensor], Tensor]:
        cos = self.cos[positions][:, None]  # (B, 1, T, d_k)
        sin = self.sin[positions][:, None]

        def rotate(x: Tensor) -> Tensor:
            first, second = x.chunk(2, dim=-1)
            turned = torch.cat([-second, first], dim=-1)  # (B, h, T, d_k)
            return x * cos.to(x.dtype) + turned * sin.to(x.dtype)

        return rotate


def relative_bucket(distance: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's bucketing of key-minus-query distances: exact for small ones, logarithmic up to max_distance.

    Args:
        distance: long tensor of k_pos - q_pos.

    Returns:
        Long tensor of the same shape with values in [0, buckets).
    """
    offset = torch.zeros_like(distance)
    if bidirectional:
        buckets //= 2
        offset = (distance > 0).long() * buckets
        n = distance.abs()
    else:
        n = (-distance).clamp(min=0)  # a causal decoder only sees the past
    exact = buckets // 2
    log_ratio = torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (buckets - exact)).long()).clamp(max=buckets - 1)
    return offset + torch.where(n < exact, n, large)


class RelativePositionBias(NoPositions):
    """A learned scalar per (head, distance bucket), added to every layer's attention scores (T5)."""

    def __init__(self, heads: int, buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.buckets = buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.table = nn.Embedding(buckets, heads)

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        distance = k_positions[:, None, :] - q_positions[:, :, None]  # (B, Tq, Tk)
        bucket = relative_bucket(distance, self.bidirectional, self.buckets, self.max_distance)
        return self.table(bucket).permute(0, 3, 1, 2)  # (B, h, Tq, Tk)

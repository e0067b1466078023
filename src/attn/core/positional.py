"""Position information, behind one interface (section 3.5 of the paper and its successors).

Each scheme is a `PositionScheme`: a module with three hooks, each a no-op unless the scheme needs it:
- `embed(x, positions)`: absolute schemes add a vector per position to the embeddings (sinusoidal, as in the
  paper, or learned, as in BERT and GPT-2);
- `rotation(positions)`: rotary positions (Su et al. 2021) rotate queries and keys of self-attention by angles
  proportional to their positions;
- `bias(q_positions, k_positions)`: relative position bias (Raffel et al. 2020, T5) adds a learned scalar per head
  and bucketed distance to the attention scores.
`positions` are (B, T) long tensors, so every row of a batch may have its own offsets (left padding, cached decoding).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attn.core.config import SinusoidalLayout


def identity(x: Tensor) -> Tensor:
    return x


class PositionScheme(nn.Module):
    """The interface of every positional scheme: three hooks, each a no-op until a scheme overrides it."""

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotation(self, positions: Tensor) -> Callable[[Tensor], Tensor]:
        return identity

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        return None


class NoPositions(PositionScheme):
    """No position information: the stack is then permutation equivariant."""


def sinusoidal_table(max_positions: int, d_model: int, layout: SinusoidalLayout) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Returns:
        (max_positions, d_model). INTERLEAVED puts the sin/cos pair of frequency i in columns 2i and 2i+1 (the
        paper); CONCATENATED puts all sines in the first half and all cosines in the second (Marian, tensor2tensor).
    """
    pos = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    angles = pos * inv_freq  # (P, d/2)
    if layout == SinusoidalLayout.INTERLEAVED:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (P, d)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (P, d)
    return table[:, :d_model].float()


class SinusoidalPositions(PositionScheme):
    """Fixed sinusoids added to the embeddings (the paper's choice)."""

    def __init__(self, max_positions: int, d_model: int, layout: SinusoidalLayout) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model, layout), persistent=False)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table[positions].to(x.dtype)  # (B, T, d_model)


class LearnedPositions(PositionScheme):
    """One trained vector per position (BERT, GPT-2)."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_positions, d_model)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table(positions)  # (B, T, d_model)


class RotaryPositions(PositionScheme):
    """Rotary position embedding: feature pairs (j, j + d/2) rotate by angle pos * inv_freq[j].

    Only the first `dims` features of a head rotate (all of them unless the model rotates a
    fraction, as Phi-3 may); `scale` multiplies cos and sin (YaRN's attention factor). The angles of each call's
    positions are computed in float64, then rounded to float32: no table of every position is held, which for a
    long context would outweigh a small model's quantized layers.
    """

    def __init__(self, inv_freq: Tensor, scale: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.double(), persistent=False)
        self.dims = 2 * inv_freq.numel()
        self.scale = scale

    def rotation(self, positions: Tensor) -> Callable[[Tensor], Tensor]:
        angles = positions[..., None].double() * self.inv_freq  # (B, T, d/2)
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, d)
        cos = (angles.cos() * self.scale).float()
        sin = (angles.sin() * self.scale).float()
        dims = self.dims

        def rotate(x: Tensor) -> Tensor:
            turned = x[..., :dims]
            first, second = turned.chunk(2, dim=-1)
            half_turn = torch.cat([-second, first], dim=-1)  # (B, h, T, d)
            rotated = turned * cos.to(x.dtype) + half_turn * sin.to(x.dtype)
            return rotated if dims == x.size(-1) else torch.cat([rotated, x[..., dims:]], dim=-1)

        return rotate


def rotary_frequencies(dims: int, base: float) -> Tensor:
    """inv_freq[j] = base^(-2j / dims) for the dims / 2 rotated pairs, in float64."""
    return base ** (-torch.arange(0, dims, 2, dtype=torch.float64) / dims)


def linear_scaling(inv_freq: Tensor, factor: float) -> Tensor:
    """Position interpolation: every frequency divided by `factor`."""
    return inv_freq / factor


def llama3_scaling(inv_freq: Tensor, factor: float, original: int, low: float, high: float) -> Tensor:
    """Llama 3.1's rule: wavelengths longer than original / low are divided by `factor`, those shorter
    than original / high kept, and those between blended linearly in original / wavelength."""
    wavelength = 2 * math.pi / inv_freq
    smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def yarn_scaling(
    inv_freq: Tensor, base: float, factor: float, original: int, beta_fast: float, beta_slow: float
) -> Tensor:
    """YaRN's NTK-by-parts blend (Peng et al. 2023): pairs that turn fewer than `beta_slow` times over
    the original context are interpolated (divided by `factor`), those that turn more than
    `beta_fast` times kept, with a linear ramp over the pair index between the two."""
    dims = 2 * inv_freq.numel()

    def pair_turning(turns: float) -> float:  # the pair index that turns `turns` times over `original`
        return dims * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), dims - 1)
    span = (high - low) or 0.001
    ramp = ((torch.arange(inv_freq.numel(), dtype=torch.float64) - low) / span).clamp(0.0, 1.0)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def yarn_attention_factor(factor: float) -> float:
    """YaRN's default scale of cos and sin, 0.1 ln(factor) + 1 (1 for no extension)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def relative_bucket(distance: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's bucketing of key-minus-query distances (long, k_pos - q_pos) into [0, buckets), elementwise: exact for
    small ones, logarithmic up to max_distance."""
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


class RelativePositionBias(PositionScheme):
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

"""The paper's small parts and their successors: FFNs, norms, residual wrappers, embeddings.

Post-norm (section 3.1), pre-norm, pre-and-post-norm (Gemma) and output-norm (OLMo 2) are small residual wrappers
with one interface; the builder picks one, and the norm inside (LayerNorm or RMSNorm). Dropout sits where section
5.4 puts it: on every sub-layer output before the residual add, and on the sum of embeddings and positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.core.config import Activation
from attn.core.linear import Linear
from attn.core.positional import PositionScheme

ACTIVATIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    Activation.RELU: F.relu,
    Activation.GELU: F.gelu,
    Activation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    Activation.SILU: F.silu,
}


class FeedForward(nn.Module):
    """FFN(x) = W_2 act(W_1 x + b_1) + b_2, applied to each position alone (equation 2)."""

    def __init__(self, d_model: int, d_ff: int, activation: Activation, bias: bool, dropout: float) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff, bias=bias)
        self.w2 = Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.w2(self.dropout(self.act(self.w1(x))))


class GatedFeedForward(FeedForward):
    """FFN(x) = W_2 (act(W_gate x) * W_up x): SwiGLU with SiLU, GeGLU with GELU (Shazeer 2020).

    `w1` holds W_gate and W_up stacked, [gate; up], (2 d_ff x d_model): one matrix product for both.
    """

    def __init__(self, d_model: int, d_ff: int, activation: Activation, bias: bool, dropout: float) -> None:
        super().__init__(d_model, d_ff, activation, bias, dropout)
        self.w1 = Linear(d_model, 2 * d_ff, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(self.dropout(self.act(gate) * up))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (offset + w) over groups of `size` features (Zhang & Sennrich 2019).

    `offset` is 0 for Llama's form and 1 for Gemma's, whose weight starts at 0. With `size` smaller than the input's
    last dimension each group of `size` features is normalised alone: the heads of a query or key projection.
    """

    def __init__(self, size: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), 1.0 - offset))
        self.eps = eps
        self.offset = offset

    def forward(self, x: Tensor) -> Tensor:
        size = self.weight.numel()
        groups = x.unflatten(-1, (-1, size))  # (..., n, size)
        return F.rms_norm(groups, (size,), self.weight + self.offset, self.eps).flatten(-2)


class PostNorm(nn.Module):
    """Norm(x + Dropout(Sublayer(x))): the paper's arrangement."""

    def __init__(self, norm: nn.Module, dropout: float) -> None:
        super().__init__()
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(x + self.dropout(sublayer(x)))


class PreNorm(PostNorm):
    """x + Dropout(Sublayer(Norm(x))): trains deep stacks without warmup tricks (GPT-2, Llama)."""

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + self.dropout(sublayer(self.norm(x)))


class OutputNorm(PostNorm):
    """x + Dropout(Norm(Sublayer(x))): the sub-layer's output normalised inside the residual (OLMo 2)."""

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + self.dropout(self.norm(sublayer(x)))


class PrePostNorm(PostNorm):
    """x + Dropout(PostNorm(Sublayer(Norm(x)))): normalised on the way in and out (Gemma 2 and 3)."""

    def __init__(self, norm: nn.Module, post_norm: nn.Module, dropout: float) -> None:
        super().__init__(norm, dropout)
        self.post_norm = post_norm

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + self.dropout(self.post_norm(sublayer(self.norm(x))))


class Embeddings(nn.Module):
    """Token embedding * scale + positions (+ segment embedding), optional LayerNorm, dropout.

    The paper multiplies the embedding by sqrt(d_model) (section 3.4); BERT and GPT-2 use scale 1.
    """

    def __init__(
        self,
        tokens: nn.Embedding,
        scale: float,
        positions: PositionScheme,
        segments: nn.Embedding | None,
        norm: nn.Module,
        dropout: float,
    ) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = scale
        self.positions = positions
        self.segments = segments
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: Tensor, positions: Tensor, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) long, positions (B, T) long -> (B, T, d_model)."""
        x = self.positions.embed(self.tokens(tokens) * self.scale, positions)
        if self.segments is not None:
            x = x + self.segments(positions.new_zeros(positions.shape) if segments is None else segments)
        return self.dropout(self.norm(x))


def embedding_scale(d_model: int, scaled: bool) -> float:
    return math.sqrt(d_model) if scaled else 1.0


class SoftCappedProjection(Linear):
    """logits = c tanh((x W^T + b) / c): the vocabulary projection with Gemma 2's final soft-cap c."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool, cap: float) -> None:
        super().__init__(d_model, vocab_size, bias=bias)
        self.cap = cap

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., vocab), each logit in (-cap, cap)."""
        return self.cap * torch.tanh(super().forward(x) / self.cap)

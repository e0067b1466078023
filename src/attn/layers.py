"""The paper's small parts: position-wise FFN, residual + LayerNorm wrappers, embeddings.

Post-norm (section 3.1: LayerNorm(x + Dropout(Sublayer(x)))) and pre-norm
(x + Dropout(Sublayer(LayerNorm(x)))) are two small wrappers with one interface; the builder
picks one. Dropout sits where section 5.4 puts it: on every sub-layer output before the
residual add, and on the sum of embeddings and positional encodings.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.config import Activation
from attn.positional import NoPositions

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
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.w2(self.dropout(self.act(self.w1(x))))


class PostNorm(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))): the paper's arrangement."""

    def __init__(self, d_model: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(x + self.dropout(sublayer(x)))


class PreNorm(PostNorm):
    """x + Dropout(Sublayer(LayerNorm(x))): trains deep stacks without warmup tricks (GPT-2).

    The same LayerNorm and dropout as `PostNorm`, arranged the other way round.
    """

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + self.dropout(sublayer(self.norm(x)))


class Embeddings(nn.Module):
    """Token embedding * scale + positions (+ segment embedding), optional LayerNorm, dropout.

    The paper multiplies the embedding by sqrt(d_model) (section 3.4); BERT and GPT-2 use scale 1.
    """

    def __init__(
        self,
        tokens: nn.Embedding,
        scale: float,
        positions: NoPositions,
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



DECODE_ROWS = 256  # up to this many rows a call is a decode step's, not a sequence's


class OutputProjection(nn.Linear):
    """logits = x W^T + b, (..., d_model) -> (..., vocab): the vocabulary projection of every architecture.

    A decode step multiplies a few rows by the whole (vocab, d_model) matrix, where `F.linear` on the CPU
    is slow: for 2 to `DECODE_ROWS` rows, `(W @ x^T)^T` (the weight on the left, as it is stored) is about
    3x faster at gpt2's 50,257 x 768 on 2 cores, 1.28x a whole greedy decode step at batch 4
    (`benchmarks/results/projection-decode/`). So without autograd on the CPU the module takes that
    layout, and `F.linear` everywhere else (training, a GPU, `torch.compile`, one row, longer inputs).
    Parameters and state-dict keys are `nn.Linear`'s, so the weight can be tied to an embedding.
    """

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., vocab)."""
        rows = x.numel() // x.size(-1)
        decoding = not torch.is_grad_enabled() and x.device.type == "cpu" and not torch.compiler.is_compiling()
        if not (decoding and 1 < rows <= DECODE_ROWS):
            return F.linear(x, self.weight, self.bias)
        logits = (self.weight @ x.reshape(rows, -1).t()).t().contiguous().view(*x.shape[:-1], -1)  # (..., vocab)
        return logits if self.bias is None else logits + self.bias

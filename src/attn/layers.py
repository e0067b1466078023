"""The paper's small parts: position-wise FFN, residual + LayerNorm wrappers, embeddings, the
output projection.

Post-norm (section 3.1: LayerNorm(x + Dropout(Sublayer(x)))) and pre-norm
(x + Dropout(Sublayer(LayerNorm(x)))) are two small wrappers with one interface; the builder
picks one. Dropout sits where section 5.4 puts it: on every sub-layer output before the
residual add, and on the sum of embeddings and positional encodings.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.config import Activation
from attn.dropout import Dropout
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
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.w2(self.dropout(self.act(self.w1(x))))


def first_rows(x: Tensor, rows: int | None) -> Tensor:
    """(B, T, ...) -> its first `rows` positions (B, rows, ...), a view; all of x when rows is None."""
    return x if rows is None else x[:, :rows]


class PostNorm(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))): the paper's arrangement."""

    def __init__(self, d_model: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor], rows: int | None = None) -> Tensor:
        """`rows`: the sublayer returns only the first `rows` positions, and so does this."""
        return self.norm(first_rows(x, rows) + self.dropout(sublayer(x)))


class PreNorm(nn.Module):
    """x + Dropout(Sublayer(LayerNorm(x))): trains deep stacks without warmup tricks (GPT-2)."""

    def __init__(self, d_model: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor], rows: int | None = None) -> Tensor:
        """`rows`: the sublayer returns only the first `rows` positions, and so does this."""
        return first_rows(x, rows) + self.dropout(sublayer(self.norm(x)))


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
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, positions: Tensor, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) long, positions (B, T) long -> (B, T, d_model)."""
        return self.vectors(self.tokens(tokens) * self.scale, positions, segments)

    def vectors(self, x: Tensor, positions: Tensor, segments: Tensor | None = None) -> Tensor:
        """Adds positions (and segments) to given input vectors x (B, T, d_model)."""
        x = self.positions.embed(x, positions)
        if self.segments is not None:
            x = x + self.segments(positions.new_zeros(positions.shape) if segments is None else segments)
        return self.dropout(self.norm(x))


def embedding_scale(d_model: int, scaled: bool) -> float:
    return math.sqrt(d_model) if scaled else 1.0


# Most rows for which a call on the CPU without autograd (a decode step: one row per sequence or beam; a
# short prompt) uses the decoding layouts of `OutputProjection`; longer inputs go through `F.linear`.
DECODE_ROWS = 256


@dataclasses.dataclass(frozen=True)
class _Transposed:
    """A contiguous (d_model, vocab) copy of an output weight and what identifies the weight it was made from."""

    matrix: Tensor
    storage: weakref.ref
    data_ptr: int
    version: int
    hook: torch.utils.hooks.RemovableHandle | None

    def matches(self, weight: Tensor) -> bool:
        """Whether `weight` still holds the values the copy was made from."""
        return (
            self.storage() is weight.untyped_storage()
            and self.data_ptr == weight.data_ptr()
            and self.version == weight._version
        )


class OutputProjection(nn.Linear):
    """logits = x W^T + b, (..., d_model) -> (..., vocab): the one projection behind `forward` and decoding.

    A decode step on the CPU multiplies a few rows by the whole (vocab, d_model) matrix, where `F.linear`
    is slow (`benchmarks/projection.py`, issue 21): one row is fastest as `x @ W^T` with W^T stored
    contiguously, (d_model, vocab), and 2 to `DECODE_ROWS` rows as `(W @ x^T)^T`, the weight on the left
    as it is stored. So without autograd on the CPU the module takes those layouts, and `F.linear` in
    every other case: with autograd (training: the gradient flows through the weight itself), on a GPU,
    under `torch.compile`, for longer inputs.

    The transposed copy is made once per model, on the first one-row call, and kept while the weight
    holds the same values: an in-place change (`load_state_dict`, a non-fused optimizer) bumps the
    weight's version, `.to()` or a new weight changes its storage, and a gradient reaching the weight
    (which any optimizer step needs; fused optimizers change the weight without bumping its version)
    drops the copy. While the weight has a gradient the copy is neither used nor made. Parameters and
    state-dict keys are those of `nn.Linear`, so tying the weight to an embedding
    (`projection.weight = embedding.weight`) works as it does there.
    """

    def __init__(self, d_model: int, vocab: int, bias: bool) -> None:
        super().__init__(d_model, vocab, bias=bias)
        self._transposed: _Transposed | None = None

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., vocab)."""
        rows = x.numel() // x.size(-1)
        if not 0 < rows <= DECODE_ROWS or not self._decoding_on_cpu():
            return F.linear(x, self.weight, self.bias)
        if rows == 1:
            logits = x @ self._transposed_weight()
        else:
            logits = (self.weight @ x.reshape(rows, -1).t()).t().contiguous().view(*x.shape[:-1], -1)
        return logits if self.bias is None else logits + self.bias

    def _decoding_on_cpu(self) -> bool:
        return (
            not torch.compiler.is_compiling()
            and not torch.is_grad_enabled()
            and self.weight.device.type == "cpu"
            and self.weight.grad is None
        )

    def _transposed_weight(self) -> Tensor:
        """The (d_model, vocab) copy of the current weight, made anew when the weight changed."""
        weight, kept = self.weight, self._transposed
        if kept is not None and kept.matches(weight):
            return kept.matrix
        self._drop()
        hook = weight.register_post_accumulate_grad_hook(self._on_gradient) if weight.requires_grad else None
        kept = _Transposed(
            weight.detach().t().contiguous(), weakref.ref(weight.untyped_storage()), weight.data_ptr(),
            weight._version, hook,
        )
        self._transposed = kept
        return kept.matrix

    def _on_gradient(self, weight: Tensor) -> None:
        self._drop()

    def _drop(self) -> None:
        kept, self._transposed = self._transposed, None
        if kept is not None and kept.hook is not None:
            kept.hook.remove()

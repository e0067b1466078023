"""Scaled dot-product attention and multi-head attention (section 3.2 of the paper).

`scaled_dot_product_attention` is the plain reference: softmax(Q K^T / sqrt(d_k)) V written out.
`fast_attention` computes the same through `torch.nn.functional.scaled_dot_product_attention`
(fused kernels, no (T x T) weights kept for backward on the flash/memory-efficient paths). A
model picks one of the two once, in the builder. Masks follow `attn.masks`: True = may attend.

Departures from the paper: self-attention projects Q, K and V with one fused (d_model x 3 d_model)
matrix, which is the same as three separate projections stacked; an optional additive score bias
carries relative position information (T5), and rotary positions rotate Q and K (RoFormer).

Attention maps are opt-in: inside `module.capture()` an attention module computes its weights with
the written-out formula and records them; outside it, `forward` never forms them on the fast path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Protocol

import torch.nn.functional as F
from torch import Tensor, nn

from attn.masks import CausalMask, Mask, cheap_to_read, materialize, with_bias


class AttentionFn(Protocol):
    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Mask, bias: Tensor | None, dropout: float
    ) -> Tensor: ...


def attention_weights(q: Tensor, k: Tensor, mask: Mask = None, bias: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k) + bias) with masked scores at -inf; fully masked rows are all zero.

    Args:
        q: (B, h, Tq, d_k) queries.
        k: (B, h, Tk, d_k) keys.
        mask: bool, broadcastable to (B, h, Tq, Tk), True = may attend; or `CAUSAL`.
        bias: float, broadcastable to (B, h, Tq, Tk), added to the scores.

    Returns:
        (B, h, Tq, Tk) attention weights; each row sums to 1, or to 0 if all its keys are masked.
    """
    mask = materialize(mask, q.size(-2), k.size(-2), q.device)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is None:
        return scores.softmax(dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)  # NaN in fully masked rows: the softmax of only -inf
    return weights.masked_fill(empty_rows(mask), 0.0)


def empty_rows(mask: Tensor) -> Tensor:
    """(..., Tq, Tk) bool mask -> (..., Tq, 1) bool: the queries that may attend no key at all.

    Such rows (the padding of a left-padded prompt, a source of padding only) have no defined
    attention; both attention functions set their output to exactly 0, so no kernel's NaN can
    reach the next layer or, through 0 * NaN, the KV cache.
    """
    return ~mask.any(dim=-1, keepdim=True)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, equation (1) of the paper.

    Args:
        q: (B, h, Tq, d_k); k: (B, h, Tk, d_k); v: (B, h, Tk, d_v).
        mask: bool, broadcastable to (B, h, Tq, Tk), True = may attend; or `CAUSAL`.
        bias: optional additive score bias, broadcastable to (B, h, Tq, Tk).
        dropout: dropout probability on the attention weights (0 in eval mode).

    Returns:
        (B, h, Tq, d_v).
    """
    return F.dropout(attention_weights(q, k, mask, bias), dropout) @ v


def fast_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """The same function as `scaled_dot_product_attention`, through PyTorch's fused SDPA kernels.

    A query row whose keys are all masked gives exactly 0, as in the reference, whatever the kernel.
    """
    if isinstance(mask, CausalMask) and bias is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    mask = materialize(mask, q.size(-2), k.size(-2), q.device)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=with_bias(mask, bias), dropout_p=dropout)
    # What a kernel returns for a fully masked row differs (0 on CPU, NaN on others): make it 0.
    # Training batches have no row without keys; where the flags are cheap to read, the zeroing (a pass
    # over the output and one over its gradient) runs only when a row is empty.
    empty = empty_rows(mask)
    if not cheap_to_read(empty) or bool(empty.any()):
        out = out.masked_fill(empty, 0.0)
    return out


ATTENTION_FUNCTIONS: dict[str, AttentionFn] = {"fast": fast_attention, "reference": scaled_dot_product_attention}


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, h * d_k) -> (B, h, T, d_k)."""
    b, t, _ = x.shape
    return x.view(b, t, heads, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class KVSlot(Protocol):
    """Where a self-attention layer keeps its past keys and values (see `attn.kv_cache`)."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


class NoCache:
    """The slot used outside cached decoding: keys and values are used as they are."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k, v


NO_CACHE = NoCache()


@dataclasses.dataclass(frozen=True)
class AttentionCapture:
    """What one attention module computed in one forward pass.

    Attributes:
        weights: (B, h, Tq, Tk) attention probabilities; rows of masked-out queries are zero.
        values: (B, h, Tk, d_k) the values they weight.
        output: (B, Tq, d_model) what the module returned: out(merge_heads(weights @ values)).
    """

    weights: Tensor
    values: Tensor
    output: Tensor


class MultiHead(nn.Module):
    """What self- and cross-attention share: attending with h heads, then the output projection W^O.

    Subclasses add their input projections and then `out` (d_model x d_model), and call `combine`.
    """

    out: nn.Linear
    _captures: list[AttentionCapture] | None = None

    def __init__(self, heads: int, dropout: float, attend: AttentionFn) -> None:
        """`dropout`: the probability of dropping an attention weight in training mode."""
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.attend = attend

    def combine(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask, bias: Tensor | None) -> Tensor:
        """q (B, h, Tq, d_k), k and v (B, h, Tk, d_k) -> (B, Tq, d_model)."""
        p = self.dropout if self.training else 0.0
        if self._captures is None:
            return self.out(merge_heads(self.attend(q, k, v, mask, bias, p)))
        weights = attention_weights(q, k, mask, bias)  # (B, h, Tq, Tk)
        output = self.out(merge_heads(F.dropout(weights, p) @ v))
        self._captures.append(AttentionCapture(weights, v, output))
        return output

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[AttentionCapture]]:
        """Records every forward pass of this module inside the block, in a list it yields.

        The recorded passes compute the written-out weights (the fast kernels never form them), from
        the inputs the module's own forward prepared; what `forward` returns is the same function.
        """
        self._captures = captures = []
        try:
            yield captures
        finally:
            del self._captures  # back to the class's None


class SelfAttention(MultiHead):
    """Multi-head self-attention: h heads of size d_k = d_model / h over one sequence."""

    def __init__(self, d_model: int, heads: int, bias: bool, dropout: float, attend: AttentionFn) -> None:
        super().__init__(heads, dropout, attend)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def project(self, x: Tensor, rotate: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d_model) -> q, k, v each (B, h, T, d_k), with positions applied to q and k."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, d_model)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        return rotate(q), rotate(k), v

    def forward(
        self,
        x: Tensor,
        mask: Mask,
        rotate: Callable[[Tensor], Tensor],
        bias: Tensor | None = None,
        cache: KVSlot = NO_CACHE,
    ) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model). `cache` prepends past keys/values when decoding."""
        q, k, v = self.project(x, rotate)
        k, v = cache.update(k, v)  # (B, h, Tk, d_k) with Tk >= T when cached
        return self.combine(q, k, v, mask, bias)


class CrossAttention(MultiHead):
    """Multi-head attention of decoder queries over the encoder output ("memory")."""

    def __init__(self, d_model: int, heads: int, bias: bool, dropout: float, attend: AttentionFn) -> None:
        super().__init__(heads, dropout, attend)
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, d_model) -> k, v each (B, h, S, d_k); computed once per source when decoding."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return split_heads(k, self.heads), split_heads(v, self.heads)

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
        """x (B, T, d_model), memory k/v (B, h, S, d_k), mask (B, 1, 1, S) -> (B, T, d_model)."""
        q = split_heads(self.q(x), self.heads)  # (B, h, T, d_k)
        k, v = memory_kv
        return self.combine(q, k, v, mask, bias=None)

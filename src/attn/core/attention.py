"""Scaled dot-product attention and multi-head attention (section 3.2 of the paper).

`scaled_dot_product_attention` is the plain reference: softmax(Q K^T / sqrt(d_k)) V written out. `fast_attention`
computes the same through `torch.nn.functional.scaled_dot_product_attention` (fused kernels, no (T x T) weights kept
for backward on the flash/memory-efficient paths). A model picks one of the two once, in the builder. Masks follow
`attn.core.masks`: True = may attend.

Departures from the paper: self-attention projects Q, K and V with one fused matrix, which is the same as three
separate projections stacked; an optional additive score bias carries relative position information (T5), and rotary
positions rotate Q and K (RoFormer). Its successors' options are here too: fewer key/value heads than query heads,
each shared by a group of query heads (grouped-query attention, Ainslie et al. 2023), a head size other than
d_model / h, normalised queries and keys (QK-norm), another score scale and a soft cap on the scores (`Scores`).

Attention maps are opt-in: inside `module.capture()` an attention module computes its weights with the written-out
formula, from the inputs its own forward prepared, and records them; outside it, `forward` never forms them on the
fast path. What `forward` returns is the same function either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.core.linear import Linear
from attn.core.masks import CausalMask, Mask, cheap_to_read, materialize, with_bias


@dataclasses.dataclass(frozen=True)
class Scores:
    """How the scores are formed from Q K^T: times `scale` (None: 1/sqrt(d_k)), then capped at
    `softcap` tanh(s / softcap) when `softcap` > 0 (Gemma 2)."""

    scale: float | None = None
    softcap: float = 0.0


PLAIN_SCORES = Scores()


class AttentionFn(Protocol):
    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Mask, bias: Tensor | None, dropout: float, scores: Scores
    ) -> Tensor: ...


def shared_kv(x: Tensor, heads: int) -> Tensor:
    """(B, h_kv, T, d) -> (B, heads, T, d): each key/value head repeated for its group of query heads."""
    return x.repeat_interleave(heads // x.size(1), dim=1)


def attention_weights(
    q: Tensor, k: Tensor, mask: Mask = None, bias: Tensor | None = None, scores: Scores = PLAIN_SCORES
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k) + bias) with masked scores at -inf; fully masked rows are all zero.

    Args:
        q: (B, h, Tq, d_k) queries.
        k: (B, h_kv, Tk, d_k) keys; h_kv divides h (grouped-query attention).
        mask: bool, broadcastable to (B, h, Tq, Tk), True = may attend; or `CAUSAL`.
        bias: float, broadcastable to (B, h, Tq, Tk), added to the scores.

    Returns:
        (B, h, Tq, Tk) attention weights; each row sums to 1, or to 0 if all its keys are masked.
    """
    mask = materialize(mask, q.size(-2), k.size(-2), q.device)
    scale = scores.scale if scores.scale is not None else 1 / math.sqrt(q.size(-1))
    logits = q @ shared_kv(k, q.size(1)).transpose(-2, -1) * scale  # (B, h, Tq, Tk)
    if scores.softcap:
        logits = scores.softcap * torch.tanh(logits / scores.softcap)
    if bias is not None:
        logits = logits + bias
    if mask is None:
        return logits.softmax(dim=-1)
    logits = logits.masked_fill(~mask, float("-inf"))
    weights = logits.softmax(dim=-1)  # NaN in fully masked rows: the softmax of only -inf
    return weights.masked_fill(empty_rows(mask), 0.0)


def empty_rows(mask: Tensor) -> Tensor:
    """(..., Tq, Tk) bool mask -> (..., Tq, 1) bool: the queries that may attend no key at all.

    Such rows (the padding of a left-padded prompt) have no defined attention; both attention functions set their
    output to exactly 0, so no kernel's NaN can reach the next layer or, through 0 * NaN, the KV cache.
    """
    return ~mask.any(dim=-1, keepdim=True)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
    scores: Scores = PLAIN_SCORES,
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, equation (1) of the paper.

    Args:
        q, k, mask, bias: as for `attention_weights`.
        v: (B, h_kv, Tk, d_v).
        dropout: dropout probability on the attention weights (0 in eval mode).

    Returns:
        (B, h, Tq, d_v).
    """
    return F.dropout(attention_weights(q, k, mask, bias, scores), dropout) @ shared_kv(v, q.size(1))


def fast_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
    scores: Scores = PLAIN_SCORES,
) -> Tensor:
    """The same function as `scaled_dot_product_attention`, through PyTorch's fused SDPA kernels.

    A query row whose keys are all masked gives exactly 0, as in the reference, whatever the kernel.
    Soft-capped scores have no fused kernel: they take the reference's written-out path.

    Under bf16 autocast on a CPU the kernel runs in fp32 (and returns the autocast dtype): PyTorch's CPU
    flash-attention backward in bf16 is several times slower than in fp32, so a bf16 training step is shorter with
    its attention in fp32 (`benchmarks/results/precision/`).
    """
    if q.is_cpu and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            out = fast_attention(q.float(), k.float(), v.float(), mask, None if bias is None else bias.float(),
                                 dropout, scores)
        return out.to(q.dtype)
    if scores.softcap:
        return scaled_dot_product_attention(q, k, v, mask, bias, dropout, scores)
    if q.size(2) == 1 and k.size(1) != q.size(1) and bias is None:
        return _one_query_grouped(q, k, v, mask, dropout, scores)
    sdpa = functools.partial(
        F.scaled_dot_product_attention, dropout_p=dropout, scale=scores.scale, enable_gqa=k.size(1) != q.size(1)
    )
    if isinstance(mask, CausalMask) and bias is None:
        return sdpa(q, k, v, is_causal=True)
    mask = materialize(mask, q.size(-2), k.size(-2), q.device)
    if mask is None:
        return sdpa(q, k, v, attn_mask=bias)
    out = sdpa(q, k, v, attn_mask=with_bias(mask, bias))
    # What a kernel returns for a fully masked row differs (0 on CPU, NaN on others): make it 0. Where the flags are
    # cheap to read, the zeroing (a pass over the output and one over its gradient) runs only when a row is empty.
    empty = empty_rows(mask)
    if not cheap_to_read(empty) or bool(empty.any()):
        out = out.masked_fill(empty, 0.0)
    return out


def _one_query_grouped(q: Tensor, k: Tensor, v: Tensor, mask: Mask, dropout: float, scores: Scores) -> Tensor:
    """Grouped-query attention of one query per row (a decode step) as h_kv heads of g = h / h_kv queries.

    The same products with no copy of the keys and values per query head, so a batched decode step is shorter than
    with SDPA's `enable_gqa`. A lone query's mask never depends on the query, so it broadcasts.
    """
    b, h, _, d = q.shape
    grouped = q.view(b, k.size(1), h // k.size(1), d)  # (B, h_kv, g, d)
    out = fast_attention(grouped, k, v, mask, None, dropout, scores)
    return out.view(b, h, 1, d)


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
    """Where a self-attention layer keeps its past keys and values (see `attn.core.kv_cache`)."""

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
        values: (B, h, Tk, d_k) the values they weight (a shared key/value head repeated for each
            query head of its group).
        output: (B, Tq, d_model) what the module returned: out(merge_heads(weights @ values)).
    """

    weights: Tensor
    values: Tensor
    output: Tensor


@dataclasses.dataclass(frozen=True)
class Heads:
    """The head layout of an attention module: `heads` query heads of size `head_dim`, sharing
    `kv_heads` key/value heads (as many as query heads in the paper's multi-head attention)."""

    heads: int
    kv_heads: int
    head_dim: int

    @property
    def groups(self) -> tuple[int, ...]:
        """The key/value head each query head reads: query heads come in runs of `heads // kv_heads`
        that share one (the order in which `shared_kv` repeats them)."""
        return tuple(head // (self.heads // self.kv_heads) for head in range(self.heads))

    @property
    def query_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


class MultiHead(nn.Module):
    """What self- and cross-attention share: attending with h heads, then the output projection W^O.

    Subclasses add their input projections and then `out` (h d_k -> d_model), and call `combine`.
    """

    out: nn.Linear
    _captures: list[AttentionCapture] | None = None

    def __init__(self, layout: Heads, dropout: float, attend: AttentionFn, scores: Scores) -> None:
        """`dropout`: the probability of dropping an attention weight in training mode."""
        super().__init__()
        self.layout = layout
        self.heads = layout.heads
        self.kv_heads = layout.kv_heads
        self.head_dim = layout.head_dim
        self.dropout = dropout
        self.attend = attend
        self.scores = scores

    def combine(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask, bias: Tensor | None) -> Tensor:
        """q (B, h, Tq, d_k), k and v (B, h_kv, Tk, d_k) -> (B, Tq, d_model)."""
        p = self.dropout if self.training else 0.0
        if self._captures is None:
            return self.out(merge_heads(self.attend(q, k, v, mask, bias, p, self.scores)))
        weights = attention_weights(q, k, mask, bias, self.scores)  # (B, h, Tq, Tk)
        values = shared_kv(v, self.heads)
        output = self.out(merge_heads(F.dropout(weights, p) @ values))
        self._captures.append(AttentionCapture(weights, values, output))
        return output

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[AttentionCapture]]:
        """Records every forward pass of this module inside the block, in a list it yields."""
        self._captures = captures = []
        try:
            yield captures
        finally:
            del self._captures  # back to the class's None


class SelfAttention(MultiHead):
    """Multi-head self-attention over one sequence: h query heads, h_kv key/value heads of size d_k.

    `qkv` is [W_Q; W_K; W_V] stacked ((h + 2 h_kv) d_k x d_model). `q_norm` and `k_norm` act on the
    query and key projections before the heads are split (identities unless the model has QK-norm).
    """

    def __init__(
        self,
        d_model: int,
        layout: Heads,
        bias: tuple[bool, bool],
        dropout: float,
        attend: AttentionFn,
        scores: Scores = PLAIN_SCORES,
        qk_norms: tuple[nn.Module, nn.Module] | None = None,
    ) -> None:
        """`bias`: whether the input projections and the output projection have biases."""
        super().__init__(layout, dropout, attend, scores)
        self.qkv = Linear(d_model, layout.query_size + 2 * layout.kv_size, bias=bias[0])
        self.out = Linear(layout.query_size, d_model, bias=bias[1])
        self.q_norm, self.k_norm = qk_norms or (nn.Identity(), nn.Identity())
        self.sizes = (layout.query_size, layout.kv_size, layout.kv_size)

    def project(self, x: Tensor, rotate: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d_model) -> q (B, h, T, d_k), k and v (B, h_kv, T, d_k), positions applied to q and k."""
        q, k, v = self.qkv(x).split(self.sizes, dim=-1)
        q, k = split_heads(self.q_norm(q), self.heads), split_heads(self.k_norm(k), self.kv_heads)
        return rotate(q), rotate(k), split_heads(v, self.kv_heads)

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
        k, v = cache.update(k, v)  # (B, h_kv, Tk, d_k) with Tk >= T when cached
        return self.combine(q, k, v, mask, bias)


class CrossAttention(MultiHead):
    """Multi-head attention of decoder queries over the encoder output ("memory")."""

    def __init__(
        self, d_model: int, layout: Heads, bias: tuple[bool, bool], dropout: float, attend: AttentionFn
    ) -> None:
        super().__init__(layout, dropout, attend, PLAIN_SCORES)
        self.q = Linear(d_model, layout.query_size, bias=bias[0])
        self.kv = Linear(d_model, 2 * layout.kv_size, bias=bias[0])
        self.out = Linear(layout.query_size, d_model, bias=bias[1])

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, d_model) -> k, v each (B, h_kv, S, d_k); computed once per source when decoding."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return split_heads(k, self.kv_heads), split_heads(v, self.kv_heads)

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
        """x (B, T, d_model), memory k/v (M, h_kv, S, d_k), mask (M, 1, 1, S) -> (B, T, d_model).

        B is a multiple of M: the rows come in runs of B / M that read one memory row (the beams of a sentence). A
        run's queries are attended as one sequence of (B / M) T queries, reading the memory once per run; this is
        exact, as every query attends to the memory alone.
        """
        k, v = memory_kv
        runs = x.reshape(k.size(0), -1, x.size(-1))  # (M, (B / M) T, d_model)
        q = split_heads(self.q(runs), self.heads)
        return self.combine(q, k, v, mask, bias=None).view(x.shape)

"""The one mask convention of `attn`.

A mask is a boolean tensor, **True = may attend**, broadcastable to the attention scores' shape (batch, heads,
queries, keys). Masked scores are set to -inf before the softmax. A query row whose keys are all masked gets all-zero
attention weights and so a zero output, never NaN (`attn.core.attention` sets it on both paths).

Token-level masks, shape (batch, length), say which tokens are real (True) and which are padding (False);
`key_mask` lifts one to the score shape.

`CAUSAL` stands for `causal_mask(T, T)` when nothing is padded and queries and keys are the same T positions.
Attention functions accept it wherever they accept a mask: the fast path hands it to PyTorch's fused kernels as
`is_causal=True` (no (T, T) mask is built, kept for backward, or scored in its masked half), and `materialize` turns
it into the boolean mask for the reference path.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CausalMask:
    """The causal mask of a square score matrix, not materialised (see the module docstring)."""

    def __repr__(self) -> str:
        return "CAUSAL"


CAUSAL = CausalMask()
Mask = Tensor | CausalMask | None


def materialize(mask: Mask, queries: int, keys: int, device: torch.device) -> Tensor | None:
    """The boolean tensor a mask stands for (CAUSAL becomes `causal_mask(queries, keys)`)."""
    return causal_mask(queries, keys, device) if isinstance(mask, CausalMask) else mask


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, T) long -> (B, T) bool, True where the token is not padding."""
    return tokens != pad_id


def key_mask(mask: Tensor) -> Tensor:
    """(B, Tk) bool token mask -> (B, 1, 1, Tk): every query may attend the real keys."""
    return mask[:, None, None, :]


def padded_keys(mask: Tensor | None) -> Tensor | None:
    """A (B, Tk) token mask as a key mask (B, 1, 1, Tk), or None when it marks no padding at all.

    Attention without a mask computes the same as with an all-True one, and skips the masked kernel path and the
    zeroing of empty rows. The mask is read only where `cheap_to_read`.
    """
    if mask is None or (cheap_to_read(mask) and bool(mask.all())):
        return None
    return key_mask(mask)


def cheap_to_read(tensor: Tensor) -> bool:
    """Whether reading `tensor` on the host costs little: on the CPU, outside `torch.compile` (on a GPU
    the read waits for the device; in a compiled graph it breaks the graph)."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def causal_mask(queries: int, keys: int | None = None, device: torch.device | None = None) -> Tensor:
    """(1, 1, Tq, Tk) bool: query i may attend key j iff j <= i + (Tk - Tq).

    With Tk > Tq the queries are the last Tq positions of a longer sequence (cached decoding).
    """
    keys = queries if keys is None else keys
    if keys < queries:
        raise ValueError(f"causal_mask needs keys >= queries, got {keys} < {queries}")
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)[None, None]


def window_mask(positions: Tensor, key_positions: Tensor, window: int) -> Tensor:
    """(B, Tq), (B, Tk) positions -> (B, 1, Tq, Tk) bool: a query sees the keys fewer than `window`
    positions behind it (with a causal mask: its last `window` positions, itself included)."""
    return (positions[:, :, None] - key_positions[:, None, :] < window)[:, None]


def positions_from_mask(mask: Tensor) -> Tensor:
    """(B, T) bool token mask -> (B, T) long positions counted over real tokens only.

    With left padding the first real token of every row gets position 0, so a row's positions do not depend on how
    much padding the batch needed. Padding positions are clamped to 0.
    """
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def with_bias(mask: Tensor, bias: Tensor | None) -> Tensor:
    """A boolean mask and an optional additive score bias as one `attn_mask` for SDPA: the mask itself when there is
    no bias, else the bias with -inf where masked."""
    if bias is None:
        return mask
    return bias.masked_fill(~mask, float("-inf"))

"""Transformer layers built from the parts in `attn.core.attention` and `attn.core.layers`.

`Block` is self-attention + FFN: an encoder layer (section 3.1), and with a causal mask the layer of a decoder-only
model. `DecoderBlock` adds attention over the encoder output between the two (the paper's decoder layer). Each
sub-layer is wrapped by the residual arrangement the builder chose.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attn.core.attention import NO_CACHE, CrossAttention, KVSlot, SelfAttention
from attn.core.errors import ShapeError
from attn.core.kv_cache import KVCache
from attn.core.layers import FeedForward
from attn.core.lora import LoRALinear
from attn.core.masks import (
    CAUSAL,
    Mask,
    causal_mask,
    materialize,
    padded_keys,
    positions_from_mask,
    window_mask,
)
from attn.core.positional import PositionScheme


class Block(nn.Module):
    """Self-attention then FFN, each in a residual wrapper."""

    def __init__(self, attn: SelfAttention, ffn: FeedForward, residual: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.attn = attn
        self.ffn = ffn
        self.attn_residual = residual()
        self.ffn_residual = residual()

    def forward(
        self,
        x: Tensor,
        mask: Mask,
        rotate: Callable[[Tensor], Tensor],
        bias: Tensor | None = None,
        cache: KVSlot = NO_CACHE,
    ) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        x = self.attn_residual(x, lambda h: self.attn(h, mask, rotate, bias, cache))
        return self.ffn_residual(x, self.ffn)


class DecoderBlock(nn.Module):
    """Masked self-attention, attention over the encoder output, then FFN (section 3.1)."""

    def __init__(
        self, attn: SelfAttention, cross: CrossAttention, ffn: FeedForward, residual: Callable[[], nn.Module]
    ) -> None:
        super().__init__()
        self.attn = attn
        self.cross = cross
        self.ffn = ffn
        self.attn_residual = residual()
        self.cross_residual = residual()
        self.ffn_residual = residual()

    def forward(
        self,
        x: Tensor,
        mask: Mask,
        rotate: Callable[[Tensor], Tensor],
        bias: Tensor | None,
        memory_kv: tuple[Tensor, Tensor],
        memory_mask: Tensor | None,
        cache: KVSlot = NO_CACHE,
    ) -> Tensor:
        """x (B, T, d_model), memory k/v (B, h, S, d_k) -> (B, T, d_model)."""
        x = self.attn_residual(x, lambda h: self.attn(h, mask, rotate, bias, cache))
        x = self.cross_residual(x, lambda h: self.cross(h, memory_kv, memory_mask))
        return self.ffn_residual(x, self.ffn)


class SlidingWindow(nn.Module):
    """What a decoder's sliding-window layers attend with: the keys fewer than `size` positions
    behind each query, rotated by `positions` (Gemma 3 rotates them with another base)."""

    def __init__(self, size: int, positions: PositionScheme) -> None:
        super().__init__()
        self.size = size
        self.positions = positions


def self_attention_inputs(
    positional: PositionScheme,
    positions: Tensor,
    key_positions: Tensor,
    key_tokens: Tensor | None,
    causal: bool,
    window: int = 0,
) -> tuple[Mask, Callable[[Tensor], Tensor], Tensor | None]:
    """What every self-attention layer of a stack needs, computed once per forward.

    Args:
        positions: (B, Tq) positions of the queries.
        key_positions: (B, Tk) positions of the keys (Tk > Tq when decoding with a cache).
        key_tokens: (B, Tk) bool, True for real key tokens; None when nothing is padded.
        causal: whether query i may only see keys up to its own place in the sequence.
        window: when > 0, a query sees only keys fewer than `window` positions behind it.

    Returns:
        The mask (boolean, broadcastable to (B, h, Tq, Tk); `CAUSAL`; or None), the rotation applied
        to queries and keys, and the additive score bias (B, h, Tq, Tk) or None.
    """
    queries, keys = positions.size(1), key_positions.size(1)
    mask = padded_keys(key_tokens)
    if causal and queries > 1:  # a single newest query may see every key
        order = CAUSAL if mask is None and queries == keys else causal_mask(queries, keys, positions.device)
        mask = order if mask is None else mask & order
    if window:
        near = window_mask(positions, key_positions, window)
        mask = near if mask is None else materialize(mask, queries, keys, positions.device) & near
    return mask, positional.rotation(positions), positional.bias(positions, key_positions)


def check_tokens(tokens: Tensor, mask: Tensor | None, max_positions: int, offset: int = 0) -> None:
    """Raises a ShapeError unless tokens is (B, T) integer with T + offset <= max_positions."""
    if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int, torch.int32):
        raise ShapeError(f"expected token ids of shape (batch, length) and integer dtype, got "
                         f"{tuple(tokens.shape)} {tokens.dtype}; add a batch dimension with tokens[None]")
    if mask is not None and (mask.shape != tokens.shape or mask.dtype != torch.bool):
        raise ShapeError(f"the mask must be bool of the tokens' shape {tuple(tokens.shape)}, "
                         f"got {tuple(mask.shape)} {mask.dtype}; build it with attn.core.masks.padding_mask")
    if tokens.size(1) + offset > max_positions:
        raise ShapeError(f"{tokens.size(1) + offset} positions exceed the model's max_positions="
                         f"{max_positions}; truncate the input or use a model with more positions")


def token_positions(tokens: Tensor, mask: Tensor | None) -> Tensor:
    """(B, T) tokens, (B, T) bool mask or None -> (B, T) long positions: 0..T-1, or `positions_from_mask`."""
    if mask is None:
        b, t = tokens.shape
        return torch.arange(t, device=tokens.device).expand(b, t)
    return positions_from_mask(mask)


def empty_cache(attn: SelfAttention, layers: int, batch: int, max_length: int) -> KVCache:
    """A KV cache for `layers` layers like `attn`: sized by its key/value heads, in its weights' dtype (float32
    for int8 weights, which compute in float32; a LoRA layer's base's) and on their device."""
    weight = (attn.qkv.base if isinstance(attn.qkv, LoRALinear) else attn.qkv).weight
    dtype = weight.dtype if weight.is_floating_point() else torch.float32
    return KVCache(layers, batch, attn.kv_heads, max_length, attn.head_dim, dtype, weight.device)

"""The decoder-only model: a causal language model (GPT-style).

Embeddings -> N x Block with a causal mask -> final norm -> vocabulary projection; the blocks are the encoder's,
only the mask differs. Some layers may attend over a sliding window (Mistral, Gemma): each block reads the
attention inputs of its kind, full or windowed, all computed once per forward.

Departures from the paper: none in the parts; the paper has no decoder-only model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from attn.core.attention import NO_CACHE, KVSlot
from attn.core.blocks import (
    Block,
    SlidingWindow,
    check_tokens,
    empty_cache,
    self_attention_inputs,
    token_positions,
)
from attn.core.kv_cache import KVCache
from attn.core.layers import Embeddings
from attn.core.masks import positions_from_mask


class Decoder(nn.Module):
    """Causal LM over one token sequence."""

    def __init__(
        self,
        embeddings: Embeddings,
        blocks: list[Block],
        final_norm: nn.Module,
        lm_head: nn.Linear,
        max_positions: int,
        window: SlidingWindow | None = None,
        sliding: Sequence[bool] = (),
    ) -> None:
        """`window`: what the layers flagged in `sliding` (one flag per block) attend with."""
        super().__init__()
        self.embeddings = embeddings
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.max_positions = max_positions
        self.windows = nn.ModuleList([window] if window is not None else [])
        self.views = tuple(int(flag) for flag in sliding) or (0,) * len(blocks)  # index into the inputs

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens (B, T) long, mask (B, T) bool (True = real) -> next-token logits (B, T, vocab).

        Positions count real tokens only, so a left-padded row scores as if alone."""
        check_tokens(tokens, mask, self.max_positions)
        positions = token_positions(tokens, mask)
        x = self._blocks(tokens, positions, positions, mask, [NO_CACHE] * len(self.blocks))
        return self.lm_head(x)

    def new_cache(self, batch: int, max_length: int) -> KVCache:
        """An empty cache for `batch` rows of up to `max_length` tokens, on the model's device."""
        return empty_cache(self.blocks[0].attn, len(self.blocks), batch, max_length)

    def decode_step(
        self, tokens: Tensor, cache: KVCache, mask: Tensor | None = None, last_only: bool = False
    ) -> Tensor:
        """Appends tokens (B, T) to the cache and returns their logits (B, T, vocab), or with `last_only` only the
        last position's (B, 1, vocab), all a prefill needs. The first call may pass a whole left-padded prompt, later
        calls one token per row."""
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
        check_tokens(tokens, mask, self.max_positions, offset=cache.length)
        positions = cache.next_positions() + positions_from_mask(mask)  # (B, T)
        key_positions, key_tokens = cache.extend(positions, mask)
        x = self._blocks(tokens, positions, key_positions, key_tokens, cache.slots)
        return self.lm_head(x[:, -1:] if last_only else x)

    def _blocks(
        self, tokens: Tensor, positions: Tensor, key_positions: Tensor, key_tokens: Tensor | None,
        slots: Iterable[KVSlot],
    ) -> Tensor:
        x = self.embeddings(tokens, positions)  # (B, T, d_model)
        full = self_attention_inputs(self.embeddings.positions, positions, key_positions, key_tokens, causal=True)
        windowed = [
            self_attention_inputs(w.positions, positions, key_positions, key_tokens, causal=True, window=w.size)
            for w in self.windows
        ]
        inputs = [full, *windowed]
        for block, slot, view in zip(self.blocks, slots, self.views):
            x = block(x, *inputs[view], slot)
        return self.final_norm(x)


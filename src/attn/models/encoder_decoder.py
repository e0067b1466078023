"""The paper's model: an encoder-decoder Transformer (section 3, figure 1).

The encoder maps source tokens to a memory (B, S, d_model); the decoder attends causally to its own previous
outputs and to the memory, and a linear projection (tied to the embeddings when configured, section 3.4) gives
next-token logits. `new_cache` computes the cross-attention keys and values once per source for `decode_step`.

Departures from the paper: the final LayerNorm of each stack, the output bias and the other presets' choices are
config options; the paper's presets turn them off.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from attn.core.attention import NO_CACHE, KVSlot
from attn.core.blocks import (
    DecoderBlock,
    check_tokens,
    empty_cache,
    self_attention_inputs,
    token_positions,
)
from attn.core.kv_cache import KVCache
from attn.core.layers import Embeddings
from attn.core.masks import key_mask, padded_keys, positions_from_mask
from attn.models.encoder import EncoderStack


class EncoderDecoder(nn.Module):
    """Encoder stack, decoder stack and output projection."""

    def __init__(
        self,
        encoder: EncoderStack,
        embeddings: Embeddings,
        blocks: list[DecoderBlock],
        final_norm: nn.Module,
        lm_head: nn.Linear,
        max_positions: int,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.embeddings = embeddings
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.max_positions = max_positions

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src (B, S) long, src_mask (B, S) bool -> memory (B, S, d_model)."""
        return self.encoder(src, src_mask)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None
    ) -> Tensor:
        """tgt (B, T) decoder input, memory (B, S, d_model) -> logits (B, T, vocab).

        tgt_mask (B, T) bool marks the real tokens. Right padding (what `attn.data.collate` builds) needs no mask:
        under the causal mask no real token sees a pad, so the fused causal kernel applies. Other (left) padding is
        masked out of attention and positions count real tokens only, so a padded row scores as it would alone.
        """
        check_tokens(tgt, tgt_mask, self.max_positions)
        positions = token_positions(tgt, tgt_mask)
        memory_kv = [block.cross.memory_kv(memory) for block in self.blocks]
        memory_mask = padded_keys(src_mask)
        slots = [NO_CACHE] * len(self.blocks)
        key_tokens = tgt_mask if _padded_before_tokens(tgt_mask) else None
        x = self._blocks(tgt, positions, positions, key_tokens, memory_kv, memory_mask, slots)
        return self.lm_head(x)

    def forward(
        self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None
    ) -> Tensor:
        """Teacher-forced logits (B, T, vocab) for source src (B, S) and decoder input tgt (B, T)."""
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    def new_cache(self, memory: Tensor, src_mask: Tensor | None, max_length: int) -> KVCache:
        """A cache for decoding up to `max_length` tokens per row, holding the memory's keys/values."""
        cache = empty_cache(self.blocks[0].attn, len(self.blocks), memory.size(0), max_length)
        cache.memory = [block.cross.memory_kv(memory) for block in self.blocks]
        cache.memory_mask = None if src_mask is None else key_mask(src_mask)
        return cache

    def decode_step(self, tgt: Tensor, cache: KVCache) -> Tensor:
        """Appends decoder inputs tgt (B, T) to the cache; returns their logits (B, T, vocab)."""
        mask = torch.ones_like(tgt, dtype=torch.bool)
        check_tokens(tgt, mask, self.max_positions, offset=cache.length)
        positions = cache.next_positions() + positions_from_mask(mask)
        key_positions, key_tokens = cache.extend(positions, mask)
        x = self._blocks(tgt, positions, key_positions, None, cache.memory, cache.memory_mask, cache.slots)
        return self.lm_head(x)

    def _blocks(
        self, tgt: Tensor, positions: Tensor, key_positions: Tensor, key_tokens: Tensor | None,
        memory_kv: list[tuple[Tensor, Tensor]], memory_mask: Tensor | None, slots: Iterable[KVSlot],
    ) -> Tensor:
        x = self.embeddings(tgt, positions)  # (B, T, d_model)
        attn_mask, rotate, bias = self_attention_inputs(
            self.embeddings.positions, positions, key_positions, key_tokens, causal=True
        )
        for block, kv, slot in zip(self.blocks, memory_kv, slots):
            x = block(x, attn_mask, rotate, bias, kv, memory_mask, slot)
        return self.final_norm(x)


def _padded_before_tokens(mask: Tensor | None) -> bool:
    """Whether some row has padding before a real token (the one check that reads the mask on the host).

    A compiled training step skips it: its batches come right-padded, and a data-dependent branch would split its
    graph."""
    if mask is None or torch.compiler.is_compiling():
        return False
    return bool((mask[:, 1:] & ~mask[:, :-1]).any())

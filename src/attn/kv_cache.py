"""An explicit, preallocated key/value cache for decoder self-attention.

Lifecycle: a model's `new_cache(batch, max_length)` allocates it (and, for the encoder-decoder,
computes every layer's cross-attention keys and values once per source); each `decode_step`
appends the new tokens' keys and values; `reorder` follows beam search; `reset` empties it for
reuse with the same shapes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attn.errors import GenerationError


class _Slot:
    """One layer's view of the cache; `update` is what `SelfAttention` calls."""

    def __init__(self, cache: KVCache, layer: int) -> None:
        self.cache = cache
        self.layer = layer

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Writes k, v (B, h, T, d_k) at the cache's current step; returns all keys/values so far."""
        c = self.cache
        c.keys[self.layer, :, :, c.start : c.length] = k
        c.values[self.layer, :, :, c.start : c.length] = v
        return c.keys[self.layer, :, :, : c.length], c.values[self.layer, :, :, : c.length]


class KVCache:
    """Keys and values of every past token, for every self-attention layer.

    Also keeps each cached token's position and whether it is real (False for left padding),
    so positions and masks of later steps can be built from the cache alone. `memory` holds the
    cross-attention keys/values of an encoder-decoder (one pair per layer) and `memory_mask`
    the source padding mask (B, 1, 1, S).
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        max_length: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (layers, batch, heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.zeros(batch, max_length, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, max_length, dtype=torch.bool, device=device)
        self.slots = [_Slot(self, i) for i in range(layers)]
        self.memory: list[tuple[Tensor, Tensor]] = []
        self.memory_mask: Tensor | None = None
        self.vocab_t: Tensor | None = None
        self.vocab_bias: Tensor | None = None
        self.start = 0
        self.length = 0

    @property
    def max_length(self) -> int:
        return self.keys.size(3)

    @property
    def batch(self) -> int:
        return self.keys.size(1)

    def extend(self, positions: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Records T new tokens' positions and mask, (B, T) each, and opens their slots.

        Returns:
            Positions (B, L + T) and token mask (B, L + T) of every cached token, new ones included.
        """
        new = positions.size(1)
        if self.length + new > self.max_length:
            raise GenerationError(
                f"the KV cache holds {self.max_length} tokens and already has {self.length}; "
                f"{new} more do not fit: allocate a longer cache or generate fewer tokens"
            )
        self.start, self.length = self.length, self.length + new
        self.positions[:, self.start : self.length] = positions
        self.mask[:, self.start : self.length] = mask
        return self.positions[:, : self.length], self.mask[:, : self.length]

    def keep_projection(self, projection: torch.nn.Linear) -> None:
        """Keeps a contiguous (d_model, vocab) copy of the output projection for `project`.

        A decode step multiplies one vector per row by the projection: with the usual (vocab, d_model)
        layout that matrix-vector product runs about twice as slow on CPUs as with this copy.
        """
        self.vocab_t = projection.weight.detach().t().contiguous()
        self.vocab_bias = None if projection.bias is None else projection.bias.detach()

    def project(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, vocab) logits through the kept copy of the output projection."""
        logits = x @ self.vocab_t
        return logits if self.vocab_bias is None else logits + self.vocab_bias

    def next_positions(self) -> Tensor:
        """(B, 1): the position of each row's next token (one past its last real token)."""
        return self.mask[:, : self.length].long().sum(-1, keepdim=True)

    def reorder(self, index: Tensor) -> None:
        """Keeps rows `index` (B',) of the batch, e.g. the surviving beams; B' may differ from B."""
        self.keys = self.keys.index_select(1, index)
        self.values = self.values.index_select(1, index)
        self.positions = self.positions.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        self.memory = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory]
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)

    def reset(self) -> None:
        """Forgets every token (keeps the allocation and the memory)."""
        self.start = self.length = 0
        self.mask.zero_()

"""An explicit, preallocated key/value cache for decoder self-attention.

Lifecycle: a model's `new_cache(batch, max_length)` allocates it (and, for the encoder-decoder, computes every
layer's cross-attention keys and values once per source); each `decode_step` appends the new tokens' keys and
values; `follow` keeps up with beam search, `reorder` with sentences that leave the batch; `reset` empties it for
reuse with the same shapes. The rows read the cross-attention memory in equal runs: with B rows and M memory rows,
row i reads memory row i // (B / M), so the beams of one sentence share their source's keys and values instead of
holding copies. Continuous batching changes the rows of a running cache: `stack_rows` joins two caches, `reorder`
drops rows, and `trim_padding` then frees the leading columns that only padding holds.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attn.core.errors import GenerationError
from attn.core.masks import cheap_to_read


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

    Also keeps each cached token's position and whether it is real (False for left padding), so positions and masks
    of later steps can be built from the cache alone. `memory` holds the cross-attention keys/values of an
    encoder-decoder (one pair per layer) and `memory_mask` the source padding mask (B, 1, 1, S).
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
        self._spare: tuple[Tensor, Tensor] | None = None
        self.memory: list[tuple[Tensor, Tensor]] = []
        self.memory_mask: Tensor | None = None
        self.start = 0
        self.length = 0

    @property
    def slots(self) -> list[_Slot]:
        """Each layer's view, made on each call: slots kept by the cache would form a reference cycle with it,
        and its tensors would then be freed only when Python's garbage collector runs, while continuous
        batching makes a new cache whenever rows join."""
        return [_Slot(self, i) for i in range(self.keys.size(0))]

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

    def next_positions(self) -> Tensor:
        """(B, 1): the position of each row's next token (one past its last real token)."""
        return self.mask[:, : self.length].long().sum(-1, keepdim=True)

    def reorder(self, index: Tensor, sources: Tensor | None = None) -> None:
        """Keeps rows `index` (B',) of the batch, e.g. the surviving beams; B' may differ from B.

        `sources` (M',) keeps those rows of the cross-attention memory; None leaves the memory as it is. The filled
        keys and values are copied into a spare buffer that the next reorder reuses: a fresh allocation at every
        beam step costs several times the copy in page faults.

        Raises:
            GenerationError: B' is not a multiple of the memory's rows.
        """
        if self.memory:
            memory_rows = self.memory[0][0].size(0) if sources is None else sources.numel()
            if index.numel() % memory_rows:
                raise GenerationError(f"{index.numel()} rows cannot read {memory_rows} memory rows in equal "
                                      "runs: keep the memory rows of the rows kept (`sources`)")
        self.keys, self.values = self._select_filled(index)
        self.positions = self.positions.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        if sources is not None:
            self.memory = [(k.index_select(0, sources), v.index_select(0, sources)) for k, v in self.memory]
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, sources)

    def follow(self, parents: Tensor) -> Tensor:
        """Row j of the batch continues row `parents[j]` (B,), as `reorder(parents)` would make it, moving the least.

        A row that some new row continues stays where it is and holds the first of them; the rows that no new row
        continues are overwritten, each with a copy of a parent that several new rows continue. The returned `rows`
        (B,) says which row holds new row j: beam search feeds row `rows[j]` beam j's token and reads beam j's scores
        there. On a GPU, where reading which rows to copy would wait for the device, `follow` is `reorder` (rows in
        beam order).

        Raises:
            GenerationError: `parents` is not B rows, or a new row would continue a row of another run of
                cross-attention memory (another sentence's).
        """
        b = parents.numel()
        if b != self.batch:
            raise GenerationError(f"follow keeps the batch's {self.batch} rows, got {b} parents: use reorder")
        if not cheap_to_read(parents):
            self.reorder(parents)
            return torch.arange(b, device=parents.device)
        if self.memory:
            runs = self.memory[0][0].size(0)
            if bool((parents * runs // b != torch.arange(b, device=parents.device) * runs // b).any()):
                raise GenerationError("each new row must continue a row that reads the same cross-attention "
                                      "memory (a beam of its own sentence)")
        by_parent = parents.argsort(stable=True)
        ordered = parents[by_parent]
        repeat = torch.zeros(b, dtype=torch.bool, device=parents.device)
        repeat[by_parent[1:]] = ordered[1:] == ordered[:-1]  # not the first new row of its parent
        continued = torch.zeros(b, dtype=torch.bool, device=parents.device)
        continued[parents] = True
        copies, free = repeat.nonzero().squeeze(1), (~continued).nonzero().squeeze(1)
        rows = parents.clone()
        rows[copies] = free
        sources = parents[copies]
        for target, source in zip(free.tolist(), sources.tolist()):
            for x in (self.keys, self.values):
                x[:, target, :, : self.length].copy_(x[:, source, :, : self.length])
        self.positions[free] = self.positions[sources]
        self.mask[free] = self.mask[sources]
        return rows

    def _select_filled(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """Rows `index` of the keys and values (slots < length), written into the spare buffers."""
        shape = (self.keys.size(0), index.numel(), *self.keys.shape[2:])
        size = math.prod(shape)
        if self._spare is None or self._spare[0].numel() < size:
            self._spare = (self.keys.new_empty(size), self.values.new_empty(size))
        out = tuple(flat[:size].view(shape) for flat in self._spare)
        for old, new in zip((self.keys, self.values), out):
            torch.index_select(old[:, :, :, : self.length], 1, index, out=new[:, :, :, : self.length])
        self._spare = (_whole_buffer(self.keys), _whole_buffer(self.values))
        return out

    def trim_padding(self) -> None:
        """Drops the leading columns that hold padding in every row (left when the longest rows left)."""
        filled = self.mask[:, : self.length].any(0)
        drop = int(filled.long().argmax()) if bool(filled.any()) else self.length
        if drop == 0:
            return
        kept = self.length - drop
        for x in (self.keys, self.values):
            x[:, :, :, :kept] = x[:, :, :, drop : self.length].clone()
        self.positions[:, :kept] = self.positions[:, drop : self.length].clone()
        self.mask[:, :kept] = self.mask[:, drop : self.length].clone()
        self.start = self.length = kept

    def reset(self) -> None:
        """Forgets every token (keeps the allocation and the memory)."""
        self.start = self.length = 0
        self.mask.zero_()


def _whole_buffer(x: Tensor) -> Tensor:
    """The flat buffer that `x` views (x starts at its beginning)."""
    return x.new_empty(0).set_(x.untyped_storage())


def stack_rows(*parts: KVCache, max_length: int) -> KVCache:
    """A new cache of `max_length` columns with the rows of each part (nothing pending), in order.

    Every part's tokens end at the same column, the longest part's length; the columns before a row's own tokens
    are padding (mask False), which attention skips and positions do not count, so every row decodes on as it
    would alone.

    Raises:
        GenerationError: a cache with cross-attention memory (an encoder-decoder's), or max_length too small.
    """
    if any(part.memory for part in parts):
        raise GenerationError("only decoder-only caches can be stacked: an encoder-decoder's rows carry "
                              "their own cross-attention memory")
    length = max(part.length for part in parts)
    if max_length < length:
        raise GenerationError(f"a stacked cache needs room for {length} tokens, max_length={max_length}")
    first = parts[0]
    layers, _, heads, _, head_dim = first.keys.shape
    out = KVCache(layers, sum(part.batch for part in parts), heads, max_length, head_dim, first.keys.dtype,
                  first.keys.device)
    rows = 0
    for part in parts:
        block, begin = slice(rows, rows + part.batch), length - part.length
        out.keys[:, block, :, begin:length] = part.keys[:, :, :, : part.length]
        out.values[:, block, :, begin:length] = part.values[:, :, :, : part.length]
        out.positions[block, begin:length] = part.positions[:, : part.length]
        out.mask[block, begin:length] = part.mask[:, : part.length]
        rows += part.batch
    out.start = out.length = length
    return out

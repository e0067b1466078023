"""Keys and values of token sequences decoded before, reused by the prompts that start with them.

A conversation's next turn renders every earlier message again, so its prompt starts with the tokens of the last
prompt and answer. A `PrefixCache` keeps, per sequence a decoder-only row held when it left its batch, the keys and
values of its tokens; a new prompt starts from those of its longest cached start (`longest_prefix`) and feeds only
the rest (`start_from_prefix`). The keys of a token depend only on the tokens up to it, so any start of a cached
sequence is as good as the sequence. Sliding-window layers read the same cache (their window is a mask over it), so
they reuse it too.

Memory is bounded by `max_bytes`: the least recently used sequences go first, a sequence that extends a cached one
replaces it, and one that a cached sequence already starts with is not kept twice.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from attn.core.kv_cache import KVCache
from attn.models import Decoder

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class CachedPrefix:
    """The keys and values of a prompt's first `length` tokens, (layers, kv_heads, length, head_dim) each."""

    keys: Tensor
    values: Tensor

    @property
    def length(self) -> int:
        return self.keys.size(2)


@dataclasses.dataclass(frozen=True)
class _Entry:
    tokens: Tensor  # (n,) long, on the CPU
    keys: Tensor  # (layers, kv_heads, n, head_dim)
    values: Tensor

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.keys.nbytes + self.values.nbytes


class PrefixCache:
    """Cached token sequences and their keys and values, within a byte budget, least recently used dropped first.

    Args:
        max_bytes: the most bytes the kept keys, values and token ids may take; a sequence larger than this
            is not kept.

    Example:
        >>> import torch
        >>> from attn import build_model, preset
        >>> _ = torch.manual_seed(0)
        >>> model = build_model(preset("char-gpt-tiny")).eval()
        >>> cache = model.new_cache(1, 8)
        >>> with torch.no_grad():
        ...     _ = model.decode_step(torch.tensor([[2, 17, 5, 9]]), cache)
        >>> prefixes = PrefixCache(max_bytes=1 << 20)
        >>> prefixes.keep(cache, 0, [2, 17, 5, 9])
        >>> prefixes.longest_prefix([2, 17, 5, 4, 4]).length, prefixes.longest_prefix([3, 17])
        (3, None)
    """

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # least recent first
        self._added = 0  # the key of the next sequence kept

    def __len__(self) -> int:
        """The sequences kept."""
        return len(self._entries)

    def longest_prefix(self, prompt: Sequence[int]) -> CachedPrefix | None:
        """The keys and values of the longest start of `prompt` that a kept sequence starts with, its last token
        left out (it must be fed to score the next); None when no kept sequence starts with the prompt's first token.
        """
        wanted = torch.tensor(list(prompt[:-1]), dtype=torch.long)
        best, longest = None, 0
        for key, entry in reversed(self._entries.items()):  # the most recent of equally long ones
            length = _common_length(entry.tokens, wanted)
            if length > longest:
                best, longest = key, length
        if best is None:
            return None
        self._entries.move_to_end(best)
        entry = self._entries[best]
        return CachedPrefix(entry.keys[:, :, :longest], entry.values[:, :, :longest])

    def keep(self, cache: KVCache, row: int, tokens: Sequence[int]) -> None:
        """Keeps the keys and values that row `row` of a decoder-only `cache` holds: those of `tokens`' first n
        tokens, n the row's real (unpadded) columns, whose positions are 0..n-1."""
        real = cache.mask[row, : cache.length]
        sequence = torch.tensor(list(tokens[: int(real.sum())]), dtype=torch.long)
        extended = []
        for key, entry in list(self._entries.items()):
            length = _common_length(entry.tokens, sequence)
            if length == len(sequence):  # kept already, as it is or inside a longer sequence
                self._entries.move_to_end(key)
                return
            if length == len(entry.tokens):
                extended.append(key)
        keys, values = (x[:, row, :, : cache.length][:, :, real] for x in (cache.keys, cache.values))
        entry = _Entry(sequence, keys, values)
        if entry.nbytes > self.max_bytes:
            return
        for key in extended:
            self._drop(key)
        self._entries[self._added] = entry
        self._added += 1
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def _common_length(a: Tensor, b: Tensor) -> int:
    """How many leading ids two (n,) id tensors share."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


def start_from_prefix(model: Decoder, prompt: Sequence[int], prefix: CachedPrefix,
                      max_length: int) -> tuple[KVCache, Tensor]:
    """A one-row cache of `max_length` columns that holds `prefix`, then feeds the rest of `prompt` in one step.

    Returns:
        The cache, holding the whole prompt, and the scores of the prompt's next token (1, V), float.
    """
    n = prefix.length
    cache = model.new_cache(1, max_length)
    cache.keys[:, 0, :, :n] = prefix.keys
    cache.values[:, 0, :, :n] = prefix.values
    cache.positions[0, :n] = torch.arange(n, device=cache.positions.device)
    cache.mask[0, :n] = True
    cache.start = cache.length = n
    rest = torch.tensor([list(prompt[n:])], dtype=torch.long, device=cache.keys.device)
    return cache, model.decode_step(rest, cache, last_only=True)[:, -1].float()

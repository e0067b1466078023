"""A language model's training data: one long token stream cut into (input, next-token) windows."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from attn.data.checks import check_at_least
from attn.core.errors import ConfigError, ShapeError

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class LMStream:
    """One long token stream cut into (input, next-token target) windows of `block_size`.

    The stream is held as it is given, in its own integer type: a tensor, or a NumPy array such as the read-only
    memory map of a token cache (`attn.data.token_cache`), so a stream larger than memory works too. Only the
    windows drawn are read, and only they are widened to int64.
    """

    def __init__(self, ids: torch.Tensor | np.ndarray, block_size: int, seed: int = 0) -> None:
        """Hold a stream.

        Args:
            ids: the token stream, shape (N,), integer dtype (a tensor or a NumPy array / memmap).
            block_size: window length T (the model's context).
            seed: seeds the generator that draws training windows.
        """
        self.ids = _id_array(ids)
        check_at_least("block_size", block_size, 1)
        if len(self.ids) < 2:
            raise ConfigError("ids", f"the stream has {len(self.ids)} tokens; give at least 2 to predict one")
        self.block_size = block_size
        self._generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.ids)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw `batch_size` (B) windows at random starts: x = ids[i:i+T], y = ids[i+1:i+T+1], each (B, T) int64."""
        check_at_least("batch_size", batch_size, 1)
        n, t = len(self.ids), self.block_size
        if n < t + 1:
            raise ConfigError("block_size", f"is {t}, but the stream has only {n} tokens; lower it below {n}")
        starts = torch.randint(n - t, (batch_size,), generator=self._generator)
        offsets = starts.numpy()[:, None] + np.arange(t)  # (B, T)
        return _long(self.ids[offsets]), _long(self.ids[offsets + 1])

    def eval_blocks(self, batch_size: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Non-overlapping windows covering the stream: every token after the first is a target once.

        Full windows come in batches of up to `batch_size`; the remainder, if any, comes last as one shorter window.

        Yields:
            (x, y), each of shape (b, T), or (1, r) for the last partial window; int64.
        """
        check_at_least("batch_size", batch_size, 1)
        n_targets = len(self.ids) - 1
        t = self.block_size
        full = n_targets // t
        for first in range(0, full, batch_size):
            rows = min(batch_size, full - first)
            begin, end = first * t, (first + rows) * t
            yield _long(self.ids[begin:end]).view(rows, t), _long(self.ids[begin + 1 : end + 1]).view(rows, t)
        if full * t < n_targets:
            yield _long(self.ids[full * t : -1]).unsqueeze(0), _long(self.ids[full * t + 1 :]).unsqueeze(0)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator's state, to resume the same sequence of training windows."""
        return {"generator": self._generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a state from `state_dict`."""
        self._generator.set_state(state["generator"])


def _id_array(ids: torch.Tensor | np.ndarray) -> np.ndarray:
    """`ids` as a 1-D NumPy integer array that shares its memory."""
    array = ids.numpy() if isinstance(ids, torch.Tensor) and ids.dtype in _INT_DTYPES else ids
    if not isinstance(array, np.ndarray) or array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        shape, dtype = tuple(getattr(ids, "shape", ())), getattr(ids, "dtype", type(ids).__name__)
        raise ShapeError(
            f"ids must be a 1-D integer tensor, got shape {shape} and {dtype}; "
            "pass torch.tensor(tokenizer.encode(text), dtype=torch.long) or a 1-D integer NumPy array"
        )
    return array


def _long(ids: np.ndarray) -> torch.Tensor:
    """A copy of some ids (a window, a batch of windows) as an int64 tensor."""
    return torch.from_numpy(np.array(ids, dtype=np.int64))

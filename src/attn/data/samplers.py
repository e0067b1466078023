"""Batches of examples of similar length under a token budget: `TokenBudgetSampler` for training and validation,
`length_batches` for a batch of texts to embed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attn.data.checks import check_at_least
from attn.core.errors import CheckpointError, ConfigError


def budget_batches(order: Sequence[int], lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """`order` cut greedily into batches of at most `max_rows` rows and `max_tokens` padded size (rows x longest).

    A row longer than `max_tokens` forms a batch of its own.

    Example:
        >>> budget_batches([0, 1, 2, 3], [2, 3, 3, 9], max_rows=8, max_tokens=9)
        [[0, 1, 2], [3]]
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, lengths[i])
        if batch and (len(batch) + 1 > max_rows or (len(batch) + 1) * grown > max_tokens):
            batches.append(batch)
            batch, grown = [], lengths[i]
        batch.append(i)
        longest = grown
    if batch:
        batches.append(batch)
    return batches


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices in batches of similar length: sorted shortest first, then cut by `budget_batches`."""
    return budget_batches(sorted(range(len(lengths)), key=lengths.__getitem__), lengths, max_rows, max_tokens)


class TokenBudgetSampler:
    """Batches of example indices under a token budget, in a fresh order every epoch.

    Examples are sorted by length (the longer side, then source, then target) and cut greedily into batches whose
    padded size `n_sentences * longest` stays within `max_tokens` on both sides and whose size stays within
    `max_sentences`. The batches are formed once; each epoch visits all of them in an order drawn from (seed,
    epoch). An example longer than `max_tokens` on its own still forms a batch of one, so nothing is lost silently:
    run `attn.data.collate.filter_long` first to bound lengths. `state_dict` records (epoch, position) so that
    training resumes mid-epoch exactly.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        max_sentences: int,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        """Form the batches.

        Args:
            src_lengths: token count of each example's source, as padded in the batch.
            tgt_lengths: the same for targets: with `attn.data.collate.collate_translation`, length + 1 (bos or eos).
            max_tokens: budget per side for `n_sentences * longest` (the paper: ~25,000).
            seed: seeds the order of batches and of equal-length examples.
            shuffle: False keeps the batches in length order every epoch (for evaluation).
        """
        if len(src_lengths) != len(tgt_lengths):
            counts = f"has {len(tgt_lengths)} entries, src_lengths {len(src_lengths)}"
            raise ConfigError("tgt_lengths", f"{counts}; give one length per example on both sides")
        check_at_least("max_tokens", max_tokens, 1)
        check_at_least("max_sentences", max_sentences, 1)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._batches = self._form_batches(src_lengths, tgt_lengths, max_tokens, max_sentences)
        self._order: tuple[int, list[list[int]]] | None = None  # (epoch, its batches), drawn once per epoch

    def _form_batches(
        self, src: Sequence[int], tgt: Sequence[int], max_tokens: int, max_sentences: int
    ) -> list[list[int]]:
        # Equal-length examples are ordered at random so batches do not follow the corpus order.
        tie = np.random.default_rng(self.seed).permutation(len(src)) if self.shuffle else range(len(src))
        order = sorted(range(len(src)), key=lambda i: (max(src[i], tgt[i]), src[i], tgt[i], tie[i]))
        return budget_batches(order, [max(pair) for pair in zip(src, tgt, strict=True)], max_sentences, max_tokens)

    def __len__(self) -> int:
        return len(self._batches)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of one (0-based) epoch, in that epoch's order; together they hold every example once."""
        if not self.shuffle:
            return list(self._batches)
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self._batches))
        return [self._batches[i] for i in order]

    def draw(self) -> tuple[int, list[int]]:
        """Deliver (its epoch, example indices) of the next batch; after an epoch's last one, move to the next."""
        epoch = self.epoch
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.epoch_batches(epoch))
        batch = self._order[1][self.position]
        self.position += 1
        if self.position >= len(self._batches):
            self.epoch, self.position = epoch + 1, 0
        return epoch, batch

    def state_dict(self) -> dict[str, int]:
        """The epoch and the number of its batches already delivered."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from a `state_dict` taken with the same lengths and settings.

        Raises:
            CheckpointError: the state does not fit this sampler.
        """
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0:
            raise CheckpointError(
                f"sampler state {state!r} needs non-negative integers 'epoch' and 'position'; "
                "pass what state_dict returned"
            )
        if not 0 <= position < max(len(self._batches), 1):
            raise CheckpointError(
                f"sampler state position {position} is outside the {len(self._batches)} batches of "
                "an epoch; resume with the same data and batching settings"
            )
        self.epoch, self.position = epoch, position

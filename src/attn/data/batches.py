"""What the trainer consumes: micro-batches, and the stateful sources that deal them to ranks.

The trainer knows nothing about tasks. A task turns its data into `Batch`es: the positional inputs of one model
method (the task's "head": `forward`, `classify` or `mlm_logits`), the class ids those logits are scored against,
and two counts. A `BatchSource` deals this rank's share of every global batch, in an order fixed by a seed, and
can save and restore its position so that a resumed run continues with exactly the batch it would have seen.

Sharding: every rank draws the same global batch and keeps its own rows (`rows[rank::world]`), so a run on N
ranks sees the same examples per update as a one-process run with the same global batch sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from attn.data.lm_stream import LMStream
from attn.data.samplers import TokenBudgetSampler
from attn.core.errors import ConfigError


@dataclass
class Batch:
    """One micro-batch.

    Attributes:
        inputs: positional arguments of the task's model method, e.g. (src, tgt_in, src_mask, tgt_mask).
        targets: class ids scored against that method's logits, shape (...) matching logits (..., V);
            the task's ignore id marks positions that are not scored.
        n_targets: scored positions (known before the forward: the loss normaliser).
        n_tokens: input tokens processed, for throughput.
        weight: 1, or 0 for a stand-in that only joins the all-reduce (see `stand_in`).
    """

    inputs: tuple[Tensor, ...]
    targets: Tensor
    n_targets: int
    n_tokens: int
    weight: float = 1.0

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on `device`."""
        inputs = tuple(t.to(device, non_blocking=True) for t in self.inputs)
        return dataclasses.replace(self, inputs=inputs, targets=self.targets.to(device, non_blocking=True))

    def stand_in(self) -> Batch:
        """A copy that scores nothing (weight 0), for a rank whose share of a global batch is empty.

        The rank still runs the forward and backward pass, so it joins the gradient all-reduce, but adds zero to
        the loss and to the gradient.
        """
        return dataclasses.replace(self, n_targets=0, n_tokens=0, weight=0.0)


class BatchSource(Protocol):
    """An endless, seeded supply of this rank's micro-batches whose position can be saved."""

    def next_batch(self) -> Batch:
        """This rank's share of the next global micro-batch."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position, as plain data (numbers, strings, tensors)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state_dict`."""
        ...


class IndexedBatches:
    """Batches of dataset indices from a `TokenBudgetSampler`, epoch after epoch.

    A global batch with fewer examples than ranks leaves some ranks without rows; they get a stand-in copy of its
    first example that scores nothing (`Batch.stand_in`), so every rank still takes part in the update and the
    result equals the one-process run.
    """

    def __init__(
        self,
        sampler: TokenBudgetSampler,
        make_batch: Callable[[Sequence[int], int], Batch],
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Deal the sampler's batches.

        Args:
            sampler: decides the global batches and their order; its state is this source's state.
            make_batch: (example indices, epoch) -> Batch; the epoch lets a task draw fresh random choices
                (masked-LM masks) every epoch, reproducibly.
        """
        if len(sampler) == 0:
            raise ConfigError("data.train", "the training set yields no batches; check the file and max_length")
        self.sampler = sampler
        self.make_batch = make_batch
        self.rank = rank
        self.world_size = world_size

    def next_batch(self) -> Batch:
        epoch, indices = self.sampler.draw()
        share = indices[self.rank :: self.world_size]
        if not share:
            return self.make_batch(indices[:1], epoch).stand_in()
        return self.make_batch(share, epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


class WindowBatches:
    """Random (input, next-token) windows of a language-model stream."""

    def __init__(self, stream: LMStream, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        """Deal `batch_size` windows per global batch.

        Args:
            stream: the training stream; its generator's state is this source's state.
            batch_size: windows per global batch (at least `world_size`).
        """
        if batch_size < world_size:
            raise ConfigError("batch.batch_size", f"is {batch_size}, below the {world_size} ranks; raise it")
        self.stream = stream
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size

    def next_batch(self) -> Batch:
        x, y = self.stream.sample(self.batch_size)  # (B, T) each
        return lm_batch(x[self.rank :: self.world_size], y[self.rank :: self.world_size])

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


def lm_batch(x: Tensor, y: Tensor) -> Batch:
    """A language-model batch: inputs x (B, T), next-token targets y (B, T), every target scored."""
    return Batch((x,), y, y.numel(), x.numel())

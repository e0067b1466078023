"""The CPU thread count of training: pinned, or chosen by measurement while a time-budgeted run trains.

PyTorch runs every CPU kernel on all physical cores, and its OpenMP threads spin while they wait for
each other at the end of a kernel. On an idle machine that is the fastest setting. When another
process holds a core, a thread of ours is descheduled mid-kernel and the others spin until it runs
again: on 2 cores with one busy process the quickstart's translation step took 790-830 ms on 2
threads and 320-420 ms on one (270 ms on 2 threads when idle; benchmarks/results/issue22-small-cpu).

`train.threads` = N pins N threads for the training loop. `train.threads` = 0 ("auto") lets a run
that has a time budget (`train.max_minutes`), on the CPU, in one process, measure its own updates:
it times `PROBE_STEPS` updates at each candidate count (all cores, then halves down to one; seconds
per input token, their median), trains on the fastest, and measures again after `REVISIT_S` seconds
of training, so it follows the machine's load; when updates are slow (a round of measurement took
more than a tenth of that), it waits `ROUND_SHARE` times the round instead, so that measuring the
slower counts costs at most about a tenth of the budget. A run without a time budget keeps torch's
count, because a different thread count changes the last bits of a matmul and so the weights: such
a run gives the same numbers every time (a time-budgeted run does not anyway: the clock decides its
learning rate and its last step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Iterator

import torch

PROBE_STEPS = 3  # updates timed at each candidate count; their median decides
REVISIT_S = 60.0  # seconds of training on the chosen count before measuring again, at least
ROUND_SHARE = 10.0  # and at least this many times the last round of measurement took


def candidate_counts(threads: int) -> tuple[int, ...]:
    """The counts `auto` tries, fastest on an idle machine first: `threads`, then halves down to one.

    >>> candidate_counts(2), candidate_counts(12)
    ((2, 1), (12, 6, 3, 1))
    """
    counts = [threads]
    while counts[-1] > 1:
        counts.append(max(1, counts[-1] // 2))
    return tuple(counts)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The outcome of one round of measurement: the count chosen and each count's tokens per second."""

    threads: int
    tokens_per_s: dict[int, float]

    def record(self) -> dict[str, object]:
        """The metrics-log fields of this choice."""
        rates = {str(count): round(rate, 1) for count, rate in self.tokens_per_s.items()}
        return {"threads": self.threads, "threads_tokens_per_s": rates}


class ThreadChooser:
    """Measures seconds per token at each candidate count in turn and settles on the fastest.

    `observe` is told of every update (its seconds and input tokens) and says which count the next
    update runs on; it returns a `Choice` when a round of measurement ends. It never calls torch
    (`threads_for_training` applies its counts), so its decisions are tested on made-up timings.
    """

    def __init__(self, counts: tuple[int, ...], probe_steps: int = PROBE_STEPS, revisit_s: float = REVISIT_S) -> None:
        if not counts or probe_steps < 1:
            raise ValueError("a thread chooser needs at least one count and one probe step")
        self.counts, self.probe_steps, self.revisit_s = counts, probe_steps, revisit_s
        self.threads = counts[0]
        self._queue = list(counts)  # counts still to measure in this round, the current one first
        self._samples: list[float] = []
        self._rates: dict[int, float] = {}
        self._round_s = 0.0  # seconds of the round being measured
        self._settled_for = 0.0
        self._settle_s = revisit_s

    def observe(self, seconds: float, tokens: int) -> Choice | None:
        """Records one update that ran on `self.threads`; afterwards `self.threads` is the next update's count."""
        if not self._queue:  # settled: train on, and measure again after _settle_s
            self._settled_for += seconds
            if self._settled_for >= self._settle_s:
                self._queue = [self.threads, *(n for n in self.counts if n != self.threads)]
            return None
        self._round_s += seconds
        self._samples.append(seconds / max(tokens, 1))
        if len(self._samples) < self.probe_steps:
            return None
        self._rates[self._queue.pop(0)] = 1.0 / statistics.median(self._samples)
        self._samples = []
        if self._queue:
            self.threads = self._queue[0]
            return None
        self.threads = max(self._rates, key=self._rates.__getitem__)
        self._settled_for, self._settle_s = 0.0, max(self.revisit_s, ROUND_SHARE * self._round_s)
        self._round_s = 0.0
        choice = Choice(self.threads, dict(sorted(self._rates.items(), reverse=True)))
        self._rates = {}
        return choice


@contextlib.contextmanager
def threads_for_training(setting: int, adaptive: bool) -> Iterator[Callable[[float, int], Choice | None]]:
    """Runs the block on `setting` threads (0: torch's count) and restores torch's count afterwards.

    Yields the function the loop calls after each update with its seconds and input tokens: with
    `setting` 0 and `adaptive`, a `ThreadChooser`'s `observe` that also moves torch to the count
    it picks for the next update (returning its `Choice` at the end of a round); otherwise a no-op.
    """
    before = torch.get_num_threads()
    if setting:
        torch.set_num_threads(setting)
    chooser = ThreadChooser(candidate_counts(before)) if adaptive and not setting and before > 1 else None

    def after_update(seconds: float, tokens: int) -> Choice | None:
        if chooser is None:
            return None
        choice = chooser.observe(seconds, tokens)
        if chooser.threads != torch.get_num_threads():
            torch.set_num_threads(chooser.threads)
        return choice

    try:
        yield after_update
    finally:
        torch.set_num_threads(before)

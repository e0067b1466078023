"""The CPU thread count of training: pinned, or chosen by a probe before a time-budgeted run trains.

PyTorch runs every CPU kernel on all physical cores, and its OpenMP threads spin while they wait for each other at
the end of a kernel: the fastest setting on an idle machine. When another process holds a core, a thread of ours
is descheduled mid-kernel and the others spin until it runs again, so fewer threads can be far faster
(`benchmarks/results/threads/`).

`train.threads` = N pins N threads for the training loop. 0 ("auto") keeps torch's count, except in a run with a
time budget (`train.max_minutes`) in one CPU process: before its first update the run's set-up
(`attn.training.machine`) lets `probe_threads` time passes of one batch at each candidate count, and the run trains
on the count with the shortest median pass. A run without a time budget keeps torch's count, because another count
changes the last bits of the sums and so the weights: such a run gives the same numbers every time (a
time-budgeted run does not anyway: the clock decides its learning rate and its last step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import torch

PROBE_PASSES = 3  # passes timed at each candidate count; their median decides
K = TypeVar("K")


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
class ThreadChoice:
    """The count the probe chose and the median seconds of a pass at each count it tried."""

    threads: int
    seconds: dict[int, float]

    def record(self) -> dict[str, object]:
        """The metrics-log fields of this choice."""
        return {"threads": self.threads,
                "threads_probe_ms": {str(count): round(1e3 * s, 1) for count, s in self.seconds.items()}}


def time_in_turn(runs: Mapping[K, Callable[[], object]], passes: int = PROBE_PASSES) -> dict[K, float]:
    """The median seconds of each of `runs` over `passes` timed calls, the runs taken in rotation (A B A B ...)
    so that a changing load slows them alike, after one untimed call each (lazy initialisation, fresh memory)."""
    for run in runs.values():
        run()
    samples: dict[K, list[float]] = {key: [] for key in runs}
    for _ in range(passes):
        for key, run in runs.items():
            started = time.perf_counter()
            run()
            samples[key].append(time.perf_counter() - started)
    return {key: statistics.median(times) for key, times in samples.items()}


def probe_threads(run_pass: Callable[[], object], counts: tuple[int, ...], passes: int = PROBE_PASSES) -> ThreadChoice:
    """Times `run_pass` at each count (`time_in_turn`) and picks the count of the shortest median; torch's
    thread count is restored afterwards."""

    def at(count: int) -> Callable[[], object]:
        def run() -> object:
            torch.set_num_threads(count)
            return run_pass()

        return run

    before = torch.get_num_threads()
    try:
        seconds = time_in_turn({count: at(count) for count in counts}, passes)
    finally:
        torch.set_num_threads(before)
    return ThreadChoice(min(seconds, key=seconds.__getitem__), seconds)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Runs the block on `count` CPU threads (0: torch's count) and restores torch's count afterwards."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)

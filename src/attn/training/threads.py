"""The CPU thread count of training: pinned, or chosen by measurement while a time-budgeted run trains.

PyTorch runs every CPU kernel on all physical cores, and its OpenMP threads spin while they wait for
each other at the end of a kernel. On an idle machine that is the fastest setting. When another
process holds a core, a thread of ours is descheduled mid-kernel and the others spin until it runs
again: on 2 cores with one busy process the quickstart's translation step took 790-830 ms on 2
threads and 320-420 ms on one (270 ms on 2 threads when idle; benchmarks/results/issue22-small-cpu).

The cores can also be used another way: split each batch's rows between two threads that train
on their halves at the same time, each on half of the cores (`attn.training.cores`); on 2 cores that
keeps each kernel on one core and the threads meet once a batch.

`train.threads` = N pins N threads for the training loop, and `train.workers` = W >= 2 splits the
rows into W parts (N // W threads each) for the whole run. `train.threads` = 0 ("auto") lets a run
that has a time budget (`train.max_minutes`), uncompiled, on the CPU, in one process, measure its
own updates: it times `PROBE_STEPS` updates at each candidate `Layout` (all cores; all cores as two
row halves, left out when `train.workers` = 1; then halves of the cores down to one), taking the
layouts in turn update by update (seconds per input token, their median), trains on the fastest,
and measures again after `REVISIT_S` seconds of training, so it follows the machine's load; when
updates are slow (a round of measurement took more than a tenth of that), it waits `ROUND_SHARE`
times the round instead, so that measuring the slower layouts costs at most about a tenth of the
budget. A run without a time budget keeps torch's count and the whole batch, because another
thread count or split changes the last bits of the sums and so the weights: such a run gives the
same numbers every time (a time-budgeted run does not anyway: the clock decides its learning rate
and its last step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attn.training.cores import CoreSplit

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
class Layout:
    """How the training loop uses the CPU: `workers` threads, each training on its share of a batch's rows
    (`attn.training.cores`; 1 = the whole batch at once), each running torch's kernels on `threads` threads."""

    threads: int
    workers: int = 1

    def __str__(self) -> str:
        return str(self.threads) if self.workers == 1 else f"{self.workers}x{self.threads}"


def candidate_layouts(threads: int, split: bool = True) -> tuple[Layout, ...]:
    """The layouts `auto` tries: all `threads` on the whole batch, the rows split between two halves of
    them (unless `split` is False: `train.workers` = 1), then fewer threads (`candidate_counts`).

    >>> [str(layout) for layout in candidate_layouts(2)], [str(layout) for layout in candidate_layouts(8)]
    (['2', '2x1', '1'], ['8', '2x4', '4', '2', '1'])
    >>> [str(layout) for layout in candidate_layouts(2, split=False)]
    ['2', '1']
    """
    counts = candidate_counts(threads)
    split = (Layout(threads // 2, 2),) if split and threads >= 2 else ()
    return (Layout(counts[0]), *split, *(Layout(count) for count in counts[1:]))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The outcome of one round of measurement: the layout chosen and each layout's tokens per second."""

    layout: Layout
    tokens_per_s: dict[Layout, float]

    def record(self) -> dict[str, object]:
        """The metrics-log fields of this choice."""
        rates = {str(layout): round(rate, 1) for layout, rate in self.tokens_per_s.items()}
        return {"threads": self.layout.threads, "workers": self.layout.workers, "threads_tokens_per_s": rates}


class ThreadChooser:
    """Measures seconds per token at each candidate layout, taking them in turn update by update, and
    settles on the fastest.

    A round runs the layouts in rotation (A B C A B C ...) until each has `probe_steps` updates, as
    the benchmarks alternate their contenders: a machine whose speed changes during the round (other
    programs, the run's first updates filling the optimizer's state and memory) then slows every
    layout alike instead of the one measured at that moment. `observe` is told of every update (its
    seconds and input tokens) and says which layout the next update runs on; it returns a `Choice`
    when a round of measurement ends. It never calls torch (`threads_for_training` applies its
    layouts), so its decisions are tested on made-up timings.
    """

    def __init__(self, layouts: tuple[Layout, ...], probe_steps: int = PROBE_STEPS, revisit_s: float = REVISIT_S) -> None:
        if not layouts or probe_steps < 1:
            raise ValueError("a thread chooser needs at least one layout and one probe step")
        self.layouts, self.probe_steps, self.revisit_s = layouts, probe_steps, revisit_s
        self.layout = layouts[0]
        self._round = list(layouts)  # the round's rotation, the current layout first; empty when settled
        self._samples: dict[Layout, list[float]] = {}
        self._round_s = 0.0  # seconds of the round being measured
        self._settled_for = 0.0
        self._settle_s = revisit_s

    def observe(self, seconds: float, tokens: int) -> Choice | None:
        """Records one update that ran on `self.layout`; afterwards `self.layout` is the next update's."""
        if not self._round:  # settled: train on, and measure again after _settle_s
            self._settled_for += seconds
            if self._settled_for >= self._settle_s:
                self._round = [self.layout, *(n for n in self.layouts if n != self.layout)]
            return None
        self._round_s += seconds
        self._samples.setdefault(self.layout, []).append(seconds / max(tokens, 1))
        pending = [n for n in self._round if len(self._samples.get(n, ())) < self.probe_steps]
        if pending:
            after = self._round[(self._round.index(self.layout) + 1) % len(self._round):] + self._round
            self.layout = next(n for n in after if n in pending)
            return None
        rates = {n: 1.0 / statistics.median(self._samples[n]) for n in self._round}
        self.layout = max(rates, key=rates.__getitem__)
        self._settled_for, self._settle_s = 0.0, max(self.revisit_s, ROUND_SHARE * self._round_s)
        self._round, self._samples, self._round_s = [], {}, 0.0
        return Choice(self.layout, rates)


class CoreUse:
    """The layout the training loop runs on: torch's thread count and the core split of `train_step`.

    `after_update` is called after each update with its seconds and input tokens: with a chooser it
    moves to the layout the chooser picks for the next update (returning its `Choice` at the end of
    a round); without one it does nothing. `split` is the current layout's `CoreSplit`, or None.
    """

    def __init__(self, module: nn.Module, layout: Layout, chooser: ThreadChooser | None) -> None:
        self.module, self.chooser = module, chooser
        self.split: CoreSplit | None = None
        self._splits: dict[Layout, CoreSplit] = {}
        self._apply(chooser.layout if chooser else layout)

    def after_update(self, seconds: float, tokens: int) -> Choice | None:
        if self.chooser is None:
            return None
        choice = self.chooser.observe(seconds, tokens)
        self._apply(self.chooser.layout)
        return choice

    def close(self) -> None:
        for split in self._splits.values():
            split.close()

    def _apply(self, layout: Layout) -> None:
        # The loop's own thread (optimizer, clipping, evaluation) runs while the workers wait: on all of them.
        if layout.threads * layout.workers != torch.get_num_threads():
            torch.set_num_threads(layout.threads * layout.workers)
        if layout.workers > 1 and layout not in self._splits:
            self._splits[layout] = CoreSplit(self.module, layout.workers, layout.threads)
        self.split = self._splits.get(layout)


@contextlib.contextmanager
def threads_for_training(setting: int, workers: int, adaptive: bool, module: nn.Module) -> Iterator[CoreUse]:
    """Runs the block on a layout and restores torch's thread count afterwards.

    Args:
        setting: `train.threads`: the threads of the loop (0: torch's count, or chosen by measurement).
        workers: `train.workers`: the parts a batch's rows are split into (0: 1, or chosen by measurement;
            1 keeps the whole batch but still lets the thread count be measured).
        adaptive: whether "auto" may measure (a time-budgeted, uncompiled run in one CPU process).
        module: whose parameters a core split gives gradients.

    Yields:
        The `CoreUse` of the loop: with `setting` 0, `workers` 0 or 1 and `adaptive`, a `ThreadChooser`
        over `candidate_layouts` picks the layout; otherwise `setting` threads (split between the
        workers) for the whole loop.
    """
    before = torch.get_num_threads()
    threads, parts = setting or before, max(workers, 1)
    measure = adaptive and not setting and workers <= 1 and before > 1
    chooser = ThreadChooser(candidate_layouts(before, split=not workers)) if measure else None
    use = CoreUse(module, Layout(max(1, threads // parts), parts), chooser)
    try:
        yield use
    finally:
        use.close()
        torch.set_num_threads(before)

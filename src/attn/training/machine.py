"""How a run uses this machine: its precision and CPU threads, chosen once at set-up (`choose_machine`).

Rank 0 chooses the precision (`attn.training.precision`; "auto" probes a matmul) and every rank takes its choice.
A resumed run whose config leaves precision to "auto" keeps the precision it started in, so that a probe that
decides otherwise in this process cannot change it mid-run.

Where "auto" chose on the matmul probe's word in a time-budgeted run and bf16 is not emulated, forward and backward
passes of the first batch in fp32 and bf16 decide (`passes_decide`; rank 0's timings count). A run without a time
budget keeps the probe's choice, as it keeps torch's thread count, so that it gives the same numbers every time.
Then a time-budgeted run in one CPU process with `train.threads` = 0 times such passes at each candidate thread
count (`attn.training.threads`). The timed passes leave the data position, generators and gradients as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from attn.core.config import ModelConfig
from attn.data.batches import Batch, BatchSource
from attn.training.config_sections import TrainConfig
from attn.training.distributed import DistContext, all_gather_objects
from attn.training.logs import MetricsLog
from attn.training.precision import (
    Precision,
    PrecisionChoice,
    choose_precision,
    passes_decide,
    probe_shape,
)
from attn.training.rng import capture_rng, restore_rng
from attn.training.threads import (
    ThreadChoice,
    candidate_counts,
    probe_threads,
    time_in_turn,
)
from attn.training.update import Objective, accumulate_gradients


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the set-up chose for the training loop.

    Attributes:
        precision: the precision of the updates, and why.
        threads: the loop's CPU threads (0: torch's count).
        thread_probe: the timings that chose `threads`, or None where no probe ran.
    """

    precision: PrecisionChoice
    threads: int = 0
    thread_probe: ThreadChoice | None = None

    def announce(self, log: MetricsLog, step: int, quiet: bool) -> None:
        """Puts the precision in use (and the probes' figures) in `metrics.jsonl` at `step` and in the log."""
        log.write({"step": step, **self.precision.record()})
        if self.thread_probe is not None:
            log.write({"step": step, **self.thread_probe.record()})
        if self.precision.warning:
            print(f"attn: warning: {self.precision.warning}", file=sys.stderr, flush=True)
        elif not quiet:
            print(f"attn: {self.precision.describe()}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class TrialPasses:
    """Forward and backward passes of the first batch of the run's data, timed before training.

    `module` is the module training calls: the distributed wrapper when there is one.
    """

    module: nn.Module
    objective: Objective
    data: BatchSource
    ctx: DistContext

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[Batch]]:
        """The data's first batch, after whose passes the data position, the generators and the
        gradients are as they were."""
        rng, position = capture_rng(), self.data.state_dict()
        try:
            yield [self.data.next_batch()]
        finally:
            restore_rng(rng)
            self.data.load_state_dict(position)
            self.module.zero_grad(set_to_none=True)

    def run(self, batch: list[Batch], precision: Precision) -> Callable[[], object]:
        """One forward and backward pass of `batch` in `precision`."""
        objective = self.objective.in_precision(self.ctx.device, precision)
        return functools.partial(accumulate_gradients, self.module, objective, batch, self.ctx)


def choose_machine(
    train: TrainConfig, model_config: ModelConfig, trial: TrialPasses, state: Mapping[str, Any] | None = None,
) -> Machine:
    """The precision and thread count of a run's training loop.

    Args:
        model_config: the model, whose shape the matmul probe takes.
        trial: passes of the first batch of the run's data, timed where a time-budgeted run chooses by them.
        state: a resumed run's trainer state (`Trainer.state_dict`), or None for a new run.
    """
    precision = _started_precision(_agreed_precision(train.precision, model_config, trial.ctx), state)
    if precision.wants_passes and train.max_minutes:
        with trial.batch() as batch:
            seconds = time_in_turn({p: trial.run(batch, p) for p in (Precision.FP32, Precision.BF16)})
        choice = passes_decide(precision, seconds[Precision.FP32], seconds[Precision.BF16])
        precision = all_gather_objects(choice, trial.ctx)[0]
    ctx = trial.ctx
    auto = not train.threads and train.max_minutes and ctx.device.type == "cpu" and not ctx.distributed
    if not auto or torch.get_num_threads() == 1:
        return Machine(precision, train.threads)
    with trial.batch() as batch:
        probe = probe_threads(trial.run(batch, precision.used), candidate_counts(torch.get_num_threads()))
    return Machine(precision, probe.threads, probe)


def _agreed_precision(requested: Precision, model_config: ModelConfig, ctx: DistContext) -> PrecisionChoice:
    """The precision of a run: rank 0 decides (probing its device for "auto"), so every rank runs alike."""
    choice = None
    if ctx.is_main:
        choice = choose_precision(requested, ctx.device, probe_shape(model_config.d_model, model_config.d_ff))
    return all_gather_objects(choice, ctx)[0]


def _started_precision(choice: PrecisionChoice, state: Mapping[str, Any] | None) -> PrecisionChoice:
    """`choice`, or for a resumed run that leaves precision to "auto" the precision it started in."""
    if state is None or choice.requested != Precision.AUTO:
        return choice
    started = Precision(state.get("precision", choice.used.value))
    return PrecisionChoice(Precision.AUTO, started, "chosen when the run started; a resumed run keeps it")

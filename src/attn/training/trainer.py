"""One training engine for every task and architecture.

`Trainer.fit` runs the loop (`attn.training.run.train` sets a run up and calls it): updates of
`grad_accum` micro-batches each (`attn.training.update`), periodic evaluation, checkpoints, metrics
and early stopping. The recipe is the paper's (section 5): Adam with beta2 = 0.98 and the
warmup/inverse-square-root schedule, label smoothing 0.1; AdamW with a cosine schedule is there for
GPT/BERT-style runs.

Resuming is exact: the checkpoint holds the optimizer and gradient-scaler states, the step
(which alone fixes the learning rate), every rank's random generators, the data position and
the early-stopping record, so N steps + resume + N steps gives the same losses and weights as
2N steps.

SIGINT and SIGTERM end training after the current update on every rank, with a checkpoint of that
step (`attn.training.signals`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from attn.artifacts.checkpoint import Checkpoint, latest_checkpoint
from attn.core.config import ModelConfig
from attn.data.batches import Batch
from attn.core.errors import CheckpointError, ConfigError, TrainingError
from attn.core.faults import fault_point
from attn.models import Model, build_model, count_parameters
from attn.training.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    full_model_state,
    load_optimizer_state,
    optimizer_state,
    reshard,
    wrap_model,
)
from attn.training.logs import METRICS_FILE, FlopCounter, LogWindow, MetricsLog
from attn.training.precision import (
    Precision,
    PrecisionChoice,
    choose_precision,
    passes_decide,
    probe_shape,
)
from attn.training.retention import save_checkpoint
from attn.training.rng import capture_rng, restore_rng
from attn.training.runconfig import NonFinite, RunConfig, Strategy
from attn.training.schedules import make_schedule
from attn.training.signals import (
    TrainingInterrupted,
    agreed_stop_signal,
    recording_stop_signals,
)
from attn.training.task_data import TaskData
from attn.training.threads import (
    candidate_counts,
    probe_threads,
    time_in_turn,
    torch_threads,
)
from attn.training.update import (
    Objective,
    TaskHead,
    accumulate_gradients,
    autocast_factory,
    batch_loss,
    lr_ratio,
    make_optimizers,
    match_precision,
)

HIGHER_IS_BETTER = {"val_accuracy"}
METRICS = ("val_loss", "val_ppl", "val_accuracy")


@dataclasses.dataclass
class RunResult:
    """What a call of `train` did.

    Attributes:
        run_dir: the run directory.
        step: the number of updates made so far (including those before a resume).
        losses: the per-target training loss of each update made by this call (NaN for a skipped one).
        metrics: the last validation metrics ({} without validation data).
        best_metric: the best value of the tracked validation metric, or None.
        best_step: the step it was reached at, or None.
        checkpoint: the last checkpoint written, or None.
        stopped_early: whether early stopping ended the run.
        tokens_per_s: the input tokens per second of training time of this call's updates (all ranks).
        precision: the precision the updates ran in ("fp32", "bf16" or "fp16").
        device: the device type they ran on ("cpu" or "cuda").
    """

    run_dir: Path
    step: int
    losses: list[float]
    metrics: dict[str, float]
    best_metric: float | None
    best_step: int | None
    checkpoint: Path | None
    stopped_early: bool
    tokens_per_s: float = 0.0
    precision: str = Precision.FP32.value
    device: str = "cpu"

    def summary(self) -> str:
        """One line for people: where the run stopped, the updates, speed and precision of this call,
        its metrics, its best and last checkpoint."""
        speed = (f"{len(self.losses):,} updates in this run at {self.tokens_per_s:,.0f} tokens/s, {self.precision} "
                 f"on {self.device}")
        parts = [f"{'stopped early' if self.stopped_early else 'finished'} at step {self.step} ({speed})"]
        if self.metrics:
            parts.append(", ".join(f"{name} {value:.4g}" for name, value in self.metrics.items()))
        if self.best_step is not None:
            parts.append(f"best at step {self.best_step} ({self.best_metric:.4g})")
        if self.checkpoint is not None:
            parts.append(f"checkpoint {self.checkpoint}")
        return "; ".join(parts)


def agreed_precision(requested: Precision, model_config: ModelConfig, ctx: DistContext) -> PrecisionChoice:
    """The precision of a run: rank 0 decides (probing its device for "auto"), so every rank runs alike."""
    choice = None
    if ctx.is_main:
        choice = choose_precision(requested, ctx.device, probe_shape(model_config.d_model, model_config.d_ff))
    return all_gather_objects(choice, ctx)[0]


# -- the trainer ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Tracker:
    """Early stopping and the best checkpoint: the best value of the metric so far."""

    metric: str
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0

    def update(self, value: float, step: int) -> bool:
        """Records an evaluation; returns whether it is the best so far."""
        better = self.best is None or (value > self.best if self.metric in HIGHER_IS_BETTER else value < self.best)
        if better:
            self.best, self.best_step, self.bad_evals = value, step, 0
        else:
            self.bad_evals += 1
        return better


class Trainer:
    """Runs the updates, evaluations and checkpoints of one run (one instance per rank)."""

    def __init__(self, config: RunConfig, task: TaskData, model: Model, ctx: DistContext = DistContext()) -> None:
        """Wraps the model and builds the optimizers, schedule and logs.

        Args:
            config: the run configuration.
            task: the task's data, model config and head.
            model: the model, already on `ctx.device`.
            ctx: the process context.
        """
        self.config, self.task, self.model, self.ctx = config, task, model, ctx
        train = config.train
        if (train.metric or task.metric) not in METRICS:
            raise ConfigError("train.metric", f"unknown metric {train.metric!r}; choose one of {', '.join(METRICS)}")
        # The module training calls: DDP's wrapper, or the task's head (sharded in place by FSDP2).
        self.wrapped = wrap_model(TaskHead(model, task.head), ctx, train.strategy, find_unused=task.head != "forward")
        self.optimizers = make_optimizers(self.wrapped, config.optim, ctx.device)
        # The rate depends on the step alone, so the step is the whole schedule state: a resumed
        # run follows the schedule of its current config.
        self.schedule = make_schedule(
            config.optim.schedule.value, task.model_config.d_model, config.optim.warmup_steps, train.max_steps,
            config.optim.min_lr_ratio, config.optim.warmup_fraction,
        )
        self.precision = agreed_precision(train.precision, task.model_config, ctx)
        match_precision(self.optimizers, self.precision.used)
        fp16 = self.precision.used == Precision.FP16 and ctx.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
        # `train.compile` compiles the forward pass and the loss as one function (calling DDP's or FSDP2's wrapper).
        self.objective = Objective(self.wrapped, task.ignore_id, train.label_smoothing,
                                   autocast_factory(ctx.device, self.precision.used),
                                   torch.compile(batch_loss) if train.compile else batch_loss)
        self.tracker = _Tracker(train.metric or task.metric)
        self.step = 0
        self.elapsed = 0.0
        self.metrics_log = MetricsLog(Path(config.run_dir) / METRICS_FILE, enabled=ctx.is_main)
        self._saved: tuple[int, Path | None] = (-1, None)
        self._evaluated_step = -1
        layers = task.model_config.encoder_layers + task.model_config.decoder_layers
        peak = train.peak_tflops * 1e12 * ctx.world_size
        self._flops = FlopCounter(count_parameters(model), layers, task.model_config.d_model, peak)

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The trainer state of `trainer_state.pt` (collective: call on every rank)."""
        return {
            "step": self.step,
            "world_size": self.ctx.world_size,
            "optimizer": optimizer_state(self.wrapped, self.optimizers),
            "optimizers": [type(o).__name__ for o in self.optimizers],
            "scaler": self.scaler.state_dict(),
            "rng": all_gather_objects(capture_rng(), self.ctx),
            "data": self.task.train.state_dict(),
            "tracker": dataclasses.asdict(self.tracker),
            "elapsed": self.elapsed,
            "precision": self.precision.used.value,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a state written by `state_dict` (the model's weights are loaded separately).

        Raises:
            CheckpointError: the state was saved with another number of ranks, or by other optimizers.
        """
        if state["world_size"] != self.ctx.world_size:
            raise CheckpointError(
                f"the checkpoint was written by {state['world_size']} processes, this run has {self.ctx.world_size}; "
                f"resume with torchrun --nproc_per_node={state['world_size']}"
            )
        kinds = [type(o).__name__ for o in self.optimizers]
        if state.get("optimizers", kinds) != kinds:
            raise CheckpointError(
                f"the checkpoint's optimizer state is {' + '.join(state['optimizers'])}, this config builds "
                f"{' + '.join(kinds)}; resume with the run's optim.optimizer, or start a new run (--init the checkpoint)"
            )
        load_optimizer_state(self.wrapped, self.optimizers, state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.task.train.load_state_dict(state["data"])
        self.tracker = _Tracker(**state["tracker"])
        self.step, self.elapsed = state["step"], state["elapsed"]
        self._saved = (self.step, latest_checkpoint(self.config.run_dir))
        self.metrics_log.truncate_after(self.step)
        restore_rng(state["rng"][self.ctx.rank])
        self._keep_precision(Precision(state.get("precision", self.precision.used.value)))

    def _keep_precision(self, started: Precision) -> None:
        """A resumed run whose config leaves precision to "auto" keeps the precision it started in, so that
        a probe that decides otherwise in this process (another machine, a busier one) cannot change it
        mid-run; an explicit precision in the config is obeyed."""
        if self.precision.requested == Precision.AUTO:
            self._use_precision(PrecisionChoice(Precision.AUTO, started, "chosen when the run started; a resumed run keeps it"))

    def _use_precision(self, choice: PrecisionChoice) -> None:
        self.precision = choice
        self.objective = dataclasses.replace(self.objective, autocast=autocast_factory(self.ctx.device, choice.used))
        match_precision(self.optimizers, choice.used)

    def _settle_precision(self) -> None:
        """Where "auto" chose on the matmul probe's word in a time-budgeted run and bf16 is not emulated, times
        forward and backward passes of the run's next batch in fp32 and bf16 (every rank runs them; rank 0's
        timings decide) and keeps the faster (`attn.training.precision.passes_decide`). A run without a time
        budget keeps the matmul probe's choice, as it keeps torch's thread count: timings near the bar
        could choose differently from one run to the next, and such a run gives the same numbers every time."""
        if not (self.precision.wants_passes and self.config.train.max_minutes):
            return
        with self._trial_batch() as batch:
            seconds = time_in_turn({
                precision: functools.partial(
                    accumulate_gradients,
                    dataclasses.replace(self.objective, autocast=autocast_factory(self.ctx.device, precision)),
                    batch, self.ctx)
                for precision in (Precision.FP32, Precision.BF16)})
        choice = passes_decide(self.precision, seconds[Precision.FP32], seconds[Precision.BF16])
        self._use_precision(all_gather_objects(choice, self.ctx)[0])

    @contextlib.contextmanager
    def _trial_batch(self) -> Iterator[list[Batch]]:
        """The run's next batch for timed trial passes, after which the data position, the generators and
        the gradients are as they were."""
        rng, position = capture_rng(), self.task.train.state_dict()
        try:
            yield [self.task.train.next_batch()]
        finally:
            restore_rng(rng)
            self.task.train.load_state_dict(position)
            self.wrapped.zero_grad(set_to_none=True)

    # -- the loop ---------------------------------------------------------------------------

    def fit(self) -> RunResult:
        """Trains until `max_steps` or early stopping; evaluates and saves at the end.

        SIGINT or SIGTERM ends training after the current update (on every rank): the trainer
        saves a checkpoint of that step, without evaluating, and raises TrainingInterrupted.

        Raises:
            TrainingInterrupted: a stop signal arrived.
        """
        train = self.config.train
        losses: list[float] = []
        metrics: dict[str, float] = {}
        stopped = False
        window, run = LogWindow(), LogWindow()
        self._settle_precision()
        self._announce_precision()
        with recording_stop_signals() as received, torch_threads(self._thread_count()):
            with self._progress() as bar:
                while self.step < train.max_steps and not stopped and (used := self._budget_used()) < 1.0:
                    if halt := agreed_stop_signal(received, self.ctx):
                        raise TrainingInterrupted(halt, self.step, self._save_once())
                    started = time.perf_counter()
                    stats = self.train_step(used)
                    seconds = time.perf_counter() - started
                    self.elapsed += seconds
                    losses.append(stats.loss)
                    window.add(stats.loss, stats.tokens, seconds)
                    run.add(stats.loss, stats.tokens, seconds)
                    bar.update(self._bar_position() - bar.n)
                    if self.step % train.log_interval == 0 or self.step == train.max_steps:
                        self._log(window.flush(), stats, bar)
                    if train.eval_interval and self.step % train.eval_interval == 0:
                        metrics, stopped = self._evaluate_and_track()
                    if train.checkpoint_interval and self.step % train.checkpoint_interval == 0:
                        self._save_once()
            if self._evaluated_step != self.step:
                metrics, stopped = self._evaluate_and_track(stopped)
            checkpoint = self._save_once()
        tracker = self.tracker
        run_dir = Path(self.config.run_dir)
        return RunResult(run_dir, self.step, losses, metrics, tracker.best, tracker.best_step, checkpoint, stopped,
                         run.flush()["tokens_per_s"], self.precision.used.value, self.ctx.device.type)

    def _announce_precision(self) -> None:
        """Puts the precision in use (and the probe's figures) in the log and `metrics.jsonl`."""
        if not self.ctx.is_main:
            return
        self.metrics_log.write({"step": self.step, **self.precision.record()})
        if self.precision.warning:
            print(f"attn: warning: {self.precision.warning}", file=sys.stderr, flush=True)
        elif not self.config.train.quiet:
            print(f"attn: {self.precision.describe()}", file=sys.stderr, flush=True)

    def _thread_count(self) -> int:
        """The loop's CPU threads: `train.threads`, or for auto in a time-budgeted single CPU process the
        count `probe_threads` finds fastest on the run's next batch (0: torch's count; see
        `attn.training.threads`). The probe leaves the data position, generators and gradients as they were."""
        train, ctx = self.config.train, self.ctx
        auto = not train.threads and train.max_minutes and ctx.device.type == "cpu" and not ctx.distributed
        if not auto or torch.get_num_threads() == 1:
            return train.threads
        with self._trial_batch() as batch:
            choice = probe_threads(lambda: accumulate_gradients(self.objective, batch, ctx),
                                   candidate_counts(torch.get_num_threads()))
        self.metrics_log.write({"step": self.step, **choice.record()})
        return choice.threads

    def _budget_used(self) -> float:
        """The fraction of `train.max_minutes` spent so far (0 without a time budget).

        Ranks average their clocks, so all of them follow the same learning rate and stop after
        the same step.
        """
        limit = self.config.train.max_minutes
        if not limit:
            return 0.0
        spent = torch.tensor([self.elapsed / (60 * limit)], dtype=torch.float64, device=self.ctx.device)
        spent = all_reduce_sum(spent, self.ctx)
        return spent.item() / self.ctx.world_size

    def train_step(self, budget_used: float = 0.0) -> StepStats:
        """One update of `grad_accum` micro-batches.

        Args:
            budget_used: the fraction of `train.max_minutes` spent (resumed runs included), which
                the schedule may decay with.

        Raises:
            TrainingError: the loss or gradient is not finite and `on_nonfinite` is "stop".
        """
        lr = self.config.optim.lr * self.schedule(self.step, budget_used)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr * lr_ratio(optimizer, self.config.optim)
        batches = [self.task.train.next_batch() for _ in range(self.config.batch.grad_accum)]
        sums, tokens = accumulate_gradients(self.objective, batches, self.ctx, self.scaler.scale)
        fault_point("step")
        self._flops.add(sum(b.inputs[0].size(-1) for b in batches) / len(batches), tokens)
        loss = sums.loss.item() / sums.count.item()
        for optimizer in self.optimizers:
            self.scaler.unscale_(optimizer)
        grad_norm = self._clip()
        problem = "loss" if not math.isfinite(loss) else "gradient norm" if not math.isfinite(grad_norm) else ""
        # A float16 gradient overflow is the scaler's business: it skips that update itself.
        if problem and not (problem == "gradient norm" and self.scaler.is_enabled()):
            self._non_finite(problem, loss if problem == "loss" else grad_norm)
            loss = math.nan
        else:
            for optimizer in self.optimizers:
                self.scaler.step(optimizer)
        self.scaler.update()
        self.wrapped.zero_grad(set_to_none=True)
        self.step += 1
        return StepStats(loss, tokens, grad_norm, lr)

    def _clip(self) -> float:
        clip = self.config.optim.clip
        params = [p for p in self.wrapped.parameters() if p.grad is not None]
        norm = nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _non_finite(self, what: str, value: float) -> None:
        step = self.step + 1
        if self.config.train.on_nonfinite == NonFinite.STOP:
            raise TrainingError(
                f"step {step}: the training {what} is {value}; lower optim.lr, set optim.clip (e.g. 1.0), "
                "or set train.on_nonfinite=skip to drop such updates"
            )
        self.wrapped.zero_grad(set_to_none=True)
        self.metrics_log.write({"step": step, "skipped": what})

    # -- evaluation, checkpoints, logs ------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracy over the validation batches ({} without validation data)."""
        if self.task.valid is None:
            return {}
        limit = self.config.train.eval_batches
        sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)  # nll, count, correct
        self.wrapped.eval()
        with torch.no_grad():
            for i, batch in enumerate(self.task.valid()):
                if limit and i >= limit:
                    break
                batch = batch.to(self.ctx.device)
                (_, nll, count), logits = self.objective(batch)
                fault_point("eval")
                scored = batch.targets != self.task.ignore_id if self.task.ignore_id is not None else True
                correct = ((logits.argmax(-1) == batch.targets) & scored).sum()
                sums += torch.stack([nll, count, correct]).double()
        reshard(self.wrapped)
        self.wrapped.train()
        nll, count, correct = sums.tolist()
        count = max(count, 1.0)
        return {"val_loss": nll / count, "val_ppl": math.exp(min(nll / count, 100.0)), "val_accuracy": correct / count}

    def _evaluate_and_track(self, stopped: bool = False) -> tuple[dict[str, float], bool]:
        """Evaluates, records the metrics, saves a new best checkpoint; returns (metrics, stop now)."""
        self._evaluated_step = self.step
        metrics = self.evaluate()
        if not metrics:
            return metrics, stopped
        self.metrics_log.write({"step": self.step, **metrics})
        if self.tracker.update(metrics[self.tracker.metric], self.step):
            self.save(is_best=True)
        patience = self.config.train.patience
        return metrics, stopped or bool(patience and self.tracker.bad_evals >= patience)

    def save(self, is_best: bool = False) -> Path | None:
        """Writes a checkpoint of the current step (collective; rank 0 writes). Returns its path on rank 0."""
        state = self.state_dict()
        weights = self._export_weights()
        path = None
        if self.ctx.is_main:
            train = self.config.train
            task = self.task
            contents = Checkpoint(weights, task.model_config, self.config.to_dict(), state, task.tokenizer, task.info)
            path = save_checkpoint(self.config.run_dir, self.step, contents, train.keep_last, is_best)
        barrier(self.ctx)
        self._saved = (self.step, path)
        return path

    def _save_once(self) -> Path | None:
        """Saves unless this step is already saved; returns the step's checkpoint (on rank 0)."""
        step, path = self._saved
        return path if step == self.step else self.save()

    def _export_weights(self) -> nn.Module:
        """The unwrapped model, or for sharded FSDP a CPU copy with the gathered weights (on rank 0)."""
        if not (self.ctx.distributed and self.config.train.strategy == Strategy.FSDP):
            return self.model
        state = full_model_state(self.wrapped)
        if not self.ctx.is_main:
            return self.model
        copy = build_model(self.task.model_config)
        copy.load_state_dict({name.removeprefix("model."): tensor for name, tensor in state.items()})
        return copy

    def _log(self, window: dict[str, float], last: StepStats, bar: tqdm) -> None:
        record = {
            "step": self.step,
            "loss": window["loss"],
            "lr": last.lr,
            "grad_norm": last.grad_norm,
            "tokens_per_s": window["tokens_per_s"],
            "elapsed": self.elapsed,
        }
        mfu = self._flops.utilisation(window["seconds"])
        if mfu is not None and self.ctx.device.type == "cuda":
            record["mfu"] = mfu
        self.metrics_log.write(record)
        bar.set_postfix(
            step=self.step, loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
            tok_s=f"{record['tokens_per_s']:.0f}",
        )

    def _bar_position(self) -> float:
        """The progress bar's count: updates, or training seconds capped at the time budget (the last
        update overshoots it, and tqdm cannot draw a count beyond its total)."""
        budget = 60 * self.config.train.max_minutes
        return min(self.elapsed, budget) if budget else self.step

    def _progress(self) -> tqdm:
        """A bar of updates, or of training seconds under a time budget (so that its end and its
        estimate of the time left are the budget's, not those of a step limit it will not reach)."""
        train = self.config.train
        hide = train.quiet or not self.ctx.is_main
        if train.max_minutes:
            return tqdm(
                total=60 * train.max_minutes, initial=self._bar_position(), unit="s", dynamic_ncols=True,
                disable=hide,
                bar_format="{percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]",
            )
        return tqdm(total=train.max_steps, initial=self.step, unit="step", dynamic_ncols=True, disable=hide)


@dataclasses.dataclass(frozen=True)
class StepStats:
    """What one update did: its per-target loss (NaN when skipped), the input tokens on all
    ranks, the gradient norm before clipping, and the learning rate it used."""

    loss: float
    tokens: int
    grad_norm: float
    lr: float

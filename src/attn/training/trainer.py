"""One training engine for every task and architecture.

`Trainer.fit` runs the loop (`attn.training.run.train` sets a run up and calls it): updates of `grad_accum` micro-batches each, periodic
evaluation, checkpoints, metrics and early stopping. The recipe is the paper's (section 5):
Adam with beta2 = 0.98 and the warmup/inverse-square-root schedule, label smoothing 0.1; AdamW
with a cosine schedule is there for GPT/BERT-style runs.

An update's loss is the sum of the label-smoothed losses of all its micro-batches (on all ranks)
divided by their total number of scored targets, so every target weighs the same however the
update was cut into micro-batches and ranks.

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
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from attn.artifacts.checkpoint import Checkpoint, latest_checkpoint
from attn.config import ModelConfig
from attn.data.batches import Batch
from attn.errors import CheckpointError, ConfigError, TrainingError
from attn.faults import fault_point
from attn.models import Model, build_model, count_parameters
from attn.training.allocator import keep_freed_memory
from attn.training.cores import CoreSplit
from attn.training.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    full_model_state,
    gradient_sync,
    load_optimizer_state,
    optimizer_state,
    reshard,
    wrap_model,
)
from attn.training.logs import METRICS_FILE, FlopCounter, LogWindow, MetricsLog
from attn.training.losses import LossSums, label_smoothed_cross_entropy
from attn.training.precision import (
    Precision,
    PrecisionChoice,
    choose_precision,
    probe_shape,
)
from attn.training.retention import save_checkpoint
from attn.training.rng import capture_rng, restore_rng
from attn.training.runconfig import (
    NonFinite,
    OptimConfig,
    Optimizer,
    RunConfig,
    Strategy,
)
from attn.training.schedules import make_schedule
from attn.training.signals import (
    TrainingInterrupted,
    agreed_stop_signal,
    recording_stop_signals,
)
from attn.training.tasks import TaskData
from attn.training.threads import CoreUse, threads_for_training

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


class TaskHead(nn.Module):
    """Routes `forward` to the task's model method, so DDP and FSDP see every call they must hook."""

    def __init__(self, model: Model, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *inputs: Tensor) -> Tensor:
        """The logits of the task's method, e.g. (B, T, vocab) or (B, num_labels)."""
        return getattr(self.model, self.method)(*inputs)


# -- one update -------------------------------------------------------------------------------


def batch_loss(
    engine: nn.Module,
    inputs: tuple[Tensor, ...],
    targets: Tensor,
    smoothing: float,
    ignore_id: int | None,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> tuple[Tensor, Tensor]:
    """The summed smoothed loss and NLL of one micro-batch: the forward pass under `autocast`, then
    the float32 loss. `train.compile` compiles this function whole, so the (B, T, vocab) logits and
    their softmax fuse with the model instead of running as separate kernels."""
    with autocast():
        logits = engine(*inputs)
    loss, nll, _ = label_smoothed_cross_entropy(logits, targets, smoothing, ignore_id)
    return loss, nll


def accumulate_gradients(
    engine: nn.Module,
    batches: Sequence[Batch],
    ignore_id: int | None,
    smoothing: float,
    ctx: DistContext = DistContext(),
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    scale: Callable[[Tensor], Tensor] = lambda loss: loss,
    sync_module: nn.Module | None = None,
    loss_of: Callable[..., tuple[Tensor, Tensor]] = batch_loss,
    split: CoreSplit | None = None,
) -> tuple[LossSums, int]:
    """Forward and backward over the micro-batches of one update, leaving the gradients in `.grad`.

    The gradient is that of (Σ smoothed losses of all micro-batches on all ranks) / (their total
    scored targets): each rank scales its sums by world_size / total because DDP and FSDP
    average gradients over ranks.

    Args:
        engine: the module to call with a batch's inputs (possibly wrapped or compiled).
        batches: this rank's micro-batches of the update.
        ignore_id: the target id not scored, or None.
        smoothing: label smoothing ε.
        ctx: the process context.
        autocast: a factory of the mixed-precision context for the forward pass.
        scale: the gradient scaler's `scale` for float16 training.
        sync_module: the DDP/FSDP module whose gradient all-reduce is skipped on all but the
            last micro-batch (default: `engine`).
        loss_of: `batch_loss`, or its compiled form.
        split: runs each micro-batch in row parts on the CPU's cores (`attn.training.cores`; one process).

    Returns:
        The sums over all ranks (loss, nll, scored targets) and the number of input tokens on all ranks.

    Raises:
        TrainingError: the update has no scored target at all.
    """
    local = torch.tensor([sum(b.n_targets for b in batches)], dtype=torch.float64, device=ctx.device)
    total = int(all_reduce_sum(local, ctx).item())
    if total == 0:
        raise TrainingError("an update has no scored target; check the data (empty targets?) and batch sizes")
    factor = ctx.world_size / total
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss, nll, input tokens
    for i, batch in enumerate(batches):
        batch = batch.to(ctx.device)
        if split is not None:
            loss, nll = split.backward(
                batch, lambda inputs, targets: loss_of(engine, inputs, targets, smoothing, ignore_id, autocast), factor
            )
        else:
            with gradient_sync(sync_module or engine, enabled=i == len(batches) - 1):
                loss, nll = loss_of(engine, batch.inputs, batch.targets, smoothing, ignore_id, autocast)
                loss, nll = loss * batch.weight, nll * batch.weight
                scale(loss * factor).backward()
        sums += torch.stack([loss.detach(), nll.detach(), loss.new_tensor(batch.n_tokens)]).double()
    sums = all_reduce_sum(sums, ctx)
    return LossSums(sums[0], sums[1], torch.tensor(total)), int(sums[2].item())


def autocast_factory(device: torch.device, precision: Precision) -> Callable[[], contextlib.AbstractContextManager]:
    """The forward pass's mixed-precision context for a resolved precision (see `attn.training.precision`).

    bf16 autocast works on a GPU and on a CPU (faster only on processors with bf16 matrix units);
    fp16 needs a GPU's gradient scaler and is a no-op on the CPU.
    """
    if precision in (Precision.FP32, Precision.AUTO) or (precision == Precision.FP16 and device.type != "cuda"):
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == Precision.BF16 else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def agreed_precision(requested: Precision, model_config: ModelConfig, ctx: DistContext) -> PrecisionChoice:
    """The precision of a run: rank 0 decides (probing its device for "auto"), so every rank runs alike."""
    choice = None
    if ctx.is_main:
        choice = choose_precision(requested, ctx.device, probe_shape(model_config.d_model, model_config.d_ff))
    return all_gather_objects(choice, ctx)[0]


def make_optimizer(model: nn.Module, config: OptimConfig, device: torch.device | None = None) -> torch.optim.Optimizer:
    """Adam or AdamW over the model's parameters.

    Weight decay applies to matrices only; biases, LayerNorm gains and other vectors are not decayed.
    The update is torch's fused kernel, on a GPU and on the CPU: one pass over each parameter
    instead of about ten elementwise kernels per tensor (on 2 CPU cores the char LM's optimizer step
    is 2.3x faster; the same update to float32 rounding). Other devices keep the loop.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kind = torch.optim.AdamW if config.optimizer == Optimizer.ADAMW else torch.optim.Adam
    fused = device is not None and device.type in ("cuda", "cpu")
    return kind(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, fused=fused or None)


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
        """Wraps the model and builds the optimizer, schedule and logs.

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
        self.head = TaskHead(model, task.head)
        self.wrapped = wrap_model(self.head, ctx, train.strategy, find_unused=task.head != "forward")
        self.engine = torch.compile(self.wrapped) if train.compile else self.wrapped
        # One process: the whole forward + loss compiles as one graph. Under DDP/FSDP the wrapper's
        # hooks stay outside the trace, so only the module is compiled.
        fuse_loss = train.compile and ctx.world_size == 1
        self.train_engine = self.wrapped if fuse_loss else self.engine
        self.loss_of = torch.compile(batch_loss) if fuse_loss else batch_loss
        self.optimizer = make_optimizer(self.head, config.optim, ctx.device)
        # The rate depends on the step alone, so the step is the whole schedule state: a resumed
        # run follows the schedule of its current config.
        self.schedule = make_schedule(
            config.optim.schedule.value, task.model_config.d_model, config.optim.warmup_steps, train.max_steps,
            config.optim.min_lr_ratio, config.optim.warmup_fraction,
        )
        self.precision = agreed_precision(train.precision, task.model_config, ctx)
        fp16 = self.precision.used == Precision.FP16 and ctx.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
        self.autocast = autocast_factory(ctx.device, self.precision.used)
        self.tracker = _Tracker(train.metric or task.metric)
        self.step = 0
        # The row split of `train_step` on the CPU's cores (`attn.training.cores`): set by `fit` from
        # `train.workers` and the thread measurement, or by a caller that times steps itself.
        self.split: CoreSplit | None = None
        self._may_split()
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
            "optimizer": optimizer_state(self.head, self.optimizer),
            "scaler": self.scaler.state_dict(),
            "rng": all_gather_objects(capture_rng(), self.ctx),
            "data": self.task.train.state_dict(),
            "tracker": dataclasses.asdict(self.tracker),
            "elapsed": self.elapsed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a state written by `state_dict` (the model's weights are loaded separately).

        Raises:
            CheckpointError: the state was saved with another number of ranks.
        """
        if state["world_size"] != self.ctx.world_size:
            raise CheckpointError(
                f"the checkpoint was written by {state['world_size']} processes, this run has {self.ctx.world_size}; "
                f"resume with torchrun --nproc_per_node={state['world_size']}"
            )
        load_optimizer_state(self.head, self.optimizer, state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.task.train.load_state_dict(state["data"])
        self.tracker = _Tracker(**state["tracker"])
        self.step, self.elapsed = state["step"], state["elapsed"]
        self._saved = (self.step, latest_checkpoint(self.config.run_dir))
        self.metrics_log.truncate_after(self.step)
        restore_rng(state["rng"][self.ctx.rank])

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
        self._announce_precision()
        if train.keep_memory and self.ctx.device.type == "cpu":
            keep_freed_memory()
        with recording_stop_signals() as received, self._threads() as cores:
            with self._progress() as bar:
                while self.step < train.max_steps and not stopped and (used := self._budget_used()) < 1.0:
                    if halt := agreed_stop_signal(received, self.ctx):
                        raise TrainingInterrupted(halt, self.step, self._save_once())
                    started = time.perf_counter()
                    self.split = cores.split
                    stats = self.train_step(used)
                    seconds = time.perf_counter() - started
                    self.elapsed += seconds
                    if choice := cores.after_update(seconds, stats.tokens):
                        self.metrics_log.write({"step": self.step, **choice.record()})
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
        self.split = None
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

    def _threads(self) -> contextlib.AbstractContextManager[CoreUse]:
        """`train.threads` and `train.workers` for the loop; auto measures only a time-budgeted run (see `_may_split`)."""
        train = self.config.train
        return threads_for_training(train.threads, train.workers, bool(train.max_minutes) and self._may_split(),
                                    self.head)

    def _may_split(self) -> bool:
        """Whether this run can split its batches between threads (and so measure layouts): one uncompiled
        CPU process. A split asked for where it cannot run is a config error."""
        train, ctx = self.config.train, self.ctx
        possible = not train.compile and ctx.device.type == "cpu" and ctx.world_size == 1
        if train.workers > 1 and not possible:
            raise ConfigError("train.workers", f"{train.workers} workers split batches between the threads of one "
                              "uncompiled CPU process; set it to 0 or 1 with train.compile, a GPU or torchrun")
        return possible

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
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches = [self.task.train.next_batch() for _ in range(self.config.batch.grad_accum)]
        sums, tokens = accumulate_gradients(
            self.train_engine, batches, self.task.ignore_id, self.config.train.label_smoothing, self.ctx,
            self.autocast, self.scaler.scale, self.wrapped, self.loss_of, self.split,
        )
        fault_point("step")
        self._flops.add(sum(b.inputs[0].size(-1) for b in batches) / len(batches), tokens)
        loss = sums.loss.item() / sums.count.item()
        self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip()
        problem = "loss" if not math.isfinite(loss) else "gradient norm" if not math.isfinite(grad_norm) else ""
        # A float16 gradient overflow is the scaler's business: it skips that update itself.
        if problem and not (problem == "gradient norm" and self.scaler.is_enabled()):
            self._non_finite(problem, loss if problem == "loss" else grad_norm)
            loss = math.nan
        else:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return StepStats(loss, tokens, grad_norm, lr)

    def _clip(self) -> float:
        clip = self.config.optim.clip
        params = [p for p in self.head.parameters() if p.grad is not None]
        norm = nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _non_finite(self, what: str, value: float) -> None:
        step = self.step + 1
        if self.config.train.on_nonfinite == NonFinite.STOP:
            raise TrainingError(
                f"step {step}: the training {what} is {value}; lower optim.lr, set optim.clip (e.g. 1.0), "
                "or set train.on_nonfinite=skip to drop such updates"
            )
        self.optimizer.zero_grad(set_to_none=True)
        self.metrics_log.write({"step": step, "skipped": what})

    # -- evaluation, checkpoints, logs ------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracy over the validation batches ({} without validation data)."""
        if self.task.valid is None:
            return {}
        limit = self.config.train.eval_batches
        sums = torch.zeros(4, dtype=torch.float64, device=self.ctx.device)  # loss, nll, count, correct
        self.head.eval()
        with torch.no_grad():
            for i, batch in enumerate(self.task.valid()):
                if limit and i >= limit:
                    break
                batch = batch.to(self.ctx.device)
                with self.autocast():
                    logits = self.engine(*batch.inputs)
                loss, nll, count = label_smoothed_cross_entropy(logits, batch.targets, 0.0, self.task.ignore_id)
                fault_point("eval")
                scored = batch.targets != self.task.ignore_id if self.task.ignore_id is not None else True
                correct = ((logits.argmax(-1) == batch.targets) & scored).sum()
                sums += torch.stack([loss.double(), nll.double(), count.double(), correct.double()])
        reshard(self.head)
        self.head.train()
        loss, nll, count, correct = sums.tolist()
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
        state = full_model_state(self.head)
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

    @contextlib.contextmanager
    def _progress(self) -> Iterator[tqdm]:
        """A bar of updates, or of training seconds under a time budget (so that its end and its
        estimate of the time left are the budget's, not those of a step limit it will not reach)."""
        train = self.config.train
        hide = train.quiet or not self.ctx.is_main
        if train.max_minutes:
            bar = tqdm(
                total=60 * train.max_minutes, initial=self._bar_position(), unit="s", dynamic_ncols=True,
                disable=hide,
                bar_format="{percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]",
            )
        else:
            bar = tqdm(total=train.max_steps, initial=self.step, unit="step", dynamic_ncols=True, disable=hide)
        try:
            yield bar
        finally:
            bar.close()


@dataclasses.dataclass(frozen=True)
class StepStats:
    """What one update did: its per-target loss (NaN when skipped), the input tokens on all
    ranks, the gradient norm before clipping, and the learning rate it used."""

    loss: float
    tokens: int
    grad_norm: float
    lr: float

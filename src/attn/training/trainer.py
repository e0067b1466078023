"""One training engine for every task and architecture.

`Trainer.fit` runs the loop that `attn.training.run.run_training` sets up: updates of `grad_accum` micro-batches
(`attn.training.update`), periodic evaluation, checkpoints, metrics and early stopping. The recipe is the paper's
(section 5): Adam with beta2 = 0.98, the warmup/inverse-square-root schedule and label smoothing 0.1; AdamW with a
cosine schedule serves GPT/BERT-style runs.

Resuming is exact: the checkpoint holds the optimizer and gradient-scaler states, the step (which alone fixes the
learning rate), every rank's random generators, the data position and the early-stopping record, so N steps +
resume + N steps gives the same losses and weights as 2N steps. SIGINT and SIGTERM end training after the current
update on every rank, with a checkpoint of that step (`attn.training.signals`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from attn.artifacts.checkpoint import Checkpoint, latest_checkpoint
from attn.artifacts.lora_runs import LoRARun
from attn.core.errors import CheckpointError, ConfigError, TrainingError
from attn.core.faults import fault_point
from attn.models import Model, build_model, count_parameters
from attn.training.config_sections import NonFinite, Strategy
from attn.training.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    full_model_state,
    load_optimizer_state,
    optimizer_state,
    reshard,
)
from attn.training.logs import (
    METRICS_FILE,
    FlopCounter,
    LogWindow,
    MetricsLog,
    RunResult,
    bar_position,
    progress_bar,
)
from attn.training.machine import Machine
from attn.training.precision import Precision
from attn.training.retention import save_checkpoint
from attn.training.rng import capture_rng, restore_rng
from attn.training.runconfig import RunConfig
from attn.training.schedules import make_schedule
from attn.training.signals import (
    TrainingInterrupted,
    agreed_stop_signal,
    recording_stop_signals,
)
from attn.training.task_data import TaskData
from attn.training.threads import torch_threads
from attn.training.update import (
    Objective,
    accumulate_gradients,
    lr_ratio,
    make_optimizers,
    match_precision,
)

HIGHER_IS_BETTER = {"val_accuracy"}
METRICS = ("val_loss", "val_ppl", "val_accuracy")


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

    def __init__(
        self, config: RunConfig, task: TaskData, model: Model, wrapped: nn.Module, objective: Objective,
        machine: Machine, ctx: DistContext = DistContext(), lora: LoRARun | None = None,
    ) -> None:
        """Builds the optimizers, schedule and logs.

        Args:
            model: the model, already on `ctx.device`.
            wrapped: the module training calls: DDP's wrapper of the task's `TaskForward`, or that module (sharded
                in place by FSDP2) (`attn.training.distributed.wrap_model`).
            machine: the precision and CPU threads chosen for the run (`attn.training.machine`).
            lora: a LoRA run's record: checkpoints hold the adapters alone and name the base.
        """
        self.config, self.task, self.model, self.wrapped, self.machine, self.ctx = (
            config, task, model, wrapped, machine, ctx)
        self.lora = lora
        train = config.train
        if (train.metric or task.metric) not in METRICS:
            raise ConfigError("train.metric", f"unknown metric {train.metric!r}; choose one of {', '.join(METRICS)}")
        self.optimizers = make_optimizers(self.wrapped, config.optim, ctx.device)
        # The rate depends on the step alone, so the step is the whole schedule state: a resumed
        # run follows the schedule of its current config.
        self.schedule = make_schedule(
            config.optim.schedule.value, task.model_config.d_model, config.optim.warmup_steps, train.max_steps,
            config.optim.min_lr_ratio, config.optim.warmup_fraction,
        )
        precision = machine.precision.used
        match_precision(self.optimizers, precision)
        fp16 = precision == Precision.FP16 and ctx.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
        self.objective = objective.in_precision(ctx.device, precision)
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
            "precision": self.machine.precision.used.value,
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

    # -- the loop ---------------------------------------------------------------------------

    def fit(self) -> RunResult:
        """Trains until `max_steps` or early stopping; evaluates and saves at the end.

        Raises:
            TrainingInterrupted: SIGINT or SIGTERM arrived; every rank stopped after the current update, and a
                checkpoint of that step was saved without evaluating.
        """
        train = self.config.train
        losses: list[float] = []
        metrics: dict[str, float] = {}
        stopped = False
        window, run = LogWindow(), LogWindow()
        with recording_stop_signals() as received, torch_threads(self.machine.threads):
            with progress_bar(train, self.step, self.elapsed, hide=train.quiet or not self.ctx.is_main) as bar:
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
                    bar.update(bar_position(train, self.step, self.elapsed) - bar.n)
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
                         run.flush()["tokens_per_s"], self.machine.precision.used.value, self.ctx.device.type)

    def _budget_used(self) -> float:
        """The fraction of `train.max_minutes` spent (0 without a time budget), averaged over the ranks so that all
        of them follow the same learning rate and stop after the same step."""
        limit = self.config.train.max_minutes
        if not limit:
            return 0.0
        spent = torch.tensor([self.elapsed / (60 * limit)], dtype=torch.float64, device=self.ctx.device)
        spent = all_reduce_sum(spent, self.ctx)
        return spent.item() / self.ctx.world_size

    def train_step(self, budget_used: float = 0.0) -> StepStats:
        """One update of `grad_accum` micro-batches; the schedule may decay with `budget_used`, the fraction of
        `train.max_minutes` spent (resumed runs included).

        Raises:
            TrainingError: the loss or gradient is not finite and `on_nonfinite` is "stop".
        """
        lr = self.config.optim.lr * self.schedule(self.step, budget_used)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr * lr_ratio(optimizer, self.config.optim)
        batches = [self.task.train.next_batch() for _ in range(self.config.batch.grad_accum)]
        sums, tokens = accumulate_gradients(self.wrapped, self.objective, batches, self.ctx, self.scaler.scale)
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
                (_, nll, count), logits = self.objective(self.wrapped, batch)
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
            contents = Checkpoint(weights, task.model_config, self.config.to_dict(), state, task.tokenizer, task.info,
                                  chat_template=task.chat_template, lora=self.lora)
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


@dataclasses.dataclass(frozen=True)
class StepStats:
    """What one update did: its per-target loss (NaN when skipped), the input tokens on all
    ranks, the gradient norm before clipping, and the learning rate it used."""

    loss: float
    tokens: int
    grad_norm: float
    lr: float

"""What a run reports: `metrics.jsonl`, throughput over a log window, model-FLOPs utilisation, the
progress bar, and what a call of `train` did (`RunResult`).

Each line of `metrics.jsonl` is one JSON object with a "step": training records (loss, lr,
grad_norm, tokens_per_s, elapsed, and mfu on a GPU when `train.peak_tflops` is set),
validation records (val_loss, val_ppl, val_accuracy) and skipped-update records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attn.training.config_sections import TrainConfig
from attn.training.precision import Precision

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends records to `metrics.jsonl` (a no-op on ranks other than 0)."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drops the records of steps after `step` (written before a crash, redone after resuming)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [record for record in read_metrics(self.path) if record["step"] <= step]
        self.path.write_text("".join(json.dumps(record) + "\n" for record in kept), encoding="utf-8")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a `metrics.jsonl` file, in order; a line that is not one (a torn last line, bytes that
    are not UTF-8) is skipped."""
    records = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


@dataclasses.dataclass
class LogWindow:
    """Training loss and throughput since the last log line."""

    loss_sum: float = 0.0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, loss: float, tokens: int, seconds: float) -> None:
        """Records one update (a skipped update's NaN loss is left out of the mean)."""
        if math.isfinite(loss):
            self.loss_sum += loss
            self.steps += 1
        self.tokens += tokens
        self.seconds += seconds

    def flush(self) -> dict[str, float]:
        """The window's mean loss, tokens per second and duration; starts a new window."""
        out = {
            "loss": self.loss_sum / self.steps if self.steps else math.nan,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
            "seconds": self.seconds,
        }
        self.loss_sum, self.steps, self.tokens, self.seconds = 0.0, 0, 0, 0.0
        return out


def model_flops(n_params: int, n_layers: int, d_model: int, context: int, tokens: int) -> float:
    """Training FLOPs ≈ 6·N per token for the weights plus 12·L·d·T per token for attention scores, over
    `tokens` tokens of sequences `context` long."""
    return (6 * n_params + 12 * n_layers * d_model * context) * tokens


class FlopCounter:
    """Model FLOPs since the last log line, for the model-FLOPs utilisation (MFU)."""

    def __init__(self, n_params: int, n_layers: int, d_model: int, peak_flops: float) -> None:
        """`n_layers` counts encoder plus decoder layers; `peak_flops` is the peak FLOP/s of all accelerators
        together (0 = MFU not reported)."""
        self.n_params, self.n_layers, self.d_model, self.peak = n_params, n_layers, d_model, peak_flops
        self.flops = 0.0

    def add(self, context: float, tokens: int) -> None:
        """Records an update of `tokens` tokens in sequences of mean padded length `context`."""
        self.flops += model_flops(self.n_params, self.n_layers, self.d_model, round(context), tokens)

    def utilisation(self, seconds: float) -> float | None:
        """The MFU over the last `seconds`, or None when no peak is known; starts a new count."""
        flops, self.flops = self.flops, 0.0
        return flops / (seconds * self.peak) if self.peak and seconds else None


def progress_bar(train: TrainConfig, step: int, elapsed: float, hide: bool) -> tqdm:
    """A bar of updates, or of training seconds under a time budget (so that its end and its
    estimate of the time left are the budget's, not those of a step limit it will not reach)."""
    if train.max_minutes:
        return tqdm(
            total=60 * train.max_minutes, initial=bar_position(train, step, elapsed), unit="s", dynamic_ncols=True,
            disable=hide,
            bar_format="{percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]",
        )
    return tqdm(total=train.max_steps, initial=step, unit="step", dynamic_ncols=True, disable=hide)


def bar_position(train: TrainConfig, step: int, elapsed: float) -> float:
    """The progress bar's count: updates, or training seconds capped at the time budget (the last
    update overshoots it, and tqdm cannot draw a count beyond its total)."""
    budget = 60 * train.max_minutes
    return min(elapsed, budget) if budget else step


@dataclasses.dataclass
class RunResult:
    """What a call of `train` did.

    Attributes:
        step: the number of updates made so far (including those before a resume).
        losses: the per-target training loss of each update made by this call (NaN for a skipped one).
        metrics: the last validation metrics ({} without validation data).
        best_metric, best_step: the best value of the tracked validation metric and its step, or None.
        checkpoint: the last checkpoint written, or None.
        tokens_per_s: the input tokens per second of training time of this call's updates (all ranks).
        precision, device: what the updates ran in ("fp32", "bf16" or "fp16") and on ("cpu" or "cuda").
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

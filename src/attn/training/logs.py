"""What a run reports: `metrics.jsonl`, throughput over a log window, model-FLOPs utilisation.

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
    """The records of a `metrics.jsonl` file: its JSON objects, in order.

    A line that is not a JSON object (a torn last line, bytes that are not UTF-8) is skipped.
    """
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
    """Training FLOPs ≈ 6·N per token for the weights plus 12·L·d·T per token for attention scores.

    Forward and backward over `tokens` tokens of sequences `context` long, for a model of
    `n_params` parameters and `n_layers` layers of width `d_model`.
    """
    return (6 * n_params + 12 * n_layers * d_model * context) * tokens


class FlopCounter:
    """Model FLOPs since the last log line, for the model-FLOPs utilisation (MFU)."""

    def __init__(self, n_params: int, n_layers: int, d_model: int, peak_flops: float) -> None:
        """Count for one model.

        Args:
            n_params: trainable parameters.
            n_layers: encoder plus decoder layers.
            d_model: model width.
            peak_flops: the peak FLOP/s of all accelerators together (0 = MFU not reported).
        """
        self.n_params, self.n_layers, self.d_model, self.peak = n_params, n_layers, d_model, peak_flops
        self.flops = 0.0

    def add(self, context: float, tokens: int) -> None:
        """Records an update of `tokens` tokens in sequences of mean padded length `context`."""
        self.flops += model_flops(self.n_params, self.n_layers, self.d_model, round(context), tokens)

    def utilisation(self, seconds: float) -> float | None:
        """The MFU over the last `seconds`, or None when no peak is known; starts a new count."""
        flops, self.flops = self.flops, 0.0
        return flops / (seconds * self.peak) if self.peak and seconds else None

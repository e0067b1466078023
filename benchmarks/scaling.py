"""Case 5: one attention-heavy layer as the sequence grows, our fast path against our reference attention.

The layer is a one-block causal decoder (d_model 256, 4 heads, d_ff 1024, sinusoidal positions, a
256-token vocabulary, no dropout), so attention dominates the work from about T = 1024 on. At
each length, batch 2: the training-step time (forward, backward, AdamW) of both paths, alternated,
and the memory of one more step, measured exactly as tensor bytes by torch's `MemTracker`: the
peak during the step minus the weights, buffers and optimizer state held before it (so:
activations, temporaries and gradients). The exponent k of memory ~ T^k is fitted by least
squares on the log-log points from the third length on, where the gradients (a constant) no
longer dominate (1: linear, 2: quadratic); both series are drawn in `scaling.png`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import nn

from attn.models import build_model
from attn.core.presets import preset
from benchmarks.harness import CaseResult, Contender, Row, Settings, compare, rows_for
from benchmarks.training import Shape, Trainee, TrainingStep, random_batch, train_step

REFERENCE = "attn reference attention"
LENGTHS = (128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (64, 128, 256, 512)
BATCH = 2
MB = 2**20
FIT_FROM_INDEX = 2  # below T = 512 the gradients (about 3 MB, independent of T) dominate the step memory
LAYER = preset("gpt2").replace(
    d_model=256, heads=4, d_ff=1024, decoder_layers=1, vocab_size=256, max_positions=max(LENGTHS),
    positional="sinusoidal", dropout=0.0, attention_dropout=0.0,
)


def _models() -> dict[str, nn.Module]:
    fast = build_model(LAYER, attention="fast")
    reference = build_model(LAYER, attention="reference")
    reference.load_state_dict(fast.state_dict())
    return {"attn": fast, REFERENCE: reference}


def _step_memory(step: TrainingStep) -> float:
    """Peak tensor bytes during one step beyond the weights, buffers and optimizer state held before it."""
    from torch.distributed._tools.mem_tracker import MemTracker

    held = step.held_bytes()
    tracker = MemTracker()
    tracker.track_external(step.module, step.optimizer)
    with tracker:
        step()
    return sum(peak["Total"] for peak in tracker.get_tracker_snapshot("peak").values()) - held


def _steps(models: dict[str, nn.Module], length: int, settings: Settings) -> dict[str, TrainingStep]:
    inputs, targets = random_batch(Shape("gpt2", length, BATCH), LAYER.vocab_size, settings.device)
    return {name: train_step(Trainee(model, model), inputs, targets, settings) for name, model in models.items()}


def fitted_exponent(lengths: Sequence[int], values: Sequence[float]) -> float:
    """The least-squares slope k of log(value) = k log(length) + c, over the lengths from FIT_FROM_INDEX on."""
    import numpy as np

    xs, ys = np.log(lengths[FIT_FROM_INDEX:]), np.log(values[FIT_FROM_INDEX:])
    return float(np.polyfit(xs, ys, 1)[0])


def plot(lengths: Sequence[int], series: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """Draws each series (axis label -> contender -> values) against length, log-log, with fitted slopes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4.2))
    for axis, (label, curves) in zip(axes, series.items()):
        for name, values in curves.items():
            axis.loglog(lengths, values, "o-", label=f"{name} (slope {fitted_exponent(lengths, values):.2f})")
        axis.set_xlabel("sequence length T")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.suptitle(f"One causal decoder layer (d_model {LAYER.d_model}, {LAYER.heads} heads), batch {BATCH}; "
                    f"slopes fitted from T = {lengths[FIT_FROM_INDEX]}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def run(settings: Settings) -> CaseResult:
    """Case 5."""
    lengths = QUICK_LENGTHS if settings.quick else LENGTHS
    models = _models()
    rows: list[Row] = []
    times: dict[str, list[float]] = {name: [] for name in models}
    memory: dict[str, list[float]] = {name: [] for name in models}
    for length in lengths:
        steps = _steps(models, length, settings)
        per_second = compare([Contender(name, step, 1) for name, step in steps.items()], settings)
        found = rows_for(f"T={length} B={BATCH}", "ms/step", {n: [1000 / r for r in v] for n, v in per_second.items()})
        for row in found:
            times[row.contender].append(row.median)
            memory[row.contender].append(_step_memory(steps[row.contender]) / MB)
            row.notes["step memory MB"] = memory[row.contender][-1]
        rows += found
    summary = {f"memory exponent, {name}": fitted_exponent(lengths, values) for name, values in memory.items()}
    summary |= {f"time exponent, {name}": fitted_exponent(lengths, values) for name, values in times.items()}
    summary["exponents fitted over"] = f"T = {lengths[FIT_FROM_INDEX]} .. {lengths[-1]}"
    series = {"training-step time (ms)": times, "step memory (MB)": memory}
    summary["plot"] = str(plot(lengths, series, settings.plot))
    return CaseResult(5, "Scaling with length: one causal decoder layer, fast vs reference attention",
                      "< 1: the fast path is faster (time ratio; memory in the notes)", rows, summary)

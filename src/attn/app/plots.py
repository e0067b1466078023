"""Figures drawn from data they are given: a run's curves from its `metrics.jsonl`, an attention map from
its weights and tokens (`attn.inference.attention_views.attention_of`). Nothing here loads a model (matplotlib is
imported when needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from attn.core.errors import AttnError
from attn.training.logs import METRICS_FILE, read_metrics

PLOTS_DIR = "plots"


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draws the training-loss, validation-metric and learning-rate curves of a run to PNG files.

    Args:
        out_dir: where the PNGs go (default `run_dir/plots`).

    Returns:
        The files written: `loss.png` and `lr.png`, and `validation.png` when the run was evaluated.

    Raises:
        AttnError: the run has no metrics yet.
    """
    metrics_file = Path(run_dir) / METRICS_FILE
    if not metrics_file.is_file():
        raise AttnError(f"{metrics_file}: no such file; plot a run directory that train() has written to")
    records = read_metrics(metrics_file)
    if not records:
        raise AttnError(f"{metrics_file}: holds no metric records; plot a run after at least one logged step")
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    figures = [
        ("loss.png", "training loss (per target)", ["loss"]),
        ("lr.png", "learning rate", ["lr"]),
        ("validation.png", "validation", ["val_loss", "val_accuracy"]),
    ]
    written = []
    for name, title, keys in figures:
        series = {key: _series(records, key) for key in keys}
        series = {key: points for key, points in series.items() if points}
        if series:
            written.append(_draw(out / name, title, series))
    return written


def _series(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric; a step logged twice keeps its last value."""
    points = {record["step"]: record[key] for record in records if key in record and record[key] is not None}
    return sorted(points.items())


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw(path: Path, title: str, series: dict[str, list[tuple[int, float]]]) -> Path:
    plt = _pyplot()
    figure, first_axis = plt.subplots(figsize=(7, 4))
    axes = [first_axis] + [first_axis.twinx() for _ in list(series)[1:]]
    for (key, points), axis, colour in zip(series.items(), axes, ("tab:blue", "tab:orange")):
        steps, values = zip(*points)
        axis.plot(steps, values, color=colour, marker="." if len(points) < 50 else None, label=key)
        axis.set_ylabel(key, color=colour)
    first_axis.set_xlabel("step")
    first_axis.set_title(title)
    first_axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_attention(
    weights: Tensor, queries: Sequence[str], keys: Sequence[str], title: str, out: str | Path
) -> Path:
    """Draws (Tq, Tk) attention weights as a heat map with the tokens on both axes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * len(keys) + 2), max(3.0, 0.3 * len(queries) + 1.5)))
    image = ax.imshow(weights.float().cpu().numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
    ax.set_yticks(range(len(queries)), queries, fontsize=8)
    ax.set_xlabel("attended (keys)")
    ax.set_ylabel("attending (queries)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out

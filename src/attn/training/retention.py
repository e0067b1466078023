"""A run's checkpoints: the step directories, the `latest` and `best` pointers, pruning, and averaging.

`save_checkpoint` writes a step directory in the format of `attn.artifacts.checkpoint`, then the pointers, each
atomically; `average_checkpoints` is the paper's checkpoint averaging (section 6.1).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from attn.artifacts.checkpoint import (
    BEST,
    CHECKPOINTS,
    LATEST,
    Checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_pointer,
    reporting_write_errors,
    step_dirs,
    step_name,
    write_atomically,
)
from attn.core.config import ModelConfig
from attn.core.errors import CheckpointError, ConfigError
from attn.data.files import write_file


def save_checkpoint(
    run_dir: str | Path, step: int, checkpoint: Checkpoint, keep_last: int = 5, is_best: bool = False
) -> Path:
    """Writes `run_dir/checkpoints/step-NNNNNNNN`, points `latest` (and `best`) at it, prunes old ones.

    Keeps the newest `keep_last` checkpoints and the best one. The write is atomic, as in `write_checkpoint`.

    Raises:
        CheckpointError: a weight is NaN or infinite (nothing is written).
        CheckpointWriteError: the disk is full or not writable (nothing is replaced).
    """
    folder = Path(run_dir) / CHECKPOINTS
    with reporting_write_errors(folder / step_name(step)):
        folder.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(folder)
        path = write_atomically(folder / step_name(step), checkpoint)
        _write_pointer(folder, LATEST, path.name)
        if is_best:
            _write_pointer(folder, BEST, path.name)
        _prune(folder, keep_last)
    return path


def _write_pointer(folder: Path, name: str, target: str) -> None:
    write_file(folder / name, lambda out: out.write(f"{target}\n".encode()))


def _remove_leftovers(folder: Path) -> None:
    """Deletes what an interrupted write left behind (only this module writes dot-entries here)."""
    for entry in folder.glob(".*"):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _prune(folder: Path, keep_last: int) -> None:
    keep = {path.name for path in step_dirs(folder)[-keep_last:]}
    best = read_pointer(folder, BEST)
    if best is not None:
        keep.add(best.name)
    for path in step_dirs(folder):
        if path.name not in keep:
            # Renamed first, so an interrupted deletion leaves no half-deleted step directory.
            trash = folder / f".trash-{path.name}"
            os.replace(path, trash)
            shutil.rmtree(trash, ignore_errors=True)


# -- averaging --------------------------------------------------------------------------------


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the weights of several checkpoints of one model (section 6.1), as a state dict in
    the checkpoints' dtypes.

    Raises:
        CheckpointError: no paths, differing model configurations, or an unreadable checkpoint.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average; give at least one checkpoint directory")
    first = load_checkpoint(paths[0])
    sums = {name: t.double() if t.is_floating_point() else t.clone() for name, t in first.model.state_dict().items()}
    for path in paths[1:]:
        other = load_checkpoint(path)
        if other.model_config != first.model_config:
            raise CheckpointError(
                f"{other.path}: model_config differs from {first.path} in "
                f"{config_difference(first.model_config, other.model_config)!r}; average only checkpoints of one run"
            )
        for name, tensor in other.model.state_dict().items():
            if tensor.is_floating_point():
                sums[name] += tensor.double()
    reference = first.model.state_dict()
    return {
        name: (total / len(paths)).to(reference[name].dtype) if total.is_floating_point() else total
        for name, total in sums.items()
    }


def config_difference(a: ModelConfig, b: ModelConfig) -> str:
    """The name of the first field in which two model configurations differ ("" when equal)."""
    left, right = a.to_dict(), b.to_dict()
    return next((name for name in left if left[name] != right[name]), "")


def write_averaged_checkpoint(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Averages checkpoints and writes the result as a weights-only checkpoint at `out` (returned).

    The configurations, tokenizer and task metadata come from the last of `paths`; without a trainer state the
    result is for evaluation and inference, not for resuming.
    """
    averaged = average_checkpoints(paths)
    last = load_checkpoint(paths[-1])
    last.model.load_state_dict(averaged)
    return write_atomically(Path(out), last)


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The newest `n` checkpoints of a run, oldest first (what `attn average` averages).

    Raises:
        ConfigError: n < 1.
        CheckpointError: no such run, or it has fewer than `n` checkpoints.
    """
    if n < 1:
        raise ConfigError("last", f"is {n}; average at least 1 checkpoint (the paper averages the last 5)")
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"{run_dir}: no such run directory; give the run_dir that train() wrote to")
    found = list_checkpoints(run_dir)
    if len(found) < n:
        raise CheckpointError(
            f"{run_dir}: asked to average the last {n} checkpoints, the run has {len(found)}; "
            "average fewer, or keep more with train.keep_last"
        )
    return found[-n:]

"""Checks made before a run trains a tokenizer or builds a model, so nobody waits for a run bound to fail.

`prepare_run_dir` makes sure the run directory can be created and written, and that its disk has room for two
checkpoints (the last one stays while the next is written) and the logs. A checkpoint is estimated as the model's
float32 weights plus Adam's two float32 moments in `trainer_state.pt`, plus a margin.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from attn.core.config import ModelConfig
from attn.core.errors import TrainingError
from attn.models import build_model, count_parameters

BYTES_PER_VALUE = 4  # weights and optimizer moments are stored in float32
VALUES_PER_PARAMETER = 3  # the weight and Adam's first and second moments
CHECKPOINT_MARGIN = 16 * 2**20  # configs, tokenizer, generator and data states
LOG_MARGIN = 64 * 2**20  # metrics.jsonl and plots


def checkpoint_bytes(n_params: int) -> int:
    """The estimated size in bytes of one checkpoint of a model with `n_params` parameters."""
    return VALUES_PER_PARAMETER * BYTES_PER_VALUE * n_params + CHECKPOINT_MARGIN


def required_disk_bytes(n_params: int) -> int:
    """The free bytes a run needs: two checkpoints and the logs."""
    return 2 * checkpoint_bytes(n_params) + LOG_MARGIN


def parameter_count(config: ModelConfig) -> int:
    """The parameters of the model `config` describes (built on the meta device: no memory for the weights)."""
    with torch.device("meta"):
        return count_parameters(build_model(config))


def prepare_run_dir(run_dir: str | Path, config: ModelConfig) -> Path:
    """Creates the run directory and checks that it is writable and that its disk has room for the checkpoints
    of `config`'s model; returns the directory.

    Raises:
        TrainingError: the directory cannot be created or written, or the disk is too full.
    """
    folder = check_run_dir(run_dir)
    check_disk_space(folder, parameter_count(config))
    return folder


def check_run_dir(run_dir: str | Path) -> Path:
    """Creates `run_dir` if needed and writes a temporary file into it.

    Raises:
        TrainingError: it is a file, or it cannot be created or written (the message names the path).
    """
    folder = Path(run_dir)
    if folder.exists() and not folder.is_dir():
        raise TrainingError(
            f"run_dir {folder} is a file, not a directory; set run_dir to a new directory path or move the file"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        culprit = err.filename or folder
        raise TrainingError(
            f"run_dir {folder} cannot be created or written ({err.strerror or err}: {culprit}); choose a run_dir "
            f"in a directory you can write, or fix the permissions of {culprit}"
        ) from err
    return folder


def check_disk_space(run_dir: Path, n_params: int) -> None:
    """Raises a TrainingError unless the disk of `run_dir` has `required_disk_bytes(n_params)` free."""
    needed = required_disk_bytes(n_params)
    free = shutil.disk_usage(run_dir).free
    if free < needed:
        raise TrainingError(
            f"run_dir {run_dir}: its disk has {_size(free)} free, the run needs about {_size(needed)} (two "
            f"checkpoints of {n_params:,} parameters with Adam's moments, and the logs); free some space or set "
            "run_dir on a larger disk"
        )


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"

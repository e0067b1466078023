"""Training runs of the registered tasks: a run config with its task's defaults, trained with its
task's data adapter, and checked against its task's baseline.

The training layer knows no task by name; these functions find the task in the registry
(`attn.app.tasks`) and hand its parts down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.app.guard import BaselineCheck, verdict
from attn.app.tasks import get_task
from attn.artifacts import load_model
from attn.config import ModelConfig
from attn.training import RunResult, read_run_tables
from attn.training import train as train_run
from attn.training.runconfig import RunConfig


def run_config(tables: Mapping[str, Any]) -> RunConfig:
    """A run config from nested tables; a field they leave out takes its task's default
    (`TaskSpec.defaults`), else the dataclass's.

    Raises:
        ConfigError: an unknown task (the message lists the valid ones), or an invalid key or value.
    """
    spec = get_task(tables.get("task", RunConfig.task), trainable=True)
    return RunConfig.from_dict(tables, spec.defaults)


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Reads a TOML run configuration, applies command-line overrides and fills in the task's defaults.

    Args:
        path: the TOML file; a `configs/...` path that the working directory lacks names the
            shipped config (`attn.shipped.locate`).
        overrides: `key=value` or `section.key=value` strings, applied in order.

    Raises:
        ConfigError: the file is missing or not TOML, or a key, value or the task is invalid.

    Example:
        >>> from attn import load_run_config
        >>> config = load_run_config("configs/shakespeare-char-quick.toml", ["optim.lr=1e-3"])
        >>> config.task, config.optim.lr
        ('lm', 0.001)
    """
    return run_config(read_run_tables(path, overrides))


def train(run_config: RunConfig, model_config: ModelConfig | None = None) -> RunResult:
    """Trains the run's task as `run_config` says (`attn.training.train` with the task's data adapter),
    resuming from the run's latest checkpoint if there is one.

    Args:
        run_config: the run configuration.
        model_config: the model to train, instead of `run_config.model` (vocabulary size and
            labels are still set from the data).

    Returns:
        What the run did (on every rank; checkpoint paths only on rank 0).

    Raises:
        ConfigError: an unknown task or invalid settings; see `attn.training.train` for the others.

    Example (two updates of the character-level Shakespeare recipe, from the repository's root):
        >>> import tempfile
        >>> from attn import load_model, load_run_config, train
        >>> run_dir = tempfile.mkdtemp()
        >>> overrides = [f"run_dir={run_dir}", "train.max_steps=2", "optim.warmup_steps=1", "train.quiet=true"]
        >>> config = load_run_config("configs/shakespeare-char-quick.toml", overrides)
        >>> result = train(config)
        >>> result.step, load_model(run_dir, "cpu").task
        (2, 'lm')
    """
    return train_run(run_config, model_config, task_builder=get_task(run_config.task, trainable=True).build)


def check_run(config: RunConfig, result: RunResult) -> tuple[BaselineCheck, str] | None:
    """The baseline check of a finished run on its validation split, and the warning to show ("" when
    it passed); None without validation data, on ranks other than 0, or for a task without a baseline."""
    baseline = get_task(config.task).baseline
    if not config.data.valid or result.checkpoint is None or baseline is None:
        return None
    check = baseline(load_model(result.run_dir, config.train.device), config, result.metrics)
    if check is None:
        return None
    return check, verdict(check, config, result)

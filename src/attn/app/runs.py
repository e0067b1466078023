"""Training runs of the registered tasks: a run config with its task's defaults, trained with its task's data
adapter, and checked against its task's baseline.

The training layer knows no task by name; these functions find the task in the registry (`attn.app.tasks`) and
hand its parts down.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.app.guard import BaselineCheck, verdict
from attn.app.tasks import get_task
from attn.artifacts import load_model
from attn.core.config import ModelConfig
from attn.data.files import write_file
from attn.core.errors import ConfigError
from attn.training import RunResult, read_run_tables, run_training
from attn.training.runconfig import RunConfig, apply_overrides


def run_config(tables: Mapping[str, Any]) -> RunConfig:
    """A run config from nested tables; a field they leave out takes its task's default, else the dataclass's.

    Raises:
        ConfigError: an unknown task, or an invalid key or value.
    """
    spec = get_task(tables.get("task", RunConfig.task), trainable=True)
    return RunConfig.from_dict(tables, spec.defaults)


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Reads a TOML run configuration, applies command-line overrides and fills in the task's defaults.

    Args:
        path: a `configs/...` path that the working directory lacks names the shipped config.
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
    """Trains the run's task as `run_config` says, resuming from the run's latest checkpoint if there is one.

    Args:
        model_config: the model to train, instead of `run_config.model` (vocabulary size and labels are still set
            from the data).

    Returns:
        What the run did (on every rank; checkpoint paths only on rank 0).

    Raises:
        ConfigError: an unknown task or invalid settings; see `attn.training.run_training` for the others.

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
    return run_training(run_config, model_config, task_builder=get_task(run_config.task, trainable=True).build)


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


RUN_FILE = "run.toml"  # the run config `attn train TASK ...` writes into its run directory
DATA_FLAGS = ("train", "valid", "source_field", "target_field", "text_field", "label_field", "text_pair_field")
_NO_STEP_CAP = 1_000_000  # a --minutes run stops on time; the recipe's step count would stop it first


def recipe_tables(task: str) -> dict[str, Any]:
    """The tables of a new run of `task` from its shipped small recipe, without the recipe's data files.

    Raises:
        ConfigError: an unknown task, or one without a recipe.
    """
    spec = get_task(task, trainable=True)
    if not spec.recipe:
        raise ConfigError("task", f"{task!r} has no shipped recipe; write a run config and train it with "
                                  "attn train --config")
    tables = read_run_tables(spec.recipe)
    tables["data"] = {k: v for k, v in tables.get("data", {}).items() if k not in ("train", "valid")}
    return tables


def default_run_dir(task: str) -> str:
    """runs/<task>-<local date>-<time>, e.g. runs/lm-20260101-120000."""
    return f"runs/{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def configure(tables: Mapping[str, Any], data: Mapping[str, str] | None = None, minutes: float | None = None,
              preset: str = "", run_dir: str = "", overrides: Sequence[str] = (), init: str = "") -> RunConfig:
    """A run config from `tables` (a recipe's or a TOML file's) with the settings of `attn train`'s flags, then
    `overrides`, applied, and the task's defaults for what is still left out.

    Args:
        data: `DataConfig` fields to set (`train`, `valid`, `source_field`, ...).
        minutes: a wall-clock budget (`train.max_minutes`); the table's step count stops capping it.
        preset: train a fresh model of this preset: it replaces the whole `[model]` table.
        run_dir: where the run goes ("" keeps the table's).
        init: fine-tune this model (`model.init_from`): it replaces the whole `[model]` table, and its tokenizer
            the recipe's.

    Raises:
        ConfigError: an unknown task, or an invalid key or value.
    """
    if preset and init:
        raise ConfigError("--init", f"give --preset {preset} (a fresh model) or --init {init} (a model to "
                                    "fine-tune), not both")
    out = apply_overrides(tables, ())
    _update(out, "data", data or {})
    if minutes is not None:
        _update(out, "train", {"max_minutes": minutes, "max_steps": _NO_STEP_CAP})
    if preset:
        out["model"] = {"preset": preset}
    if init:
        out["model"] = {"init_from": init}
        out.pop("tokenizer", None)
    if run_dir:
        out["run_dir"] = run_dir
    return run_config(apply_overrides(out, overrides))


def _update(tables: dict[str, Any], section: str, values: Mapping[str, Any]) -> None:
    """Sets `values` in a table; a section that is not a table is left for `RunConfig.from_dict` to report."""
    current = tables.get(section, {})
    if values and isinstance(current, Mapping):
        tables[section] = {**current, **values}


def write_run_config(config: RunConfig, command: str) -> Path:
    """Writes `config` as RUN_DIR/run.toml (atomically), headed by the command that made it.

    `attn train --config RUN_DIR/run.toml` resumes the run; `run_dir=...` starts it afresh elsewhere.
    """
    path = Path(config.run_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {' '.join(command.splitlines())}\n# again: attn train --config {path}\n"
    write_file(path, lambda out: out.write((header + config.to_toml()).encode("utf-8")))
    return path

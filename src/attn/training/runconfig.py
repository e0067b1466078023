"""The run configuration: what to train on, how, and for how long.

A `RunConfig` is a frozen dataclass of sections (`attn.training.config_sections`), read from TOML:

    task = "translation"            # a task of the registry (attn.app.tasks): translation | lm | classification | mlm
    run_dir = "runs/translation"
    [model]     preset = "paper-base", then any ModelConfig field as an override
    [data] [tokenizer] [optim] [batch] [train] [lora]   the fields of DataConfig, TokenizerConfig, OptimConfig, ...

Command-line overrides are `key=value` (top level) or `section.key=value`; the value is read as a TOML value when
it parses as one (`3`, `1e-4`, `true`, `"x"`) and as a plain string otherwise (`data.train=data/x.tsv`). Unknown
keys and wrong types raise a `ConfigError` that names the key as `section.key`.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.core.config import ModelConfig, from_dict, plain_fields
from attn.core.errors import ConfigError
from attn.shipped import locate
from attn.training.config_sections import (
    BatchConfig,
    DataConfig,
    LoRASection,
    ModelSection,
    OptimConfig,
    Optimizer,
    Strategy,
    TokenizerConfig,
    TrainConfig,
)

# Settings that configs written by earlier versions may hold (every run's run.toml lists all fields):
# read, ignored with a warning, so that those runs still train and resume. `section.key` -> why.
REMOVED = {
    "train.workers": "a batch's rows are no longer split between threads",
    "train.keep_memory": "training no longer changes the process's malloc settings",
}

SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "tokenizer": TokenizerConfig,
    "model": ModelSection,
    "optim": OptimConfig,
    "batch": BatchConfig,
    "train": TrainConfig,
    "lora": LoRASection,
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything about a training run except the model's architecture details (see `ModelSection`).

    Example:
        >>> from attn import RunConfig
        >>> config = RunConfig().override("task=lm", "optim.lr=3e-4", "train.max_minutes=5")
        >>> config.task, config.optim.lr, config.train.max_minutes
        ('lm', 0.0003, 5.0)
    """

    task: str = "translation"  # a name of the task registry, checked there (`attn.app.tasks.get_task`)
    run_dir: str = "runs/run"
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    batch: BatchConfig = dataclasses.field(default_factory=BatchConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    lora: LoRASection = dataclasses.field(default_factory=LoRASection)

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise ConfigError("task", f"expected a task name, got {self.task!r}")
        if not isinstance(self.run_dir, str) or not self.run_dir:
            raise ConfigError("run_dir", f"expected a directory path, got {self.run_dir!r}")
        for name, kind in SECTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(name, f"expected a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        if self.optim.optimizer == Optimizer.MUON and self.train.strategy == Strategy.FSDP:
            raise ConfigError("optim.optimizer", "muon orthogonalises whole matrices, which FSDP shards; use "
                              "train.strategy=ddp with muon, or optim.optimizer=adamw with FSDP")
        if self.lora.rank and not self.model.init_from:
            raise ConfigError("lora.rank", "LoRA adapts a pretrained model: set model.init_from (attn train --init "
                              "MODEL), or lora.rank = 0 to train every weight")
        if self.lora.rank and self.train.strategy == Strategy.FSDP:
            raise ConfigError("train.strategy", "LoRA trains with DDP: its adapters are small, so there is nothing "
                              "for FSDP to shard; use train.strategy=ddp")

    def to_dict(self) -> dict[str, Any]:
        """A JSON- and TOML-ready nested dict (enums as their values)."""
        out: dict[str, Any] = {"task": self.task, "run_dir": self.run_dir}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = section.to_dict() if isinstance(section, ModelSection) else plain_fields(section)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]] | None = None) -> RunConfig:
        """Builds a config from nested tables (e.g. a TOML file's); errors name the key as `section.key`.

        `defaults` holds tables of values for the fields `data` leaves out (a task's recipe,
        `attn.app.tasks.TaskSpec.defaults`); a field in neither takes the dataclass's default.
        """
        if not isinstance(data, Mapping):
            raise ConfigError("RunConfig", f"expected a table of fields, got {type(data).__name__}")
        top = {"task", "run_dir", *SECTIONS}
        unknown = sorted(set(data) - top)
        if unknown:
            raise ConfigError(unknown[0], f"unknown key; valid top-level keys and sections: {', '.join(sorted(top))}")
        fields = {key: data[key] for key in ("task", "run_dir") if key in data}
        defaults = defaults or {}
        for name, kind in SECTIONS.items():
            if name in data or name in defaults:
                table = data.get(name, {})
                table = {**defaults.get(name, {}), **table} if isinstance(table, Mapping) else table
                fields[name] = _build_section(name, kind, table)
        return cls(**fields)

    def to_toml(self) -> str:
        """The config as TOML, every field written out: `RunConfig.from_dict(tomllib.loads(text))`
        gives this config back, whatever the task's defaults."""
        tables = self.to_dict()
        lines = [f"{key} = {_toml_value(tables[key])}" for key in ("task", "run_dir")]
        for name in SECTIONS:
            lines += ["", f"[{name}]", *(f"{key} = {_toml_value(value)}" for key, value in tables[name].items())]
        return "\n".join(lines) + "\n"

    def override(self, *items: str) -> RunConfig:
        """A copy with `key=value` / `section.key=value` overrides applied (validated again)."""
        return RunConfig.from_dict(apply_overrides(self.to_dict(), items))

    def model_config(self) -> ModelConfig:
        """The model section's preset with its overrides."""
        return self.model.build()


def read_run_tables(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Reads a TOML run configuration's tables and applies command-line overrides, in order.

    `attn.load_run_config` makes a `RunConfig` of them with the task's defaults. A `configs/...` path that the
    working directory lacks names the shipped config (`attn.shipped.locate`).

    Raises:
        ConfigError: the file is missing or not TOML, or an override is malformed.
    """
    path = locate(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError("config", f"cannot read {path} ({err.strerror}); check the path") from err
    except UnicodeDecodeError as err:
        message = f"{path} is not UTF-8 text (a bad byte at offset {err.start}); re-save it as UTF-8"
        raise ConfigError("config", message) from err
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("config", f"{path} is not valid TOML: {err}") from err
    return apply_overrides(data, overrides)


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of nested config tables with `key=value` / `section.key=value` strings applied."""
    out = {key: dict(value) if isinstance(value, Mapping) else value for key, value in data.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts) or len(parts) > 2:
            raise ConfigError(key or item, f"override {item!r} must look like key=value or section.key=value")
        value = parse_value(text.strip())
        if len(parts) == 1:
            out[parts[0]] = value
            continue
        section, field = parts
        if section not in SECTIONS:
            raise ConfigError(key, f"unknown section {section!r}; valid sections: {', '.join(SECTIONS)}")
        out.setdefault(section, {})[field] = value
    return out


def parse_value(text: str) -> Any:
    """A TOML value (`3`, `1e-4`, `true`, `"x"`, `[1, 2]`), or the text itself when it is none."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def _build_section(name: str, kind: type, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(name, f"expected a [{name}] table, got {type(data).__name__} {data!r}")
    removed = [key for key in data if f"{name}.{key}" in REMOVED]
    for key in removed:
        warnings.warn(f"{name}.{key} is ignored: the setting was removed ({REMOVED[f'{name}.{key}']}); "
                      "delete it from the config", stacklevel=3)
    data = {key: value for key, value in data.items() if key not in removed}
    try:
        return kind.from_dict(data) if kind is ModelSection else from_dict(kind, data)
    except ConfigError as err:
        raise ConfigError(f"{name}.{err.field}", str(err).removeprefix(f"{err.field}: ")) from None


def _toml_value(value: Any) -> str:
    """A TOML literal of a config value (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # 1e-09, inf and nan are TOML too
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_toml_value(item) for item in value)}]"
    raise TypeError(f"no TOML form for {type(value).__name__} {value!r}")

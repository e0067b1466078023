"""`TaskSpec`: everything `attn` knows about one task, in one object.

Training, evaluation, the baseline check after a run and inference find a task's parts here, never by comparing
task names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.app.guard import BaselineCheck
from attn.artifacts import Bundle
from attn.core.config import Architecture, ModelConfig
from attn.decoding import GenerationConfig
from attn.core.errors import ConfigError
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskBuilder, TaskContext, TaskData
from attn.training.trainer import METRICS


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """The options of `attn evaluate`; each task's evaluator reads those that concern it.

    Attributes:
        limit: translation, chat: only the first N sentences or conversations.
        context: language model: the window length in tokens (default: the model's positions).
        stride: language model: a sliding window's step in tokens (default: non-overlapping windows).
    """

    generation: GenerationConfig | None = None
    limit: int | None = None
    context: int | None = None
    stride: int | None = None


Evaluator = Callable[[Bundle, str | Path, EvalOptions], dict[str, Any]]
BaselineOf = Callable[[Bundle, RunConfig, Mapping[str, float]], BaselineCheck | None]
Infer = Callable[[Bundle, Sequence[str]], list[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: how it trains, how it is scored, what it must beat, and how it is used.

    Attributes:
        architecture: the architecture the task trains; None for a task of loaded models only.
        data: the adapter that builds the task's training data, loss head and ignored target id from
            `config.data`; None when the task is not trained.
        metric: the validation metric for early stopping and the best checkpoint (a trainer `METRICS`).
        defaults: run-config tables for the fields a config leaves out (the task's optimizer recipe).
        recipe: the shipped run config for a small CPU run, the defaults of `attn train TASK --train ...`; ""
            when there is none.
        evaluator: the metric of `attn evaluate` on a data file, or None.
        baseline: the check of a finished run's validation score against the task's trivial baseline, or None.
        infer: the inference call: texts -> JSON-ready results, or None.
    """

    name: str
    summary: str
    architecture: Architecture | None = None
    data: TaskBuilder | None = None
    metric: str = "val_loss"
    defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    recipe: str = ""
    evaluator: Evaluator | None = None
    baseline: BaselineOf | None = None
    infer: Infer | None = None

    def __post_init__(self) -> None:
        if (self.data is None) != (self.architecture is None):
            raise ValueError(f"task {self.name!r}: a trained task declares both its architecture and its data")
        if self.metric not in METRICS:
            raise ValueError(f"task {self.name!r}: metric {self.metric!r} is not one of {', '.join(METRICS)}")

    @property
    def trainable(self) -> bool:
        """Whether `attn train` trains this task."""
        return self.data is not None

    def build(self, config: RunConfig, model_config: ModelConfig, ctx: TaskContext) -> TaskData:
        """The task's training data for `config` (a `TaskBuilder`).

        Raises:
            ConfigError: the task is not trained, or the model's architecture is not the task's.
        """
        if self.data is None or self.architecture is None:
            raise ConfigError("task", f"{self.name!r} is a task of loaded models; attn does not train it")
        if model_config.architecture != self.architecture:
            source = config.model.init_from or f"preset {config.model.preset!r}"
            raise ConfigError(
                "model", f"task {self.name!r} trains {self.architecture.value} models, but {source} is "
                f"{model_config.architecture.value}; choose a preset of that architecture (attn presets lists them) "
                "or another model.init_from"
            )
        return dataclasses.replace(self.data(config, model_config, ctx), metric=self.metric)

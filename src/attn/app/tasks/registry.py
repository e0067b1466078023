"""The registered tasks, by name. A new task is a module of this package with its `SPEC`, and one line
in `TASKS` below.

| task | architecture | trained on | validation metric | `attn evaluate` | baseline after a run |
| --- | --- | --- | --- | --- | --- |
| translation | encoder-decoder | source/target fields: TSV, CSV, JSON Lines, text files | val_loss | BLEU, chrF | copying the source |
| lm | decoder-only | text; conversations (`data.format = "chat"`) | val_loss | nats per token/char; BLEU, chrF of a chat file's answers | unigram model (text only) |
| classification | encoder-only | text (+ pair) and label fields: TSV, CSV, JSON Lines | val_accuracy | accuracy, macro-F1 | naive Bayes |
| mlm | encoder-only | text, or a table's text field | val_loss | - | - |
| embedding | encoder-only (bundle) | - | - | - | - |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attn.app.tasks import classification, embedding, lm, mlm, translation
from attn.app.tasks.spec import EvalOptions, TaskSpec
from attn.artifacts import Bundle
from attn.core.errors import AttnError, ConfigError

TASKS: dict[str, TaskSpec] = {
    spec.name: spec for spec in (translation.SPEC, lm.SPEC, classification.SPEC, mlm.SPEC, embedding.SPEC)
}


def task_names(trainable: bool = False) -> list[str]:
    """The registered task names (only those `attn train` trains, when `trainable`)."""
    return [name for name, spec in TASKS.items() if spec.trainable or not trainable]


def get_task(name: str, trainable: bool = False, field: str = "task") -> TaskSpec:
    """The task called `name`.

    Args:
        trainable: refuse a task that `attn train` does not train.
        field: the config field or flag the name came from, for the error.

    Raises:
        ConfigError: no such task (or it is not trained); the message lists the valid names.
    """
    spec = TASKS.get(name) if isinstance(name, str) else None
    choices = ", ".join(repr(n) for n in task_names(trainable))
    if spec is None:
        raise ConfigError(field, f"unknown task {name!r}; choose one of {choices}")
    if trainable and not spec.trainable:
        raise ConfigError(field, f"attn does not train {name!r} models ({spec.summary}); choose one of {choices}")
    return spec


def evaluate(bundle: Bundle, path: str | Path, options: EvalOptions = EvalOptions()) -> dict[str, Any]:
    """Runs the metric of the model's task on a data file (`attn evaluate`); AttnError when it has none."""
    spec = TASKS.get(bundle.task)
    if spec is None or spec.evaluator is None:
        *others, last = [name for name, s in TASKS.items() if s.evaluator is not None]
        raise AttnError(f"no evaluation for task {bundle.task!r}; evaluate {', '.join(others)} or {last} models")
    return spec.evaluator(bundle, path, options)

"""Training: one engine for the three architectures and their tasks.

`run_training` (`run`) sets a run up from a `RunConfig` (`runconfig`, `config_sections`) and a task adapter
(`task_data`, handed down by `attn.app.tasks`), chooses its precision and CPU threads (`machine`) and fits it with
the `Trainer` (`trainer`; one update in `update`); `retention` keeps and averages a run's checkpoints. Only the
commands that train import this package.
"""

from attn.training.logs import RunResult
from attn.training.retention import (
    average_checkpoints,
    last_checkpoints,
    save_checkpoint,
    write_averaged_checkpoint,
)
from attn.training.run import run_training
from attn.training.runconfig import RunConfig, read_run_tables
from attn.training.signals import TrainingInterrupted
from attn.training.trainer import Trainer

__all__ = [
    "RunConfig", "RunResult", "Trainer", "TrainingInterrupted", "average_checkpoints", "last_checkpoints",
    "read_run_tables", "run_training", "save_checkpoint", "write_averaged_checkpoint",
]

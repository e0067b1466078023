"""Training: one engine for the three architectures and their tasks.

`run_training(run_config, task_builder=...)` (`run`) sets a run up and fits it; `runconfig` reads a TOML
run configuration of the sections in `config_sections` (`attn.load_run_config` adds the task's
defaults); `task_data` holds the task adapters, which the task registry (`attn.app.tasks`) hands
down; `machine` chooses the precision (`precision`) and CPU thread count (`threads`) of the loop
before the trainer exists; `trainer` is the loop and `update` one update's loss and gradients,
`signals` stops it cleanly, `retention` keeps a run's checkpoints and averages them, `rng` saves the
random generators, `finetune` starts from a pretrained model.
Only the commands that train import this package.
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

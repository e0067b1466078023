"""Training: one engine for the three architectures and four tasks.

`train(run_config)` is the entry point; `load_run_config` reads a TOML run configuration;
`average_checkpoints` / `write_averaged_checkpoint` average the last checkpoints of a run.
"""

from attn.training.checkpoint import (
    Checkpoint,
    average_checkpoints,
    best_checkpoint,
    last_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    write_averaged_checkpoint,
    write_checkpoint,
)
from attn.training.losses import LossSums, label_smoothed_cross_entropy
from attn.training.runconfig import RunConfig, load_run_config
from attn.training.schedules import Noam, WarmupCosine, make_schedule
from attn.training.logs import read_metrics
from attn.errors import TrainingError
from attn.training.trainer import RunResult, Trainer, train

__all__ = [
    "Checkpoint",
    "LossSums",
    "Noam",
    "RunConfig",
    "RunResult",
    "Trainer",
    "TrainingError",
    "WarmupCosine",
    "average_checkpoints",
    "best_checkpoint",
    "label_smoothed_cross_entropy",
    "last_checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "load_run_config",
    "make_schedule",
    "read_metrics",
    "save_checkpoint",
    "train",
    "write_averaged_checkpoint",
    "write_checkpoint",
]

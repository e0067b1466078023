"""Training: one engine for the three architectures and their tasks.

`train(run_config)` (`run`) sets a run up and fits it; `load_run_config` reads a TOML run
configuration; `trainer` is the loop, `signals` stops it cleanly, `retention` keeps a run's
checkpoints and averages them, `rng` saves the random generators, `finetune` starts from a
pretrained model. Only the commands that train import this package.
"""

from attn.training.retention import (
    average_checkpoints,
    last_checkpoints,
    save_checkpoint,
    write_averaged_checkpoint,
)
from attn.training.run import train
from attn.training.runconfig import RunConfig, load_run_config
from attn.training.signals import TrainingInterrupted
from attn.training.trainer import RunResult, Trainer

__all__ = [
    "RunConfig", "RunResult", "Trainer", "TrainingInterrupted", "average_checkpoints", "last_checkpoints",
    "load_run_config", "save_checkpoint", "train", "write_averaged_checkpoint",
]

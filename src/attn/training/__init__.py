"""Training: one engine for the three architectures and four tasks.

`train(run_config)` is the entry point; `load_run_config` reads a TOML run configuration;
`average_checkpoints` / `write_averaged_checkpoint` average the last checkpoints of a run.

Each name is imported from its module on first use, so that reading a run configuration or a
checkpoint (every `attn` command does one or the other) does not load the trainer and
torch.distributed too.
"""

import importlib
from typing import Any

_MODULES = {
    "attn.training.checkpoint": (
        "Checkpoint", "average_checkpoints", "best_checkpoint", "last_checkpoints", "latest_checkpoint",
        "load_checkpoint", "save_checkpoint", "write_averaged_checkpoint", "write_checkpoint",
    ),
    "attn.training.losses": ("LossSums", "label_smoothed_cross_entropy"),
    "attn.training.runconfig": ("RunConfig", "load_run_config"),
    "attn.training.schedules": ("Noam", "WarmupCosine", "make_schedule"),
    "attn.training.logs": ("read_metrics",),
    "attn.errors": ("TrainingError",),
    "attn.training.trainer": ("RunResult", "Trainer", "TrainingInterrupted", "train"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'attn.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)

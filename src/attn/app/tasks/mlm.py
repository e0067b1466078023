"""Masked language modelling: BERT's pre-training objective with an encoder-only model.

Trains on texts, one per line or the text column of a labelled TSV; it has no evaluation, baseline or inference
call of its own: its checkpoints are starting points for classification (`model.init_from`) or embeddings.
"""

from __future__ import annotations

from attn.app.tasks.spec import TaskSpec
from attn.core.config import Architecture
from attn.training.task_data import mlm_task

SPEC = TaskSpec(
    name="mlm",
    summary="masked-token prediction with an encoder-only model (pre-training)",
    architecture=Architecture.ENCODER_ONLY,
    data=mlm_task,
    # BERT pre-training: AdamW (0.9, 0.999), eps 1e-6, weight decay 0.01, peak 1e-4.
    defaults={
        "optim": {"optimizer": "adamw", "schedule": "cosine", "lr": 1e-4, "beta2": 0.999, "eps": 1e-6,
                  "weight_decay": 0.01, "warmup_steps": 200},
        "train": {"label_smoothing": 0.0},
    },
    recipe="configs/fortunes-mlm.toml",
)

"""Classification: one label per text with an encoder-only model (BERT's fine-tuning).

Trains on the `data.text_field` (and `data.text_pair_field` for pairs) and `data.label_field` of a table, from
the encoder's first-token summary; chooses checkpoints by validation accuracy; scored with accuracy, macro-F1
and the confusion matrix; a run must beat naive Bayes on word counts by 2 accuracy points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.inference.classification import classify
from attn.inference.evaluation import evaluate_classifier
from attn.app.guard import BaselineCheck, classification_check, naive_bayes_scores
from attn.app.tasks.spec import EvalOptions, TaskSpec
from attn.artifacts import Bundle
from attn.core.config import Architecture
from attn.training.runconfig import RunConfig
from attn.training.task_data import classification_task


def _evaluate(bundle: Bundle, path: str | Path, options: EvalOptions) -> dict[str, Any]:
    return evaluate_classifier(bundle, path)


def _baseline(bundle: Bundle, config: RunConfig, metrics: Mapping[str, float]) -> BaselineCheck | None:
    """`val_accuracy` (as the trainer measured it) against naive Bayes trained on the training file."""
    if "val_accuracy" not in metrics:
        return None
    return classification_check(100 * metrics["val_accuracy"], naive_bayes_scores(config, config.data.valid), "valid")


def _infer(bundle: Bundle, texts: Sequence[str]) -> list[dict[str, Any]]:
    return [{"label": p.label, "probability": p.probability} for p in classify(bundle, texts)]


SPEC = TaskSpec(
    name="classification",
    summary="one label per text with an encoder-only model",
    architecture=Architecture.ENCODER_ONLY,
    data=classification_task,
    metric="val_accuracy",
    # BERT fine-tuning (Devlin et al., appendix A.3): AdamW (0.9, 0.999), weight decay 0.01, a small peak.
    defaults={
        "optim": {"optimizer": "adamw", "schedule": "cosine", "lr": 5e-5, "beta2": 0.999, "eps": 1e-8,
                  "weight_decay": 0.01, "warmup_steps": 100},
        "train": {"label_smoothing": 0.0},
    },
    recipe="configs/quickstart-classification.toml",
    evaluator=_evaluate,
    baseline=_baseline,
    infer=_infer,
)

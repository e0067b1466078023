"""Embedding: mean-pooled, L2-normalised sentence vectors from an encoder that was bundle, not trained.

The task of imported sentence encoders (all-MiniLM-L6-v2, BERT directories) and of encoder
checkpoints without a classifier; `attn train` does not train it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attn.inference.classification import embed
from attn.app.tasks.spec import TaskSpec
from attn.artifacts import Bundle


def _infer(bundle: Bundle, texts: Sequence[str]) -> list[dict[str, Any]]:
    return [{"embedding": vector.tolist()} for vector in embed(bundle, texts)]


SPEC = TaskSpec(
    name="embedding",
    summary="sentence embeddings from a loaded encoder (not trained by attn)",
    infer=_infer,
)

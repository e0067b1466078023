"""The metric each task reports on a data file: what `attn evaluate` and the quickstart run.

A test file is read with the fields the model was trained on (`Bundle.fields`): a model trained Spanish ->
English is scored on the `es` -> `en` direction, a sentence-pair classifier on the pairs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from attn.inference.classification import class_probabilities
from attn.inference.continuation import continue_texts
from attn.inference.metrics import (
    accuracy,
    bleu,
    chrf,
    confusion_matrix,
    lm_metrics,
    macro_f1,
    stream_nll,
)
from attn.inference.translation import translate
from attn.artifacts import Bundle
from attn.data.chat_data import read_conversations
from attn.data.readers import load_labelled, load_parallel
from attn.data.text import read_text
from attn.decoding import GenerationConfig
from attn.core.errors import AttnError, ConfigError


def evaluate_translation(
    bundle: Bundle, path: str | Path, config: GenerationConfig | None = None, limit: int | None = None
) -> dict[str, Any]:
    """BLEU and chrF of the model's translations of a file's source field against its target field."""
    _check_positive("limit", limit)
    corpus = load_parallel(path, bundle.fields)
    sources, references = corpus.sources[:limit], corpus.targets[:limit]
    started = time.perf_counter()
    hypotheses = translate(bundle, sources, config)
    return {
        "task": "translation", "file": str(path), "sentences": len(sources),
        **_scores(hypotheses, references, started),
        "examples": [{"source": s, "reference": r, "hypothesis": h}
                     for s, r, h in list(zip(sources, references, hypotheses))[:5]],
    }


def _scores(hypotheses: list[str], references: list[str], started: float) -> dict[str, Any]:
    """BLEU and chrF with their signatures, and the seconds since `started`."""
    b, c = bleu(hypotheses, references), chrf(hypotheses, references)
    return {"bleu": round(b.value, 2), "chrf": round(c.value, 2), "bleu_signature": b.signature,
            "chrf_signature": c.signature, "seconds": round(time.perf_counter() - started, 1)}


def evaluate_chat(
    bundle: Bundle, path: str | Path, config: GenerationConfig | None = None, limit: int | None = None
) -> dict[str, Any]:
    """BLEU and chrF of a chat model's answers against each conversation's last assistant turn, the conversation
    before it given through the model's chat template (a chat file of `attn.data.chat_data`)."""
    _check_positive("limit", limit)
    conversations = read_conversations(path)[:limit]
    prompts, references = [], []
    for conversation in conversations:
        messages = conversation.messages
        last = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
        prompts.append(bundle.render_chat(messages[:last], add_generation_prompt=True))
        references.append(messages[last]["content"] or "")
    started = time.perf_counter()
    found = continue_texts(bundle, prompts, config or GenerationConfig(), chat=True)
    hypotheses = [continuations[0].text.strip() for continuations in found]
    return {
        "task": "chat", "file": str(path), "conversations": len(prompts), **_scores(hypotheses, references, started),
        "examples": [{"line": conversation.line, "reference": r, "hypothesis": h}
                     for conversation, r, h in list(zip(conversations, references, hypotheses))[:5]],
    }


def evaluate_lm(
    bundle: Bundle, path: str | Path, context: int | None = None, stride: int | None = None
) -> dict[str, Any]:
    """Nats per token/character over a whole text file, in non-overlapping windows of `context` tokens, or
    in a window sliding by `stride` tokens (`stream_nll`)."""
    _check_positive("context", context)
    _check_positive("stride", stride)
    text = read_text(path)
    ids = bundle.tokenizer.encode(text)
    context = context or bundle.model.max_positions
    with torch.inference_mode():
        total = stream_nll(bundle.model, ids, context, stride=stride)
    # Characters scored: all but the first, whose own prediction has no context.
    chars = len(text) - 1 if bundle.tokenizer.kind == "chars" else len(text)
    m = lm_metrics(total.nll, total.tokens, n_chars=chars)
    return {
        "task": "lm", "file": str(path), "tokens": total.tokens, "characters": len(text), "context": context,
        "stride": stride or context,
        "nats_per_token": round(m.nll, 4), "perplexity": round(m.perplexity, 3),
        "bits_per_token": round(m.bits_per_token, 4), "bits_per_char": round(m.bits_per_char, 4),
        "nats_per_char": round(total.nll / chars, 4),
    }


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(name, f"is {value}, must be at least 1; leave it out to use the default")


def evaluate_classifier(bundle: Bundle, path: str | Path) -> dict[str, Any]:
    """Accuracy, macro-F1 and the confusion matrix on a labelled file (or labelled pairs)."""
    if not bundle.label_names:
        raise AttnError(f"{bundle.path} is not a trained classifier (no label names)")
    corpus = load_labelled(path, bundle.fields, bundle.label_names)
    predictions = class_probabilities(bundle, corpus.texts, pairs=corpus.pairs).argmax(-1).tolist()
    n = len(bundle.label_names)
    return {
        "task": "classification", "file": str(path), "examples": len(corpus.texts),
        "accuracy": round(100 * accuracy(predictions, corpus.labels), 2),
        "macro_f1": round(100 * macro_f1(predictions, corpus.labels, n), 2),
        "labels": bundle.label_names,
        "confusion_matrix": confusion_matrix(predictions, corpus.labels, n).tolist(),
    }

"""Sentence embeddings of texts with an encoder-only model (what `attn embed` computes)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attn.data.corpora import pad_batch
from attn.data.tokenizers import Tokenizer
from attn.errors import ConfigError
from attn.models import Encoder


def embed_texts(
    model: Encoder, tokenizer: Tokenizer, texts: Sequence[str], batch_size: int = 64, max_length: int | None = None
) -> Tensor:
    """Mean-pooled, L2-normalised sentence embeddings, as sentence-transformers computes them.

    Each text is encoded with the tokenizer's frame ([CLS] ... [SEP]); a text longer than
    `max_length` tokens keeps its first `max_length - 1` tokens and its closing token, as Hugging
    Face truncation does. Texts are batched by length to waste little on padding; padding is
    masked, so the result does not depend on the batching.

    Args:
        model: an encoder-only model (e.g. from `load_pretrained` on all-MiniLM-L6-v2).
        tokenizer: its tokenizer.
        texts: N texts.
        batch_size: texts per forward pass.
        max_length: longest token sequence; the model's max_positions by default
            (all-MiniLM-L6-v2 was trained with 256, its `sentence_bert_config.json`).

    Returns:
        (N, d_model) float tensor on the model's device, rows of unit length, in text order.
    """
    if not isinstance(model, Encoder):
        raise ConfigError("model", f"sentence embeddings need an encoder-only model, got {type(model).__name__}")
    if batch_size < 1:
        raise ConfigError("batch_size", f"must be >= 1, got {batch_size}")
    limit = max_length or model.stack.max_positions
    ids = [_truncate(row, limit) for row in tokenizer.encode_batch(texts, add_special=True)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    device = next(model.parameters()).device
    weight = model.stack.embeddings.tokens.weight
    out = torch.empty(len(ids), weight.size(1), dtype=weight.dtype, device=device)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            tokens, mask = pad_batch([ids[i] for i in rows], tokenizer.pad_id or 0)
            out[rows] = model.sentence_embedding(tokens.to(device), mask.to(device))
    return out


def _truncate(ids: list[int], limit: int) -> list[int]:
    return ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:]


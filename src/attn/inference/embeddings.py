"""Sentence embeddings of texts with an encoder-only model (what `attn embed` computes)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attn.data.collate import pad_batch
from attn.data.samplers import length_batches
from attn.data.tokenizers import Tokenizer
from attn.core.errors import ConfigError
from attn.models import Encoder

# Padded tokens per forward pass of an encoder on a CPU: all-MiniLM-L6-v2 embedded short texts fastest in passes
# of a few hundred padded tokens; on a CPU a large padded pass costs more per token than it saves.
CPU_BATCH_TOKENS = 512


def encoder_batches(lengths: Sequence[int], batch_size: int, device: torch.device) -> list[list[int]]:
    """Row indices in batches for an encoder's passes: similar lengths together, at most `batch_size`
    rows, and on a CPU at most `CPU_BATCH_TOKENS` padded tokens (a longer row runs alone)."""
    budget = CPU_BATCH_TOKENS if device.type == "cpu" else batch_size * max(lengths, default=1)
    return length_batches(lengths, batch_size, budget)


def embed_texts(
    model: Encoder, tokenizer: Tokenizer, texts: Sequence[str], batch_size: int = 64, max_length: int | None = None
) -> Tensor:
    """Mean-pooled, L2-normalised sentence embeddings, as sentence-transformers computes them.

    Each text is encoded with the tokenizer's frame ([CLS] ... [SEP]); a text longer than `max_length` tokens
    keeps its first `max_length - 1` tokens and its closing token, as Hugging Face truncation does. Padding is
    masked, so the result does not depend on the batching.

    Args:
        batch_size: the most texts per forward pass.
        max_length: longest token sequence; the model's max_positions by default (all-MiniLM-L6-v2 was trained
            with 256, its `sentence_bert_config.json`).

    Returns:
        (N, d_model) float tensor on the model's device, rows of unit length, in text order.
    """
    if not isinstance(model, Encoder):
        raise ConfigError("model", f"sentence embeddings need an encoder-only model, got {type(model).__name__}")
    if batch_size < 1:
        raise ConfigError("batch_size", f"must be >= 1, got {batch_size}")
    limit = max_length or model.stack.max_positions
    ids = [_truncate(row, limit) for row in tokenizer.encode_batch(texts, add_special=True)]
    device = next(model.parameters()).device
    weight = model.stack.embeddings.tokens.weight
    out = torch.empty(len(ids), weight.size(1), dtype=weight.dtype, device=device)
    with torch.inference_mode():
        for rows in encoder_batches([len(row) for row in ids], batch_size, device):
            tokens, mask = pad_batch([ids[i] for i in rows], tokenizer.pad_id or 0)
            out[rows] = model.sentence_embedding(tokens.to(device), mask.to(device))
    return out


def _truncate(ids: list[int], limit: int) -> list[int]:
    return ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:]


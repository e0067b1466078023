"""Padding examples into batches: translation pairs for teacher forcing, classified texts.

Masks are boolean with True = real token, built once here from the sequence lengths; padding is on the right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn.utils.rnn import pad_sequence

from attn.data.checks import check_at_least
from attn.core.errors import ConfigError

Pair = tuple[list[int], list[int]]


@dataclass
class TranslationBatch:
    """A padded batch of translation pairs.

    Attributes:
        src: source ids, shape (B, S).
        src_mask: True at real source tokens, shape (B, S).
        tgt_in: decoder input, bos + target, shape (B, T).
        tgt_out: decoder target, target + eos (tgt_in shifted left by one), shape (B, T).
        tgt_mask: True at real target positions of tgt_in and tgt_out, shape (B, T).
        n_tgt_tokens: number of real target positions (the loss's normaliser).
    """

    src: torch.Tensor
    src_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_mask: torch.Tensor
    n_tgt_tokens: int


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads id lists into (B, L) long ids and a (B, L) bool mask, True at real tokens."""
    rows = [torch.tensor(seq, dtype=torch.long) for seq in seqs]
    tokens = pad_sequence(rows, batch_first=True, padding_value=pad_id)  # (B, L)
    lengths = torch.tensor([len(seq) for seq in seqs])
    return tokens, torch.arange(tokens.shape[1]) < lengths[:, None]


def collate_translation(pairs: Sequence[Pair], pad_id: int, bos_id: int, eos_id: int) -> TranslationBatch:
    """Pad translation pairs into a batch for teacher forcing.

    Args:
        pairs: (source ids, target ids) per example; neither holds bos or eos yet.

    Returns:
        The batch; S is the longest source, T the longest target + 1.
    """
    src, src_mask = pad_batch([s for s, _ in pairs], pad_id)
    tgt_in, tgt_mask = pad_batch([[bos_id, *t] for _, t in pairs], pad_id)
    tgt_out, _ = pad_batch([[*t, eos_id] for _, t in pairs], pad_id)
    return TranslationBatch(src, src_mask, tgt_in, tgt_out, tgt_mask, int(tgt_mask.sum()))


def filter_long(
    examples: Sequence[Pair], max_positions: int, mode: Literal["truncate", "drop"]
) -> tuple[list[Pair], int]:
    """Bound pair lengths to what a model with `max_positions` positions takes.

    A source may have `max_positions` tokens; a target `max_positions - 1`, because `collate_translation` adds bos
    or eos to it.

    Args:
        mode: "truncate" keeps the first tokens of a long side; "drop" removes the pair.

    Returns:
        (kept pairs in order, number of pairs truncated or dropped).
    """
    check_at_least("max_positions", max_positions, 2)
    if mode not in ("truncate", "drop"):
        raise ConfigError("mode", f"is {mode!r}; use 'truncate' or 'drop'")
    max_src, max_tgt = max_positions, max_positions - 1
    kept: list[Pair] = []
    affected = 0
    for src, tgt in examples:
        if len(src) <= max_src and len(tgt) <= max_tgt:
            kept.append((src, tgt))
            continue
        affected += 1
        if mode == "truncate":
            kept.append((src[:max_src], tgt[:max_tgt]))
    return kept, affected


def collate_classification(
    ids_list: Sequence[Sequence[int]], labels: Sequence[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad encoded texts into a classification batch.

    Args:
        ids_list: token ids per text (with [CLS]/[SEP] if the model wants them).

    Returns:
        (tokens (B, L), mask (B, L) True at real tokens, labels (B,) long).
    """
    tokens, mask = pad_batch(ids_list, pad_id)
    return tokens, mask, torch.tensor(list(labels), dtype=torch.long)

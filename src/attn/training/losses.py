"""The label-smoothed cross-entropy of section 5.4, summed so that callers normalise correctly.

With smoothing ε, the target distribution of a token whose class is y puts 1 - ε on y, nothing
on the padding class, and spreads ε evenly over the other V - 2 classes (V - 1 when there is no
padding class). The loss of a token is the cross-entropy -Σ_k q_k log p_k against that
distribution; targets equal to the padding id are not counted at all.

The functions return *sums* and the number of counted targets, never means: a mean per
micro-batch would weight short batches more than long ones, so the trainer divides the summed
loss of all micro-batches (and ranks) of one update by their total count.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.errors import ConfigError, ShapeError


class LossSums(NamedTuple):
    """Summed losses over the counted targets of a batch.

    Attributes:
        loss: () float, the smoothed cross-entropy summed over counted targets (what training minimises).
        nll: () float, -log p(target) summed over counted targets (for perplexity; equals `loss` when ε = 0).
        count: () long, the number of counted (non-padding) targets.
    """

    loss: Tensor
    nll: Tensor
    count: Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, targets: Tensor, smoothing: float = 0.0, pad_id: int | None = None
) -> LossSums:
    """Label-smoothed cross-entropy summed over the targets that are not padding.

    Args:
        logits: (..., V) unnormalised scores; computed in float32 whatever their dtype.
        targets: (...) long class ids. Positions equal to `pad_id` are ignored; for masked-LM
            training set every position that is not predicted to `pad_id`.
        smoothing: ε in [0, 1); 0 gives the plain cross-entropy.
        pad_id: the padding class (a valid index in [0, V)), which is never a target and gets
            no smoothing mass; None when every target counts.

    Returns:
        The summed smoothed loss, the summed negative log-likelihood and the target count.
    """
    vocab = logits.size(-1)
    _check_inputs(logits, targets, smoothing, pad_id)
    log_probs = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab)  # (N, V)
    flat = targets.reshape(-1)  # (N,)
    counted = torch.ones_like(flat, dtype=torch.bool) if pad_id is None else flat != pad_id
    nll = -log_probs.gather(1, flat[:, None]).squeeze(1)  # (N,)
    loss = nll
    if smoothing > 0:
        # Σ over the classes that share ε: all of them but the target and the padding class.
        others = -log_probs.sum(1) - nll
        sharing = vocab - 1
        if pad_id is not None:
            others = others + log_probs[:, pad_id]
            sharing -= 1
        loss = (1.0 - smoothing) * nll + smoothing * others / sharing
    zero = loss.new_zeros(())
    return LossSums(
        torch.where(counted, loss, zero).sum(), torch.where(counted, nll, zero).sum(), counted.sum()
    )


def _check_inputs(logits: Tensor, targets: Tensor, smoothing: float, pad_id: int | None) -> None:
    vocab = logits.size(-1)
    if logits.shape[:-1] != targets.shape:
        raise ShapeError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree: logits must be "
            "(..., V) over targets (...)"
        )
    if not 0.0 <= smoothing < 1.0:
        raise ConfigError("label_smoothing", f"must be in [0, 1), got {smoothing}")
    if pad_id is not None and not 0 <= pad_id < vocab:
        raise ShapeError(f"pad_id={pad_id} is not a class of the {vocab}-way logits")
    if smoothing > 0 and vocab < (3 if pad_id is not None else 2):
        raise ShapeError(f"label smoothing needs classes besides the target and padding, got V={vocab}")

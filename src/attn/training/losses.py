"""The label-smoothed cross-entropy of section 5.4, summed so that callers normalise correctly.

With smoothing ε the target distribution q of a token of class y puts 1 - ε on y, nothing on the padding class,
and ε evenly over the other V - 2 classes (V - 1 without a padding class); a token's loss is -Σ_k q_k log p_k, and
targets equal to the padding id are not counted. The functions return *sums* and the count, never means: a mean
per micro-batch would weight short batches more, so the trainer divides an update's summed loss by its total count.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attn.core.errors import ConfigError, ShapeError


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
        targets: (...) long class ids; those equal to `pad_id` are ignored (masked-LM training sets every position
            that is not predicted to `pad_id`).
        smoothing: ε in [0, 1); 0 gives the plain cross-entropy.
        pad_id: the padding class in [0, V), never a target and given no smoothing mass; None when every target counts.
    """
    _check_inputs(logits, targets, smoothing, pad_id)
    loss, nll, count = _SmoothedCrossEntropy.apply(logits, targets, smoothing, pad_id)
    return LossSums(loss, nll, count)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """The sums of `label_smoothed_cross_entropy`, with the gradient written out.

    A counted row's gradient is p - q for the smoothed loss (q sums to 1) and p - onehot(y) for the NLL: one
    scaling of the softmax the forward kept and two in-place passes, where autograd would build three (N, V)
    gradients and run the log-softmax backward over their sum. The forward takes log p from the softmax's row maxima
    (at a row's largest logit m, log p = m - logsumexp and p >= 1/V, so the log is exact to rounding): one
    exponential per logit in all, where a CPU spends most of a large vocabulary's loss time
    (`benchmarks/results/small-models-cpu/`).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, smoothing: float, pad_id: int | None):
        vocab = logits.size(-1)
        z = logits.float().reshape(-1, vocab)  # (N, V)
        probs = torch.softmax(z, dim=-1)
        lse = z.amax(1) - probs.amax(1).log()  # (N,): log Σ_k exp z_k
        flat = targets.reshape(-1)  # (N,)
        counted = torch.ones_like(flat, dtype=torch.bool) if pad_id is None else flat != pad_id
        nll = lse - z.gather(1, flat[:, None]).squeeze(1)  # (N,): -log p_y
        loss = nll
        share = 0.0
        if smoothing > 0:
            # Σ over the classes that share ε: all of them but the target and the padding class;
            # -Σ_k log p_k = V lse - Σ_k z_k.
            others = vocab * lse - z.sum(1) - nll
            sharing = vocab - 1
            if pad_id is not None:
                others = others + (z[:, pad_id] - lse)
                sharing -= 1
            share = smoothing / sharing
            loss = (1.0 - smoothing) * nll + share * others
        zero = loss.new_zeros(())
        ctx.save_for_backward(probs, flat, counted)
        ctx.smoothing, ctx.share, ctx.pad_id = smoothing, share, pad_id
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        ctx.mark_non_differentiable(counted)
        return torch.where(counted, loss, zero).sum(), torch.where(counted, nll, zero).sum(), counted.sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor, _: Tensor):
        probs, flat, counted = ctx.saved_tensors
        weight = counted.to(probs.dtype)[:, None]  # (N, 1): uncounted rows get no gradient
        grad = probs * (weight * (grad_loss + grad_nll))  # p, times each row's total weight
        if ctx.share:
            grad.sub_(weight * (grad_loss * ctx.share))  # q's ε share on every class ...
            if ctx.pad_id is not None:
                grad[:, ctx.pad_id] += weight[:, 0] * (grad_loss * ctx.share)  # ... but none on padding
        on_target = grad_loss * (1.0 - ctx.smoothing - ctx.share) + grad_nll  # the rest of q at y
        grad.scatter_add_(1, flat[:, None], -(weight * on_target))
        return grad.reshape(ctx.shape).to(ctx.dtype), None, None, None


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

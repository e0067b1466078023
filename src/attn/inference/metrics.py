"""Evaluation metrics: BLEU and chrF (through sacrebleu), LM perplexity and bits, classification scores.

BLEU and chrF are corpus-level and come with sacrebleu's signature, which records every setting
(tokenizer, smoothing, version) needed to compare numbers across papers. Language-model metrics
are computed from a summed negative log-likelihood in nats and the counts it was summed over.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attn.data.lm_stream import LMStream
from attn.core.errors import AttnError
from attn.models import Decoder


@dataclasses.dataclass(frozen=True)
class CorpusScore:
    """A corpus-level score and the sacrebleu signature that says how it was computed."""

    value: float
    signature: str

    def __str__(self) -> str:
        return f"{self.value:.2f} ({self.signature})"


def _corpus_score(metric: Any, hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]]):
    streams = [list(references)] if not references or isinstance(references[0], str) else [list(r) for r in references]
    for stream in streams:
        if len(stream) != len(hypotheses):
            raise AttnError(f"{len(hypotheses)} hypotheses but {len(stream)} references; "
                            "give one reference line per hypothesis line")
    score = metric.corpus_score(list(hypotheses), streams)
    return CorpusScore(float(score.score), str(metric.get_signature()))


def bleu(
    hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], **options: Any
) -> CorpusScore:
    """Corpus BLEU (Papineni et al. 2002) of detokenized text, with sacrebleu's defaults (13a tokenizer).

    Args:
        references: one reference per hypothesis, or several such reference streams.
        options: passed to `sacrebleu.metrics.BLEU` (e.g. tokenize="intl", lowercase=True).
    """
    from sacrebleu.metrics import BLEU

    return _corpus_score(BLEU(**options), hypotheses, references)


def chrf(
    hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], **options: Any
) -> CorpusScore:
    """Corpus chrF (Popović 2015); `word_order=2` gives chrF++. Options go to `sacrebleu.metrics.CHRF`."""
    from sacrebleu.metrics import CHRF

    return _corpus_score(CHRF(**options), hypotheses, references)


@dataclasses.dataclass(frozen=True)
class LMMetrics:
    """Language-model metrics from one summed negative log-likelihood.

    Attributes:
        nll: mean negative log-likelihood per token, in nats.
        perplexity: exp(nll).
        bits_per_token: nll / ln 2.
        bits_per_char: total NLL / (characters * ln 2), or None when the character count is unknown.
    """

    nll: float
    perplexity: float
    bits_per_token: float
    bits_per_char: float | None


def lm_metrics(total_nll_nats: float, n_tokens: int, n_chars: int | None = None) -> LMMetrics:
    """Perplexity and bits per token (and per character) from the NLL summed over n_tokens predictions."""
    if n_tokens < 1:
        raise AttnError(f"n_tokens must be >= 1, got {n_tokens}; evaluate on at least two tokens")
    if n_chars is not None and n_chars < 1:
        raise AttnError(f"n_chars must be >= 1, got {n_chars}; pass None when unknown")
    nll = total_nll_nats / n_tokens
    per_char = None if n_chars is None else total_nll_nats / (n_chars * math.log(2))
    return LMMetrics(nll, math.exp(nll), nll / math.log(2), per_char)


class NLLSum(NamedTuple):
    """A negative log-likelihood summed in nats, and the number of tokens it sums over."""

    nll: float
    tokens: int


def _window_nll(model: Decoder, inputs: Tensor, targets: Tensor) -> float:
    device = next(model.parameters()).device
    logits = model(inputs.to(device))  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten().to(device), reduction="sum").item()


@torch.inference_mode()
def stream_nll(
    model: Decoder, tokens: Sequence[int] | Tensor, context: int, batch_size: int = 16, stride: int | None = None
) -> NLLSum:
    """The summed NLL of a token stream under a causal LM, in windows of `context` tokens.

    Without `stride`, non-overlapping windows (`LMStream.eval_blocks`): window j reads tokens
    [j C, j C + C) and predicts tokens [j C + 1, j C + C + 1), C = `context`; so every token after the
    first is predicted exactly once, with 0 to C - 1 tokens of context. The last window may be shorter.

    With `stride` S (1 <= S <= C), a sliding window: the first window predicts its C tokens, each next
    one ends S tokens further and predicts only its last S (fewer at the stream's end), so every token
    after the first C is predicted once, with at least C - S tokens of context; C / S times the work.

    Args:
        model: in eval mode.
        tokens: the whole stream, N >= 2 token ids.
        context: the window length C, at most the model's max_positions.

    Returns:
        The NLL summed over the N - 1 predicted tokens, and N - 1.
    """
    stream = torch.as_tensor(tokens, dtype=torch.long).flatten()
    if stream.numel() < 2:
        raise AttnError(f"the stream has {stream.numel()} tokens; at least 2 are needed to predict one")
    if not 1 <= context <= model.max_positions:
        raise AttnError(f"context must be in [1, max_positions={model.max_positions}], got {context}")
    if stride is None:
        total = sum(_window_nll(model, x, y) for x, y in LMStream(stream, context).eval_blocks(batch_size))
        return NLLSum(float(total), stream.numel() - 1)
    if not 1 <= stride <= context:
        raise AttnError(f"stride must be in [1, context={context}], got {stride}")
    return NLLSum(_sliding_nll(model, stream, context, stride, batch_size), stream.numel() - 1)


def _sliding_nll(model: Decoder, stream: Tensor, context: int, stride: int, batch_size: int) -> float:
    """`stream_nll` with a sliding window: windows end at min(C, n), then S further each; each scores the
    targets after the previous window's end (n = N - 1 targets; target i is token i + 1)."""
    n = stream.numel() - 1
    ends = [min(context, n)]
    while ends[-1] < n:
        ends.append(min(ends[-1] + stride, n))
    windows = list(zip([0, *ends[:-1]], ends))  # (first target scored, end), all of length min(C, n)
    device = next(model.parameters()).device
    total = 0.0
    for first in range(0, len(windows), batch_size):
        batch = windows[first : first + batch_size]
        starts = [end - min(context, n) for _, end in batch]
        x = torch.stack([stream[s : e] for s, (_, e) in zip(starts, batch)]).to(device)
        y = torch.stack([stream[s + 1 : e + 1] for s, (_, e) in zip(starts, batch)]).to(device)
        losses = F.cross_entropy(model(x).transpose(1, 2).float(), y, reduction="none")  # (b, T)
        position = torch.arange(x.size(1), device=device)
        scored = position >= torch.tensor([done - s for s, (done, _) in zip(starts, batch)], device=device)[:, None]
        total += float(losses[scored].sum())
    return total


def _labels(predictions: Sequence[int], targets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    pred, gold = np.asarray(predictions, dtype=np.int64), np.asarray(targets, dtype=np.int64)
    if pred.shape != gold.shape or pred.ndim != 1 or pred.size == 0:
        raise AttnError(f"expected equal, non-empty lists of labels, got {pred.size} predictions "
                        f"and {gold.size} targets")
    if min(pred.min(), gold.min()) < 0:
        raise AttnError("labels must be ids >= 0")
    return pred, gold


def accuracy(predictions: Sequence[int], targets: Sequence[int]) -> float:
    """The fraction of predictions equal to their target."""
    pred, gold = _labels(predictions, targets)
    return float((pred == gold).mean())


def confusion_matrix(predictions: Sequence[int], targets: Sequence[int], num_labels: int | None = None) -> np.ndarray:
    """(L, L) counts: entry [i, j] is how many examples of true label i were predicted as j.

    L is `num_labels`, or one more than the largest label seen."""
    pred, gold = _labels(predictions, targets)
    size = int(max(pred.max(), gold.max())) + 1 if num_labels is None else num_labels
    if max(pred.max(), gold.max()) >= size:
        raise AttnError(f"a label {max(pred.max(), gold.max())} is out of range for num_labels={size}")
    matrix = np.zeros((size, size), dtype=np.int64)
    np.add.at(matrix, (gold, pred), 1)
    return matrix


def macro_f1(predictions: Sequence[int], targets: Sequence[int], num_labels: int | None = None) -> float:
    """The unweighted mean over labels of F1 = 2 TP / (2 TP + FP + FN) (0 where TP + FP + FN = 0).

    Averaged over the labels that occur among targets or predictions, or over all `num_labels`
    when given (scikit-learn's `f1_score(average="macro")` and its `labels=` argument).
    """
    matrix = confusion_matrix(predictions, targets, num_labels)
    tp = np.diag(matrix).astype(np.float64)
    fp = matrix.sum(0) - tp
    fn = matrix.sum(1) - tp
    denominator = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    labels = np.arange(len(tp)) if num_labels is not None else np.flatnonzero(denominator > 0)
    return float(f1[labels].mean())

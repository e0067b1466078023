"""Trivial baselines that cost nothing to compute, which a trained model must clearly beat.

- classification: multinomial naive Bayes over lower-cased word counts, the reference point given for the
  fortunes corpus in `data/README.md`;
- language modelling: a unigram model of the training tokens, scored on the evaluated tokens;
- translation: copying the source.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

COUNT_SLICE = 1 << 22  # ids counted at a time (np.bincount widens them to int64)

_WORD = re.compile(r"[A-Za-z']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class NaiveBayes:
    """Multinomial naive Bayes: argmax_c log P(c) + sum_w count(w) log P(w | c)."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.log_prior: list[float] = []
        self.log_likelihood: list[dict[str, float]] = []

    def fit(self, texts: Sequence[str], labels: Sequence[int], num_labels: int) -> NaiveBayes:
        counts = [Counter() for _ in range(num_labels)]
        for text, label in zip(texts, labels):
            counts[label].update(words(text))
        vocabulary = set().union(*counts)
        self.log_prior = [math.log(max(labels.count(c), 1) / len(labels)) for c in range(num_labels)]
        for counter in counts:
            total = sum(counter.values()) + self.alpha * len(vocabulary)
            self.log_likelihood.append({w: math.log((counter[w] + self.alpha) / total) for w in vocabulary})
        return self

    def predict(self, texts: Sequence[str]) -> list[int]:
        """Words never seen in training carry no evidence and are left out."""
        return [self._best(Counter(w for w in words(text) if w in self.log_likelihood[0])) for text in texts]

    def _best(self, counts: Counter) -> int:
        scores = [
            prior + sum(n * table[w] for w, n in counts.items())
            for prior, table in zip(self.log_prior, self.log_likelihood)
        ]
        return max(range(len(scores)), key=scores.__getitem__)


def unigram_nll(train_ids: Sequence[int] | np.ndarray, eval_ids: Sequence[int] | np.ndarray, vocab_size: int) -> float:
    """The NLL in nats summed over `eval_ids` of a unigram model of `train_ids`.

    P(w) = (count(w) + 1) / (N + V), so an id never seen in training still has a finite cost. The ids may be
    memory maps of a token cache larger than memory: they are counted a slice at a time.
    """
    counts = _counts(train_ids, vocab_size).astype(np.float64)
    log_p = np.log(counts + 1.0) - math.log(counts.sum() + vocab_size)
    return float(-(_counts(eval_ids, vocab_size) * log_p).sum())


def _counts(ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    """How often each id 0 .. vocab_size - 1 occurs, shape (V,)."""
    ids = np.asarray(ids)
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(ids), COUNT_SLICE):
        counts += np.bincount(ids[start : start + COUNT_SLICE], minlength=vocab_size)
    return counts

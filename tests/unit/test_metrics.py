"""Metrics against independent expectations: BLEU by hand, sacrebleu's chrF, cross-entropy by hand,
F1 by hand and scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from attn.inference.metrics import (
    accuracy,
    bleu,
    chrf,
    confusion_matrix,
    lm_metrics,
    macro_f1,
    stream_nll,
)
from attn.core.errors import AttnError
from attn.models import build_model
from attn.core.presets import preset

HYPOTHESES = ["the cat sat on the mat", "a quick brown fox jumps", "hello there world", "no match here at all"]
REFERENCES = ["the cat sat on a mat", "the quick brown fox jumped", "hello world", "completely different words"]


def test_bleu_by_hand():
    # 13a splits these on spaces. "the cat sat on the mat" against "the cat sat on a mat": clipped
    # n-gram matches 5/6 (the second "the" is clipped), 3/5, 2/4, 1/3; equal lengths, so no penalty.
    one = bleu(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert one.value == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, rel=1e-9)
    assert one.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    # Corpus level: counts are summed before the ratios. "hello world" against "hello there world"
    # adds 2/2 unigrams and 0/1 bigrams; 8 hypothesis words against 9 reference words give the
    # brevity penalty exp(1 - 9/8).
    corpus = bleu(["the cat sat on the mat", "hello world"], ["the cat sat on a mat", "hello there world"])
    assert corpus.value == pytest.approx(100 * math.exp(1 - 9 / 8) * (7 / 8 * 3 / 6 * 2 / 4 * 1 / 3) ** 0.25, rel=1e-9)
    # Two reference streams: each n-gram is clipped by its largest count in any reference, so "on the"
    # and "the mat" of the second reference match too: 5/6, 5/5, 3/4, 1/3.
    two = bleu(["the cat sat on the mat"], [["the cat sat on a mat"], ["a cat is on the mat"]])
    assert two.value == pytest.approx(100 * (5 / 6 * 5 / 5 * 3 / 4 * 1 / 3) ** 0.25, rel=1e-9)
    assert bleu(REFERENCES, REFERENCES).value == pytest.approx(100.0)


def test_chrf_equals_sacrebleu():
    assert chrf(HYPOTHESES, REFERENCES).value == pytest.approx(
        sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-12
    )
    plus = chrf(HYPOTHESES, REFERENCES, word_order=2)
    assert plus.value == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES], word_order=2).score)
    assert plus.signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:")


def test_mismatched_lengths_are_an_error():
    with pytest.raises(AttnError, match="4 hypotheses but 3 references"):
        bleu(HYPOTHESES, REFERENCES[:3])


def test_lm_metrics_by_hand():
    m = lm_metrics(total_nll_nats=10 * math.log(2), n_tokens=10, n_chars=20)
    assert (m.nll, m.perplexity, m.bits_per_token, m.bits_per_char) == pytest.approx((math.log(2), 2.0, 1.0, 0.5))
    assert lm_metrics(3.0, 2).bits_per_char is None
    with pytest.raises(AttnError, match="n_tokens must be >= 1"):
        lm_metrics(1.0, 0)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return build_model(preset("gpt2-tiny").replace(dropout=0.0)).eval()


def test_stream_nll_predicts_every_token_after_the_first_once(lm):
    stream = torch.randint(0, 97, (47,))
    context = 10
    total, count = stream_nll(lm, stream.tolist(), context, batch_size=3)
    # By hand: windows [0, 10) -> [1, 11), ..., [40, 46) -> [41, 47).
    by_hand = []
    with torch.no_grad():
        for start in range(0, 46, context):
            end = min(start + context, 46)
            logits = lm(stream[None, start:end])[0]
            by_hand.append(F.cross_entropy(logits, stream[start + 1 : end + 1], reduction="none"))
    losses = torch.cat(by_hand)
    assert count == len(losses) == 46
    assert total == pytest.approx(float(losses.sum()), rel=1e-5)
    assert lm_metrics(total, count).perplexity == pytest.approx(math.exp(float(losses.mean())), rel=1e-5)
    assert stream_nll(lm, stream, context, batch_size=16).nll == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize(("context", "stride", "batch_size"), [(10, 1, 4), (10, 3, 2), (10, 10, 16), (64, 5, 3)])
def test_a_sliding_window_gives_every_token_at_least_context_minus_stride_tokens_before_it(lm, context, stride,
                                                                                         batch_size):
    stream = torch.randint(0, 97, (47,))
    total, count = stream_nll(lm, stream.tolist(), context, batch_size=batch_size, stride=stride)
    # By hand, token by token: target i (token i + 1) is read after the window ending at the first end >= i + 1
    # among min(C, n), then S further each; that window starts C tokens before its end (at 0 while it cannot).
    n, ends = 46, [min(context, 46)]
    while ends[-1] < n:
        ends.append(min(ends[-1] + stride, n))
    by_hand = 0.0
    with torch.no_grad():
        for i in range(n):
            end = next(e for e in ends if e >= i + 1)
            start = max(end - context, 0)
            logits = lm(stream[None, start : i + 1])[0, -1]
            assert i + 1 - start >= min(i + 1, context - stride + 1)  # the context the docstring promises
            by_hand += float(F.cross_entropy(logits, stream[i + 1]))
    assert count == n
    assert total == pytest.approx(by_hand, rel=1e-5)


def test_a_sliding_window_of_stride_one_reads_the_longest_context_for_every_token(lm):
    stream = torch.randint(0, 97, (30,))
    total, _ = stream_nll(lm, stream, 8, stride=1)
    with torch.no_grad():
        by_hand = sum(float(F.cross_entropy(lm(stream[None, max(i + 1 - 8, 0) : i + 1])[0, -1], stream[i + 1]))
                      for i in range(29))
    assert total == pytest.approx(by_hand, rel=1e-5)


def test_stream_nll_checks_its_arguments(lm):
    with pytest.raises(AttnError, match="at least 2"):
        stream_nll(lm, [5], 8)
    with pytest.raises(AttnError, match=r"context must be in \[1, max_positions=64\]"):
        stream_nll(lm, [5, 6, 7], 65)
    for stride in (0, 9):
        with pytest.raises(AttnError, match=r"stride must be in \[1, context=8\]"):
            stream_nll(lm, [5, 6, 7], 8, stride=stride)


PRED = [0, 1, 1, 1, 2, 0]
GOLD = [0, 0, 1, 1, 2, 2]


def test_classification_metrics_by_hand_and_against_sklearn():
    f1_score = pytest.importorskip("sklearn.metrics").f1_score
    assert accuracy(PRED, GOLD) == pytest.approx(4 / 6)
    expected = np.array([[1, 1, 0], [0, 2, 0], [1, 0, 1]])  # rows: true label, columns: predicted
    assert np.array_equal(confusion_matrix(PRED, GOLD), expected)
    # F1 per class: 2TP / (2TP + FP + FN) = 2/4, 4/5, 2/3.
    by_hand = (0.5 + 0.8 + 2 / 3) / 3
    assert macro_f1(PRED, GOLD) == pytest.approx(by_hand)
    assert macro_f1(PRED, GOLD) == pytest.approx(f1_score(GOLD, PRED, average="macro"))
    # A class that never occurs counts as F1 = 0 when every label is named.
    four = f1_score(GOLD, PRED, average="macro", labels=[0, 1, 2, 3], zero_division=0)
    assert macro_f1(PRED, GOLD, num_labels=4) == pytest.approx(four) == pytest.approx(by_hand * 3 / 4)


def test_classification_inputs_are_checked():
    with pytest.raises(AttnError, match="3 predictions and 2 targets"):
        accuracy([0, 1, 1], [0, 1])
    with pytest.raises(AttnError, match="out of range for num_labels=2"):
        confusion_matrix([0, 2], [0, 1], num_labels=2)

"""The naive Bayes baseline reproduces the reference figures of data/README.md."""

import math

import pytest

from attn.app.baselines import NaiveBayes, unigram_nll
from attn.inference.metrics import accuracy, macro_f1
from attn.data.readers import load_labelled


def test_hand_computed_posterior_decides():
    # Class 0 saw "cat cat dog", class 1 saw "dog". With alpha 0.1 over the vocabulary {cat, dog}:
    # P(dog|0) = 1.1/3.2, P(dog|1) = 1.1/1.2, equal priors, so "dog" is class 1 and "cat" class 0.
    nb = NaiveBayes(0.1).fit(["cat cat dog", "dog"], [0, 1], 2)
    assert nb.log_likelihood[0]["dog"] == pytest.approx(math.log(1.1 / 3.2))
    assert nb.log_likelihood[1]["dog"] == pytest.approx(math.log(1.1 / 1.2))
    assert nb.predict(["dog", "cat", "CAT unknown"]) == [1, 0, 0]


def test_fortunes_reference_figures():
    train = load_labelled("data/fortunes-topics/train.tsv")
    test = load_labelled("data/fortunes-topics/test.tsv", labels=train.label_names)
    predictions = NaiveBayes(0.1).fit(train.texts, train.labels, len(train.label_names)).predict(test.texts)
    assert round(100 * accuracy(predictions, test.labels), 1) == 60.9
    assert round(100 * macro_f1(predictions, test.labels, 8), 1) == 52.7


def test_unigram_nll_by_hand():
    # counts [2, 1, 0] over V = 3, add-one: P = [3/6, 2/6, 1/6]
    nll = unigram_nll([0, 0, 1], [0, 1, 2], vocab_size=3)
    assert nll == pytest.approx(-math.log(3 / 6) - math.log(2 / 6) - math.log(1 / 6))

"""Gradient accumulation normalises by the scored targets of the whole update, not per micro-batch."""

import torch
from training_helpers import PAD, collate

from attn.models import build_model
from attn.core.presets import preset
from attn.training.update import Objective, TaskForward, accumulate_gradients

# Target lengths 2, 8, 3 (padded to 9) in the first micro-batch and 5, 5 (no padding) in the
# second: 16 and 12 scored targets, so a per-micro-batch mean would weigh them differently.
FIRST = [([11, 12, 13], [21, 22]), ([14, 15], [23, 24, 25, 26, 27, 28, 29, 30]), ([16], [31, 32, 33])]
SECOND = [([17, 18, 19, 20], [34, 35, 36, 37, 38]), ([40, 41], [42, 43, 44, 45, 46])]


def fresh_head():
    torch.manual_seed(0)
    return TaskForward(build_model(preset("paper-base-tiny").replace(dropout=0.0)), "forward")


def gradients(head):
    return {name: p.grad.clone() for name, p in head.named_parameters() if p.grad is not None}


def test_k_micro_batches_give_the_gradient_of_one_batch_k_times_larger():
    micro, whole = fresh_head(), fresh_head()
    small = [collate(FIRST), collate(SECOND)]
    assert [b.n_targets for b in small] == [16, 12] and small[0].targets.eq(PAD).sum() == 11
    sums, tokens = accumulate_gradients(micro, Objective(PAD, 0.1), small)
    whole_sums, _ = accumulate_gradients(whole, Objective(PAD, 0.1), [collate(FIRST + SECOND)])
    assert sums.count.item() == whole_sums.count.item() == 28 and tokens == 12 + 28  # source + target tokens
    torch.testing.assert_close(sums.loss, whole_sums.loss, rtol=1e-5, atol=1e-5)
    expected = gradients(whole)
    got = gradients(micro)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5)


def test_the_per_micro_batch_mean_would_differ():
    # The mistake this design avoids, measured on the same batches: the check above can fail.
    naive, whole = fresh_head(), fresh_head()
    for batch in (collate(FIRST), collate(SECOND)):
        accumulate_gradients(naive, Objective(PAD, 0.1), [batch])  # each normalised by its own count
    accumulate_gradients(whole, Objective(PAD, 0.1), [collate(FIRST + SECOND)])
    naive_grads, expected = gradients(naive), gradients(whole)
    largest = max((naive_grads[n] / 2 - expected[n]).abs().max().item() for n in expected)
    assert largest > 1e-4

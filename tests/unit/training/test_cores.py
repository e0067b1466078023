"""The row split across cores: the gradient of the whole batch, repeatable dropout, exact resume, its limits."""

import pytest
import torch
from test_grad_accumulation import FIRST, SECOND, fresh_head, gradients
from test_resume import assert_resume_is_exact
from training_helpers import PAD, collate, quick_config, reversal_builder

from attn.config import preset
from attn.errors import ConfigError
from attn.models import build_model
from attn.training import train
from attn.training.cores import CoreSplit, row_parts
from attn.training.trainer import TaskHead, accumulate_gradients


def split_gradients(head, batches, workers=2):
    split = CoreSplit(head, workers, threads=1)
    try:
        return accumulate_gradients(head, batches, PAD, smoothing=0.1, split=split)
    finally:
        split.close()


@pytest.mark.parametrize("workers", [2, 3])
def test_the_parts_add_up_to_the_gradient_of_the_whole_batch(workers):
    parted, whole = fresh_head(), fresh_head()
    batches = [collate(FIRST), collate(SECOND)]  # 3 rows (padded) and 2 rows: uneven parts, and a part of 1 row
    sums, tokens = split_gradients(parted, batches, workers)
    whole_sums, whole_tokens = accumulate_gradients(whole, batches, PAD, smoothing=0.1)
    assert (sums.count.item(), tokens) == (whole_sums.count.item(), whole_tokens) == (28, 40)
    torch.testing.assert_close(sums.loss, whole_sums.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sums.nll, whole_sums.nll, rtol=1e-5, atol=1e-5)
    expected, got = gradients(whole), gradients(parted)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-5)


def test_row_parts_cut_every_input_and_the_targets_in_order_and_drop_empty_parts():
    batch = collate(FIRST)
    parts = row_parts(batch, 2)
    assert [targets.size(0) for _, targets in parts] == [2, 1]
    for i, tensor in enumerate(batch.inputs):
        assert torch.equal(torch.cat([inputs[i] for inputs, _ in parts]), tensor)
    assert len(row_parts(batch, 5)) == 3


def test_dropout_in_the_parts_repeats_with_the_seed_whatever_thread_runs_first():
    def run():
        torch.manual_seed(0)
        head = TaskHead(build_model(preset("paper-base-tiny").replace(dropout=0.3)), "forward")
        torch.manual_seed(1)
        sums, _ = split_gradients(head, [collate(FIRST + SECOND)])
        return sums.loss, gradients(head), torch.get_rng_state()

    (loss_a, grads_a, rng_a), (loss_b, grads_b, rng_b) = run(), run()
    assert torch.equal(loss_a, loss_b) and torch.equal(rng_a, rng_b)
    assert all(torch.equal(grads_a[name], grads_b[name]) for name in grads_a)
    no_dropout = fresh_head()
    split_gradients(no_dropout, [collate(FIRST + SECOND)])
    assert not torch.allclose(gradients(no_dropout)["model.encoder.blocks.0.ffn.w1.weight"],
                              grads_a["model.encoder.blocks.0.ffn.w1.weight"])


def test_split_training_follows_the_whole_batch_run(tmp_path):
    builder = reversal_builder(dropout=0.0)
    whole = train(quick_config(tmp_path / "whole", "train.max_steps=4"), task_builder=builder)
    parted = train(quick_config(tmp_path / "parted", "train.max_steps=4", "train.workers=2"), task_builder=builder)
    assert parted.losses == pytest.approx(whole.losses, rel=1e-5)


def test_a_split_run_with_dropout_and_accumulation_resumes_exactly(tmp_path):
    config = quick_config(tmp_path, "batch.grad_accum=2", "train.eval_interval=2", "train.checkpoint_interval=2",
                          "train.workers=2")
    straight = assert_resume_is_exact(tmp_path, config, steps=3, builder=reversal_builder(dropout=0.3))
    assert len(set(straight.losses)) == 6


def test_a_split_where_it_cannot_run_names_the_setting(tmp_path):
    with pytest.raises(ConfigError, match="train.workers.*compile"):
        train(quick_config(tmp_path, "train.max_steps=1", "train.workers=2", "train.compile=true"),
              task_builder=reversal_builder())
    with pytest.raises(ValueError, match="at least 2 workers"):
        CoreSplit(fresh_head(), 1, 1)

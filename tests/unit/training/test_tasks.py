"""Task adapters and batch sources: sharding, resumable positions, masking, label handling."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from training_helpers import collate, reversal_pairs

from attn.app.tasks import get_task
from attn.data.batches import IndexedBatches, WindowBatches
from attn.data.lm_stream import LMStream
from attn.data.samplers import TokenBudgetSampler
from attn.core.errors import ConfigError
from attn.core.presets import preset
from attn.training.runconfig import RunConfig
from attn.training.task_data import Masker, TaskContext, special_ids

DATA = Path(__file__).parents[3] / "data"


def indexed(pairs, rank=0, world=1, max_tokens=40):
    sampler = TokenBudgetSampler([len(s) for s, _ in pairs], [len(t) + 1 for _, t in pairs], max_tokens, 64, seed=3)
    return IndexedBatches(sampler, lambda idx, epoch: collate([pairs[i] for i in idx]), rank, world)


def test_translation_batch_layout():
    batch = collate([([11, 12, 13], [21, 22]), ([14], [23, 24, 25])])
    src, tgt_in, src_mask, tgt_mask = batch.inputs
    assert tgt_in.tolist() == [[2, 21, 22, 0], [2, 23, 24, 25]]
    assert batch.targets.tolist() == [[21, 22, 3, 0], [23, 24, 25, 3]]
    assert (batch.n_targets, batch.n_tokens, batch.weight) == (7, 4 + 7, 1.0)
    assert src_mask.tolist() == [[True] * 3, [True, False, False]] and tgt_mask.sum() == 7


def test_ranks_split_every_global_batch_between_them():
    pairs = reversal_pairs(30)
    whole, first, second = indexed(pairs), indexed(pairs, 0, 2), indexed(pairs, 1, 2)
    for _ in range(12):  # more than an epoch
        full, a, b = whole.next_batch(), first.next_batch(), second.next_batch()
        assert a.n_targets + b.n_targets == full.n_targets
        assert torch.equal(full.inputs[0][0::2, : a.inputs[0].size(1)], a.inputs[0])
        assert torch.equal(full.inputs[0][1::2, : b.inputs[0].size(1)], b.inputs[0])


def test_a_rank_without_rows_gets_a_stand_in_that_scores_nothing():
    # Two short pairs share a batch; the long pair (9 target tokens) is alone in the other.
    pairs = [([11] * 8, [12] * 8), ([13, 14], [15]), ([16, 17], [18])]
    second = indexed(pairs, 1, 2, max_tokens=12)
    batches = sorted((second.next_batch() for _ in range(2)), key=lambda b: b.weight)
    assert [b.weight for b in batches] == [0.0, 1.0]
    assert batches[0].n_targets == 0 and batches[0].inputs[0].tolist() == [[11] * 8]
    assert batches[1].n_targets == 2


def test_positions_resume_to_the_same_next_batch():
    pairs = reversal_pairs(30)
    source = indexed(pairs)
    for _ in range(7):
        source.next_batch()
    state = source.state_dict()
    expected = [source.next_batch().inputs[0] for _ in range(5)]
    resumed = indexed(pairs)
    resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next_batch().inputs[0], x) for x in expected)


def test_language_model_windows_shard_and_resume():
    ids = torch.arange(500) % 97
    whole = WindowBatches(LMStream(ids, 16, seed=1), 4)
    second = WindowBatches(LMStream(ids, 16, seed=1), 4, rank=1, world_size=2)
    full, part = whole.next_batch(), second.next_batch()
    assert torch.equal(full.inputs[0][1::2], part.inputs[0]) and part.n_targets == 2 * 16
    assert torch.equal(full.targets[:, :-1], full.inputs[0][:, 1:])
    state = whole.state_dict()
    after = whole.next_batch().inputs[0]
    whole.load_state_dict(state)
    assert torch.equal(whole.next_batch().inputs[0], after)
    with pytest.raises(ConfigError, match="batch.batch_size"):
        WindowBatches(LMStream(ids, 16), 1, rank=0, world_size=2)


MASKER = Masker(probability=0.15, mask_id=6, pad_id=0, specials=(0, 1, 2, 3, 4, 5, 6), vocab_size=1000, seed=0)


def test_masking_follows_bert_proportions_and_spares_special_tokens():
    ids = [4] + list(np.random.default_rng(0).integers(7, 1000, 20000)) + [5]
    inputs, targets = map(np.array, MASKER(ids, (0, 0, 0)))
    chosen = targets != 0
    assert not chosen[0] and not chosen[-1]
    assert chosen.mean() == pytest.approx(0.15, abs=0.01)
    original = np.array(ids)
    assert (targets[chosen] == original[chosen]).all() and (inputs[~chosen] == original[~chosen]).all()
    masked = (inputs[chosen] == 6).mean()
    kept = (inputs[chosen] == original[chosen]).mean()
    assert masked == pytest.approx(0.8, abs=0.03) and kept == pytest.approx(0.1, abs=0.02)
    assert inputs[chosen].min() >= 6  # random replacements are ordinary tokens


def test_masks_are_reproducible_per_key_and_never_empty():
    ids = [4, 100, 200, 5]
    assert MASKER(ids, (0, 1, 9)) == MASKER(ids, (0, 1, 9))
    draws = {tuple(MASKER(list(range(7, 57)), (0, epoch, 9))[1]) for epoch in range(5)}
    assert len(draws) == 5  # fresh masks every epoch
    assert all(sum(t != 0 for t in MASKER(ids, (0, e, 1))[1]) >= 1 for e in range(20))


def subset(tmp_path, file, lines):
    text = (DATA / file).read_text(encoding="utf-8").splitlines()
    path = tmp_path / Path(file).name
    path.write_text("\n".join(text[:lines]) + "\n", encoding="utf-8")
    return str(path)


def test_classification_task_takes_its_labels_from_the_data(tmp_path):
    file = subset(tmp_path, "fortunes-topics/valid.tsv", 61)
    config = RunConfig().override(
        "task=classification", f"data.train={file}", f"data.valid={file}", "tokenizer.kind=wordpiece",
        "tokenizer.vocab_size=400", "batch.batch_size=8", "data.max_length=20",
    )
    task = get_task(config.task).build(config, preset("bert-base-tiny"), TaskContext())
    labels = sorted({line.split("\t")[0] for line in Path(file).read_text().splitlines()[1:]})
    assert task.info["label_names"] == labels and task.model_config.num_labels == len(labels)
    assert task.model_config.vocab_size == task.tokenizer.vocab_size and task.head == "classify"
    batch = task.train.next_batch()
    tokens, mask = batch.inputs
    assert tokens.shape[0] == 8 and tokens.shape[1] <= 20 and batch.n_targets == 8
    assert (tokens[:, 0] == task.tokenizer.cls_id).all() and task.metric == "val_accuracy"
    assert sum(b.n_targets for b in task.valid()) == 60


def test_task_setting_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="data.train: is not set"):
        get_task("translation").build(RunConfig(), preset("paper-base-tiny"), TaskContext())
    text = subset(tmp_path, "shakespeare/valid.txt", 200)
    config = RunConfig().override("task=lm", f"data.train={text}", "tokenizer.kind=chars", "batch.block_size=100")
    with pytest.raises(ConfigError, match="batch.block_size: is 100, more than the model's max_positions=64"):
        get_task(config.task).build(config, preset("gpt2-tiny"), TaskContext())
    with pytest.raises(ConfigError, match="no bos token"):
        special_ids(SimpleNamespace(pad_id=0, bos_id=None), "pad", "bos")

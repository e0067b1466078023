"""Synthetic tasks for the training tests (imported by them): random-token data, tiny runs."""

import random

from attn.data.batches import Batch, IndexedBatches
from attn.data.collate import collate_translation
from attn.data.samplers import TokenBudgetSampler
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskData, translation_batch

PAD, BOS, EOS = 0, 2, 3


def reversal_pairs(n, seed=0, vocab=97, lengths=(2, 9)):
    """Source: random ids >= 7; target: the source reversed."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        src = [rng.randrange(7, vocab) for _ in range(rng.randint(*lengths))]
        pairs.append((src, src[::-1]))
    return pairs


def collate(pairs):
    return translation_batch(collate_translation(pairs, PAD, BOS, EOS))


def reversal_builder(n=48, max_tokens=60, dropout=None):
    """A task builder (RunConfig, ModelConfig, TaskContext) -> TaskData for the reversal task."""
    pairs = reversal_pairs(n)
    valid_pairs = reversal_pairs(12, seed=1)

    def build(config, model_config, ctx):
        sampler = TokenBudgetSampler(
            [len(s) for s, _ in pairs], [len(t) + 1 for _, t in pairs], max_tokens, 64, seed=config.train.seed
        )
        train = IndexedBatches(sampler, lambda idx, epoch: collate([pairs[i] for i in idx]), ctx.rank, ctx.world_size)
        fields = {} if dropout is None else {"dropout": dropout}
        valid = [collate(valid_pairs[:6]), collate(valid_pairs[6:])]
        return TaskData(model_config.replace(**fields), "forward", PAD, train, lambda: valid)

    return build


class RepeatBatch:
    """A batch source that deals the same batch forever."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def next_batch(self) -> Batch:
        return self.batch

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def quick_config(run_dir, *overrides):
    """A run config for the tiny synthetic runs: constant lr, no warmup, quiet."""
    base = [
        f"run_dir={run_dir}", "model.preset=paper-base-tiny", "optim.schedule=constant", "optim.lr=3e-3",
        "optim.warmup_steps=0", "train.quiet=true", "train.eval_interval=0", "train.checkpoint_interval=0",
        "train.log_interval=1", "train.max_steps=4", "train.precision=fp32",
    ]
    return RunConfig().override(*base, *overrides)

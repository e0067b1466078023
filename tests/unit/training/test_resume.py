"""Exact resume: N steps, resume, N steps == 2N steps (losses and bitwise weights, dropout on, CPU)."""

from pathlib import Path

import pytest
import torch
from training_helpers import quick_config, reversal_builder

from attn.app.tasks import get_task
from attn.artifacts.checkpoint import load_checkpoint
from attn.data.readers import load_labelled
from attn.data.tokenizers import Tokenizer
from attn.training import run_training
from attn.training.logs import read_metrics
from attn.training.runconfig import RunConfig

DATA = Path(__file__).parents[3] / "data"


def validation_records(run_dir, leave_out=None):
    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    return [r for r in records if "val_loss" in r and r["step"] != leave_out]


def assert_resume_is_exact(tmp_path, config, steps, builder=None):
    builder = builder or get_task(config.task).build
    straight = run_training(config.override(f"run_dir={tmp_path / 'straight'}", f"train.max_steps={2 * steps}"),
                     task_builder=builder)
    split = config.override(f"run_dir={tmp_path / 'split'}")
    first = run_training(split.override(f"train.max_steps={steps}"), task_builder=builder)
    second = run_training(split.override(f"train.max_steps={2 * steps}"), task_builder=builder)
    assert first.losses + second.losses == straight.losses
    a, b = (load_checkpoint(tmp_path / name).model.state_dict() for name in ("straight", "split"))
    assert all(torch.equal(a[key], b[key]) for key in a)
    # The first half of the split run also evaluated at its end, step N.
    assert validation_records(tmp_path / "split", leave_out=steps) == validation_records(tmp_path / "straight")
    return straight


def test_synthetic_translation_with_dropout_and_accumulation(tmp_path):
    config = quick_config(
        tmp_path, "batch.grad_accum=2", "train.eval_interval=2", "train.checkpoint_interval=2", "optim.clip=0.5",
        "optim.schedule=noam", "optim.lr=1.0", "optim.warmup_steps=3",
    )
    straight = assert_resume_is_exact(tmp_path, config, steps=3, builder=reversal_builder(dropout=0.3))
    assert len(set(straight.losses)) == 6


def subset(source, target, lines):
    text = source.read_text(encoding="utf-8").splitlines()
    target.write_text("\n".join(text[:lines]) + "\n", encoding="utf-8")
    return str(target)


TASKS = {  # task: (data file, preset, overrides)
    "translation": ("bible-en-es/valid.tsv", "paper-base-tiny", ["tokenizer.vocab_size=300", "batch.max_tokens=200"]),
    "lm": ("shakespeare/valid.txt", "char-gpt-tiny", ["tokenizer.kind=chars", "batch.block_size=32",
                                                      "batch.batch_size=4"]),
    "mlm": ("fortunes-topics/valid.tsv", "bert-base-tiny", ["batch.batch_size=8"]),
}


@pytest.mark.parametrize("task", list(TASKS))
def test_shipped_data_paths(tmp_path, task):
    file, name, overrides = TASKS[task]
    # 41 lines: 40 examples plus a header; 5 batches of 8 texts, so the mlm run crosses an epoch.
    train_file = subset(DATA / file, tmp_path / f"train{Path(file).suffix}", 41)
    if task == "mlm":
        # WordPiece training breaks ties differently from call to call, so the two fresh runs
        # compared here share one saved tokenizer (a resumed run reuses its checkpoint's).
        Tokenizer.train_wordpiece(load_labelled(train_file).texts, 300).save(tmp_path / "tokenizer")
        overrides = [*overrides, f"tokenizer.path={tmp_path / 'tokenizer'}"]
    config = RunConfig().override(
        f"task={task}", f"model.preset={name}", f"data.train={train_file}", f"data.valid={train_file}",
        "optim.schedule=constant", "optim.lr=1e-3", "optim.warmup_steps=0", "train.quiet=true",
        "train.eval_interval=2", "train.eval_batches=2", "train.checkpoint_interval=0", *overrides,
    )
    assert_resume_is_exact(tmp_path, config, steps=3)


def test_muon_and_adamw_resume_exactly(tmp_path):
    """Both optimizers' states (Muon's momentum, AdamW's moments) travel in the checkpoint."""
    file, name, overrides = TASKS["lm"]
    train_file = subset(DATA / file, tmp_path / "train.txt", 41)
    config = RunConfig().override(
        "task=lm", f"model.preset={name}", f"data.train={train_file}", f"data.valid={train_file}",
        "optim.optimizer=muon", "optim.muon_lr_ratio=3", "optim.weight_decay=0.1", "optim.schedule=constant",
        "optim.lr=1e-3", "optim.warmup_steps=0", "train.quiet=true", "train.eval_interval=2", "train.eval_batches=2",
        "train.checkpoint_interval=0", *overrides,
    )
    straight = assert_resume_is_exact(tmp_path, config, steps=3)
    assert straight.losses[-1] < straight.losses[0]

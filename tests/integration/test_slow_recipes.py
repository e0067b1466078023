"""Long checks, excluded from the default run (`pytest -m slow`): a shipped recipe trained as a user
trains it, on a small step budget, and the same recipe on two processes sharded with FSDP2."""

import gzip
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import ROOT, run_cli

from attn.artifacts import load_model

pytestmark = pytest.mark.slow

LM_RECIPE = "configs/quickstart-lm.toml"


def unigram_nats_per_char(path: Path) -> float:
    """The baseline that costs nothing: the entropy of the training text's character frequencies."""
    counts = Counter(gzip.open(path, "rt", encoding="utf-8").read())
    total = sum(counts.values())
    return -sum(n / total * math.log(n / total) for n in counts.values())


def test_char_lm_recipe_beats_the_unigram_baseline_on_a_small_budget(tmp_path):
    """The quickstart's LM step as shipped (its precision, optimiser, schedule), on 120 updates instead
    of its 2.5 minutes, so the outcome does not depend on the machine's speed."""
    run = tmp_path / "lm"
    trained = run_cli("train", "--config", LM_RECIPE, f"run_dir={run}", "train.max_steps=120", "train.max_minutes=0",
                      "--quiet", timeout=1800)
    assert trained.returncode == 0, trained.stderr[-3000:]
    evaluated = run_cli("evaluate", "--model", str(run), "data/shakespeare/test.txt", "--json", "--context", "128")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    nats = json.loads(evaluated.stdout)["nats_per_char"]
    baseline = unigram_nats_per_char(ROOT / "data/shakespeare/train.txt.gz")  # 3.33
    assert nats < baseline - 0.5, f"{nats:.3f} nats/char after 120 updates, unigram baseline {baseline:.3f}"


def losses(run: Path) -> tuple[list[float], float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r], next(r["val_loss"] for r in reversed(records) if "val_loss" in r)


def test_fsdp2_on_two_processes_trains_the_lm_recipe_as_one_process_does(tmp_path):
    """torchrun, 2 CPU processes, FSDP2: every update's loss and the validation loss of one process.

    fp32, since this compares the sharded run with the single one, not the recipe's precision; a
    short warmup so that 20 updates cover warmup and decay.
    """
    overrides = ["train.max_steps=20", "optim.warmup_steps=5", "train.max_minutes=0", "train.log_interval=1",
                 "train.precision=fp32", "train.device=cpu", "train.checkpoint_interval=0", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "attn.app.cli",
               "train", "--config", LM_RECIPE, f"run_dir={tmp_path / 'fsdp'}", "train.strategy=fsdp", *overrides]
    sharded = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    single = run_cli("train", "--config", LM_RECIPE, f"run_dir={tmp_path / 'single'}", *overrides, timeout=1800)
    assert single.returncode == 0, single.stderr[-3000:]
    (got, got_val), (expected, expected_val) = losses(tmp_path / "fsdp"), losses(tmp_path / "single")
    assert len(got) == len(expected) == 20 and expected[-1] < expected[0] - 1.0
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert got_val == pytest.approx(expected_val, rel=1e-5, abs=1e-5)
    assert load_model(tmp_path / "fsdp").task == "lm"  # the gathered checkpoint loads

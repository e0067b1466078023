"""Crash safety, for real: `attn train` killed with SIGKILL at any moment, or stopped with SIGINT or
SIGTERM, resumes to the very weights and losses of a run that was never interrupted.

Each run is a subprocess training a tiny character-level LM on the CPU with one thread. Kills
land where timing puts them (after the first checkpoint appears) and, deterministically, at the
fault points of `attn.core.faults`: mid-update, mid-checkpoint-write and mid-evaluation.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attn.app.cli import build_parser
from attn.app.commands.training import _resume_command
from attn.artifacts.checkpoint import (
    CHECKPOINTS,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from attn.core.faults import FAULT_ENV
from attn.training import signals
from attn.training.distributed import DistContext
from attn.training.logs import METRICS_FILE, read_metrics
from attn.training.signals import recording_stop_signals

ROOT = Path(__file__).resolve().parents[2]
STEPS = 24
CHECKPOINT_INTERVAL = 3
EVAL_INTERVAL = 4
CONFIG = """
task = "lm"
run_dir = "{run_dir}"
[data]
train = "{data}"
valid = "{data}"
[tokenizer]
kind = "chars"
[model]
preset = "char-gpt-tiny"
[optim]
optimizer = "adamw"
schedule = "constant"
lr = 1e-3
warmup_steps = 0
[batch]
batch_size = 4
block_size = 32
[train]
precision = "fp32"  # the runs compared are separate processes: a probe could choose differently in each
max_steps = {steps}
eval_interval = {eval_interval}
eval_batches = 2
checkpoint_interval = {checkpoint_interval}
log_interval = 1
quiet = true
device = "cpu"
"""


def write_config(folder: Path, name: str, checkpoint_interval: int = CHECKPOINT_INTERVAL) -> Path:
    """FOLDER/NAME.toml for a run in FOLDER/NAME. How often it saves does not change what it learns."""
    data = folder / "train.txt"
    if not data.exists():
        data.write_text((ROOT / "data/shakespeare/valid.txt").read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    config = folder / f"{name}.toml"
    config.write_text(CONFIG.format(
        run_dir=folder / name, data=data, steps=STEPS, eval_interval=EVAL_INTERVAL,
        checkpoint_interval=checkpoint_interval,
    ))
    return config


def run_dir_of(config: Path) -> Path:
    return config.with_suffix("")


def start(config: Path, fault: str = "") -> subprocess.Popen:
    """`attn train --config CONFIG` in a subprocess, with one thread and an optional ATTN_FAULT."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", FAULT_ENV: fault}
    command = [sys.executable, "-m", "attn.app.cli", "train", "--config", str(config)]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """Waits for the process; returns its exit status and standard error."""
    _, err = process.communicate(timeout=120)
    return process.returncode, err


def wait_for(path: Path, process: subprocess.Popen) -> None:
    while not path.exists():
        assert process.poll() is None, f"the run ended before {path} appeared: {process.stderr.read()[-2000:]}"
        time.sleep(0.02)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir).model.state_dict()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def history(run_dir: Path) -> list[tuple]:
    """The run's losses and validation metrics by step (timings left out: they differ from run to run, and
    so do the precision records each start of a process writes)."""
    records = [r for r in read_metrics(run_dir / METRICS_FILE) if "precision" not in r]
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("val_accuracy")) for r in records]


def last_logged_step(run_dir: Path) -> int:
    records = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).exists() else []
    return max((r["step"] for r in records if "loss" in r), default=0)


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step-"))


def checkpoint_step(run_dir: Path) -> int:
    latest = latest_checkpoint(run_dir)
    return step_of(latest) if latest else 0


def leftovers(run_dir: Path) -> list[str]:
    folder = run_dir / CHECKPOINTS
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.exists() else []


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("crash")


@pytest.fixture(scope="module")
def straight(workspace) -> Path:
    """The run directory of an uninterrupted run."""
    config = write_config(workspace, "straight")
    status, err = finish(start(config))
    assert status == 0, err[-3000:]
    return run_dir_of(config)


def kill_after_first_checkpoint(config: Path) -> subprocess.Popen:
    process = start(config)
    wait_for(run_dir_of(config) / CHECKPOINTS / "latest", process)
    process.kill()
    return process


def killed_mid_update(config: Path) -> subprocess.Popen:
    return start(config, fault="step:3")


def killed_mid_checkpoint_write(config: Path) -> subprocess.Popen:
    return start(config, fault="checkpoint-write:2")


def killed_mid_evaluation(config: Path) -> subprocess.Popen:
    return start(config, fault="eval:3")  # the first batch of the process's second evaluation


def assert_killed_where_meant(kill, run_dir: Path, resumed_from: int) -> None:
    last = last_logged_step(run_dir)
    if kill is killed_mid_update:  # two updates made, the third begun
        assert last == resumed_from + 2
    if kill is killed_mid_checkpoint_write:  # the torn write is there, and ignored
        assert any(name.startswith(".tmp-step-") for name in leftovers(run_dir))
    if kill is killed_mid_evaluation:  # the step's training record is written, its validation record is not
        records = read_metrics(run_dir / METRICS_FILE)
        assert last % EVAL_INTERVAL == 0 and not [r for r in records if r["step"] == last and "val_loss" in r]


def test_sigkill_anywhere_then_resume_gives_the_weights_of_an_uninterrupted_run(workspace, straight):
    config = write_config(workspace, "killed")
    run_dir = run_dir_of(config)
    redone = []
    for kill in (kill_after_first_checkpoint, killed_mid_update, killed_mid_checkpoint_write, killed_mid_evaluation):
        resumed_from = checkpoint_step(run_dir)
        status, err = finish(kill(config))
        assert status == -signal.SIGKILL, err[-3000:]
        assert_killed_where_meant(kill, run_dir, resumed_from)
        for checkpoint in list_checkpoints(run_dir):
            assert load_checkpoint(checkpoint, with_state=True).state["step"] == step_of(checkpoint)
        # The updates made after the newest checkpoint are lost, and made again on resuming.
        redone.append(last_logged_step(run_dir) - checkpoint_step(run_dir))
        assert 0 <= redone[-1] <= CHECKPOINT_INTERVAL
    status, err = finish(start(config))
    assert status == 0, err[-3000:]
    assert leftovers(run_dir) == []
    assert_same_weights(weights(run_dir), weights(straight))
    assert history(run_dir) == history(straight)
    print(f"4 SIGKILLs survived; updates redone after each: {redone}")


RESUME_LINE = re.compile(r"^attn: interrupted at step (\d+); checkpoint saved to (\S+); resume with: (.+)$", re.M)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_saves_a_checkpoint_and_resuming_gives_the_uninterrupted_weights(workspace, straight, signum):
    name = f"stopped-{signum.name}"
    # A checkpoint every update makes the updates slow enough for the signal to land mid-run.
    config = write_config(workspace, name, checkpoint_interval=1)
    run_dir = run_dir_of(config)
    process = start(config)
    wait_for(run_dir / CHECKPOINTS / "latest", process)
    process.send_signal(signum)
    status, err = finish(process)
    assert status == 128 + signum, err[-3000:]
    found = RESUME_LINE.search(err)
    assert found, err[-3000:]
    step, path, command = int(found[1]), Path(found[2]), shlex.split(found[3])
    assert 0 < step < STEPS and path == run_dir / CHECKPOINTS / f"step-{step:08d}"
    assert load_checkpoint(path, with_state=True).state["step"] == step == last_logged_step(run_dir)
    assert command == ["attn", "train", "--config", str(config), "train.resume=true"]
    resumed = subprocess.run([sys.executable, "-m", "attn.app.cli", *command[1:]], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.startswith(f"finished at step {STEPS}")
    assert_same_weights(weights(run_dir), weights(straight))
    assert history(run_dir) == history(straight)


@pytest.mark.parametrize("world, expected", [
    ({}, "attn train --config 'my runs/c.toml' optim.lr=2 train.resume=true --quiet"),
    ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
     "torchrun --nproc_per_node=4 -m attn.app.cli train --config 'my runs/c.toml' optim.lr=2 train.resume=true --quiet"),
])
def test_the_resume_command_repeats_the_command_line_with_resuming_on(monkeypatch, world, expected):
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in world.items():
        monkeypatch.setenv(name, value)
    line = ["train", "--config", "my runs/c.toml", "train.resume=false", "optim.lr=2", "--quiet"]
    args = build_parser().parse_args(line)
    assert _resume_command(args.config, args.words, args.quiet) == expected


def test_stop_signals_are_recorded_then_the_previous_handlers_come_back():
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    with recording_stop_signals() as received:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert received == [signal.SIGTERM, signal.SIGINT]
    assert {number: signal.getsignal(number) for number in before} == before


class FakeRanks:
    """`all_reduce_sum` as if another rank had received `signals`."""

    def __init__(self, *signals: int) -> None:
        self.other = torch.tensor([float(signal.SIGINT in signals), float(signal.SIGTERM in signals)])

    def __call__(self, values: torch.Tensor, ctx) -> torch.Tensor:
        return values + self.other


@pytest.mark.parametrize("here, there, expected", [
    ([], [], 0),
    ([], [signal.SIGTERM], signal.SIGTERM),  # a rank that got nothing stops with the others
    ([signal.SIGTERM], [signal.SIGINT], signal.SIGINT),  # every rank picks the same signal
    ([signal.SIGINT], [], signal.SIGINT),
])
def test_ranks_agree_on_stopping(monkeypatch, here, there, expected):
    monkeypatch.setattr(signals, "all_reduce_sum", FakeRanks(*there))
    assert signals.agreed_stop_signal(here, DistContext()) == expected


LAUNCHED = """
import dataclasses, os, pathlib, signal, sys
sys.path.insert(0, {here!r})
from test_ddp import reversal_task, run_config
from attn.training import TrainingInterrupted, run_training


class SignalledAt:
    '''Rank 1's batches; fetching the batch of update `at` sends this rank SIGTERM.'''

    def __init__(self, batches, at):
        self.batches, self.at, self.fetched = batches, at, 0

    def next_batch(self):
        self.fetched += 1
        if self.fetched == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.batches.next_batch()

    def state_dict(self):
        return self.batches.state_dict()

    def load_state_dict(self, state):
        self.batches.load_state_dict(state)


def task(config, model_config, ctx):
    data = reversal_task(config, model_config, ctx)
    return dataclasses.replace(data, train=SignalledAt(data.train, 3)) if ctx.rank == 1 else data


try:
    run_training(run_config({run_dir!r}, "train.max_steps=8", "batch.grad_accum=1"), task_builder=task)
except TrainingInterrupted as stop:
    report = pathlib.Path({run_dir!r}).parent / f"rank{{os.environ['RANK']}}.txt"
    report.write_text(f"stopped at step {{stop.step}}, status {{stop.exit_code}}")
"""


def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_after_the_same_update(tmp_path):
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED.format(here=str(Path(__file__).parent), run_dir=str(tmp_path / "run")))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "stopped at step 3, status 143"
    state = load_checkpoint(tmp_path / "run", with_state=True).state
    assert state["step"] == 3 and state["world_size"] == 2

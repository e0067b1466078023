"""Freed CPU memory kept for the next step: page faults of repeated training steps, with and without;
the commands of `attn` that keep it, and the library that never does."""

import argparse
import ast
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from attn.app import allocator, cli
from attn.app.allocator import TUNABLES
from attn.app.commands import training

# Sixteen updates of a small MLP whose activations and gradients are 2-8 MiB each; prints the minor
# page faults of each of the last eight.
STEPS = """
import json, resource, sys, torch
from attn.app.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randn(2048, 256)
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults[8:]))
"""


def faults_of_a_late_step(mode: str, env: dict[str, str] | None = None) -> float:
    """The median minor page faults of the late steps, in a process with `env` added to the environment."""
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})})
    return statistics.median(json.loads(done.stdout))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's malloc's")
def test_kept_memory_spares_later_steps_their_page_faults():
    # glibc's defaults map the large tensors afresh every step; now and then a run's heap happens to keep
    # them for most of its late steps (a median of 384 faults seen once in six), so the defaults' figure
    # is the largest of three runs.
    default = max(faults_of_a_late_step("default") for _ in range(3))
    kept = faults_of_a_late_step("keep")
    assert default > 1_000
    # Kept, a typical late step faults no page; now and then the heap still grows by a block (a
    # step with 512-2,560 faults in about one run of three), which a median of eight steps ignores.
    assert kept < default / 10
    # The same from the environment, as a program that trains with the library sets it.
    assert faults_of_a_late_step("default", {"GLIBC_TUNABLES": TUNABLES}) < default / 10


@pytest.fixture
def keeps(monkeypatch) -> list[bool]:
    """The calls of `attn` to keep freed memory."""
    calls: list[bool] = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(True) or True)
    monkeypatch.setattr(training, "run_quickstart", lambda run_dir, budget, quiet: {"clearly_better_than_baselines": True})
    return calls


def test_the_commands_that_train_or_serve_keep_freed_memory_once(keeps, monkeypatch):
    assert cli.main(["quickstart", "--budget", "smoke"]) == 0
    assert keeps == [True]
    assert cli.main(["presets", "--json"]) == 0  # no training or serving step
    assert keeps == [True]
    monkeypatch.setenv("ATTN_KEEP_MEMORY", "0")
    assert cli.main(["quickstart", "--budget", "smoke"]) == 0
    assert keeps == [True]
    names = next(a.choices for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(cli.KEEPS_MEMORY) <= set(names)


def test_only_the_command_line_imports_the_allocator():
    src = Path(allocator.__file__).parents[1]
    importers = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module == "attn.app.allocator" or (
                    node.module == "attn.app" and any(alias.name == "allocator" for alias in node.names))):
                importers.append(path.relative_to(src).as_posix())
    assert importers == ["app/cli.py"]  # the library, attn.train and Trainer.fit included, never keeps it

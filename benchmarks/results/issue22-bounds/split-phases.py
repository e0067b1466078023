"""Where the row split's step goes, phase by phase (issue 22, seventh session): clocks around
`CoreSplit.backward` and, inside it, around its gradient sums (`functools.reduce`, one per parameter,
added up) and its accumulation (`torch.autograd.backward`); the halves in their workers are the rest
of `CoreSplit.backward`. The trainer's clipping, optimizer step and zeroing are timed around their
calls. The recipe's first batch, 2 threads split in two, freed memory kept, medians of 12 steps after 3.

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/split-phases.py RECIPE
"""

import functools
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

from attn.training import cores
from attn.training.allocator import keep_freed_memory
from benchmarks.quickstart import RECIPES, attn_split, build_trainer, split_step

TIMES: dict[str, list[float]] = {}
STEP: dict[str, float] = {}  # this step's seconds by phase


def clocked(fn, key: str):
    def run(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        STEP[key] = STEP.get(key, 0.0) + time.perf_counter() - start
        return result
    return run


def main() -> None:
    name = sys.argv[1]
    keep_freed_memory()
    cores.functools = types.SimpleNamespace(reduce=clocked(functools.reduce, "gradient sum"))
    # In a split step only CoreSplit.backward calls it (the workers take torch.autograd.grad).
    torch.autograd.backward = clocked(torch.autograd.backward, "accumulation")
    cores.CoreSplit.backward = clocked(cores.CoreSplit.backward, "split backward")
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(RECIPES[name], Path(folder) / "run")
        trainer._clip = clocked(trainer._clip, "clipping")
        trainer.optimizer.step = clocked(trainer.optimizer.step, "optimizer")
        trainer.optimizer.zero_grad = clocked(trainer.optimizer.zero_grad, "zero_grad")
        torch.set_num_threads(2)
        step = clocked(split_step(trainer, attn_split(trainer, 2)), "whole step")
        for round_ in range(15):
            STEP.clear()
            step()
            STEP["halves (the slower one)"] = STEP.pop("split backward") - STEP["gradient sum"] - STEP["accumulation"]
            if round_ >= 3:
                for key, seconds in STEP.items():
                    TIMES.setdefault(key, []).append(seconds * 1e3)
    print(f"{name}:", {key: round(statistics.median(values), 1) for key, values in TIMES.items()})


if __name__ == "__main__":
    main()

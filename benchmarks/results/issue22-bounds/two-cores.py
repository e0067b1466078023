"""Where the second core goes in a quickstart step (issue 22, seventh session).

For one recipe (`benchmarks.quickstart.RECIPES`: the recipe's own first batch, or d256's fixed one),
with freed memory kept as `attn train` keeps it, in one process:

1. the step on 1 thread, on 2 threads over the whole batch, and split in two row halves (one thread
   each, `train.workers = 2`), alternating, medians;
2. the forward + backward of each half alone on one thread, and both halves at once in two threads
   (what the split runs), alternating, medians;
3. the forward + backward of the first n rows on one thread, for n = all, 1/2, 1/4, 1/8 of the rows.

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/two-cores.py translation [rounds]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from attn.training.allocator import keep_freed_memory
from attn.training.cores import row_parts
from benchmarks.quickstart import RECIPES, attn_split, build_trainer, split_step


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def medians(samples: dict[str, list[float]], skip: int) -> dict[str, float]:
    return {key: round(statistics.median(values[skip:]), 1) for key, values in samples.items()}


def main() -> None:
    name = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    keep_freed_memory()
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(RECIPES[name], Path(folder) / "run")
        batch = trainer.task.train.next_batch()
        params = [p for p in trainer.head.parameters() if p.requires_grad]
        config = trainer.config.train

        def forward_backward(inputs, targets) -> None:
            torch.set_num_threads(1)
            loss, _ = trainer.loss_of(trainer.train_engine, inputs, targets, config.label_smoothing,
                                      trainer.task.ignore_id, trainer.autocast)
            torch.autograd.grad(loss, params, allow_unused=True)

        print(f"{name}: input shapes {[tuple(t.shape) for t in batch.inputs]}, torch {torch.__version__}, "
              f"CPU capability {torch.backends.cpu.get_cpu_capability()}")

        split = attn_split(trainer, 2)
        layouts = {"1 thread": (1, trainer.train_step), "2 threads, whole batch": (2, trainer.train_step),
                   "2 threads, split": (2, split_step(trainer, split))}
        steps: dict[str, list[float]] = {key: [] for key in layouts}
        for _ in range(rounds + 2):
            for key, (threads, step) in layouts.items():
                torch.set_num_threads(threads)
                steps[key].append(timed(step))
        split.close()
        steps_ms = medians(steps, 2)
        print("step ms:", steps_ms, f"split / 1 thread: {steps_ms['1 thread'] / steps_ms['2 threads, split']:.2f}x")

        halves = row_parts(batch, 2)
        parts: dict[str, list[float]] = {"first half alone": [], "second half alone": [],
                                         "first half beside the second": [], "second half beside the first": []}
        for _ in range(rounds + 2):
            parts["first half alone"].append(timed(lambda: forward_backward(*halves[0])))
            parts["second half alone"].append(timed(lambda: forward_backward(*halves[1])))
            together: list[list[float]] = [[], []]
            workers = [threading.Thread(target=lambda i=i: together[i].append(timed(lambda: forward_backward(*halves[i]))))
                       for i in range(2)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            parts["first half beside the second"].append(together[0][0])
            parts["second half beside the first"].append(together[1][0])
        print("forward + backward ms:", medians(parts, 2))

        total = batch.targets.size(0)
        sizes = [total, total // 2, total // 4, max(1, total // 8)]
        by_rows: dict[str, list[float]] = {str(n): [] for n in sizes}
        for _ in range(rounds + 2):
            for n in sizes:
                inputs = tuple(t[:n] for t in batch.inputs)
                by_rows[str(n)].append(timed(lambda: forward_backward(inputs, batch.targets[:n])))
        rows_ms = medians(by_rows, 2)
        per_row = {n: round(ms / int(n), 2) for n, ms in rows_ms.items()}
        print("forward + backward ms by rows (1 thread):", rows_ms, "ms per row:", per_row)


if __name__ == "__main__":
    main()

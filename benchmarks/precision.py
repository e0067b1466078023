"""The shipped recipes' training step in fp32 and under bf16 autocast on this CPU, side by side.

`precision = "auto"` decides between the two by measurement (`attn.training.precision`): this
benchmark shows whether it decided well. For each recipe it builds two trainers as `attn train`
builds them (`benchmarks.quickstart.build_trainer`, the recipe's own batches, whose shapes vary
as they do in training), one per precision, and lets them take `Trainer.train_step` in turn
(fp32, bf16, fp32, ...) after untimed warm-up steps. It reports the median milliseconds of a step in
each precision, bf16's speed-up, and beside it the ratio of auto's first probe, one matmul of the
model's shape (a time-budgeted run then times training passes of its first batch, and writes their
ratio to its `metrics.jsonl`).

    python -m benchmarks.precision --recipes translation,lm,classification,char-12min --steps 20 \\
        --out benchmarks/results/precision/cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from attn.training.precision import Precision, probe_shape, time_matmul
from benchmarks.harness import device_name, git_commit
from benchmarks.quickstart import RECIPES, Recipe, build_trainer

CPU = torch.device("cpu")
PRECISIONS = (Precision.FP32, Precision.BF16)
CHOICES = {**RECIPES, "char-12min": Recipe("char-12min", "shakespeare-char-12min.toml")}


def measure(recipe: Recipe, steps: int, warmup: int) -> dict[str, float]:
    """Median ms of a step in each precision, bf16's speed-up, and the matmul probe's ratio."""
    with tempfile.TemporaryDirectory() as folder:
        trainers = {p: build_trainer(Recipe(recipe.name, recipe.config, (*recipe.overrides, f"train.precision={p.value}")),
                                     Path(folder) / p.value, repeat=False) for p in PRECISIONS}
        fp32 = trainers[Precision.FP32]
        shape = probe_shape(fp32.task.model_config.d_model, fp32.task.model_config.d_ff)
        matmul = time_matmul(CPU, shape, None) / time_matmul(CPU, shape, torch.bfloat16)
        times: dict[Precision, list[float]] = {p: [] for p in PRECISIONS}
        for i in range(warmup + steps):
            for p, trainer in trainers.items():
                started = time.perf_counter()
                trainer.train_step()
                if i >= warmup:
                    times[p].append(time.perf_counter() - started)
    ms = {p: 1e3 * statistics.median(t) for p, t in times.items()}
    return {"fp32_ms": round(ms[Precision.FP32], 1), "bf16_ms": round(ms[Precision.BF16], 1),
            "bf16_speedup": round(ms[Precision.FP32] / ms[Precision.BF16], 3),
            "matmul_probe_speedup": round(matmul, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(CHOICES), help=f"comma-separated, of {', '.join(CHOICES)}")
    parser.add_argument("--steps", type=int, default=20, help="timed steps in each precision")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps in each precision first")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    rows = {}
    print(f"{'recipe':<16}{'fp32 ms':>9}{'bf16 ms':>9}{'bf16 speed-up':>15}{'matmul probe':>14}")
    for name in args.recipes.split(","):
        row = rows[name] = measure(CHOICES[name], args.steps, args.warmup)
        print(f"{name:<16}{row['fp32_ms']:>9}{row['bf16_ms']:>9}{row['bf16_speedup']:>14}x"
              f"{row['matmul_probe_speedup']:>13}x", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"command": " ".join(["python -m benchmarks.precision", *(argv or sys.argv[1:])]),
                  "commit": git_commit(), "machine": {"device": device_name(CPU), "threads": torch.get_num_threads(),
                  "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__},
                  "steps": args.steps, "warmup": args.warmup, "recipes": rows}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

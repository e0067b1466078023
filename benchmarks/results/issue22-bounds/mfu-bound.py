"""How high a step's share of the matmul peak (MFU) can go if everything but its matmuls took no time.

For each of case 8's recipes (`benchmarks.quickstart.BENCHMARK_RECIPES`), on one thread with freed
memory kept: the step's model FLOPs (case 8's count, attention in full), the step's wall time and its
matmul time (`mm`, `addmm`, `bmm` self time, torch.profiler, `benchmarks.quickstart.profile_step`),
and the fp32 matmul peak of the same thread (a 4096 x 4096 `torch.mm`, best of 5). MFU now =
FLOPs / wall / peak; the bound = FLOPs / matmul time / peak, the MFU of a step that were its matmuls
alone (generous: SDPA's own GEMMs are left out of the matmul time while their FLOPs are counted).

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/mfu-bound.py [recipes] [steps]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from attn.training.allocator import keep_freed_memory
from benchmarks.quickstart import BENCHMARK_RECIPES, MATMUL, build_trainer, profile_step, step_flops


def matmul_peak(size: int = 4096, reps: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2 * size**3 / best


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(BENCHMARK_RECIPES)
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    keep_freed_memory()
    peak = matmul_peak()
    print(f"torch {torch.__version__}, 1 thread, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s")
    for name in names:
        with tempfile.TemporaryDirectory() as folder:
            trainer = build_trainer(BENCHMARK_RECIPES[name], Path(folder) / "run")
            flops = step_flops(trainer)
            shares, wall, _ = profile_step(trainer.train_step, steps)
        matmul = shares[MATMUL]
        print(f"{name}: {flops / 1e9:.2f} GFLOP a step, wall {wall:.1f} ms, matmul {matmul:.1f} ms; "
              f"MFU {flops / (wall / 1e3) / peak:.0%}, matmuls alone {flops / (matmul / 1e3) / peak:.0%}; "
              f"matmul rate {flops / (matmul / 1e3) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()

"""How high a step's share of the matmul peak (MFU) can go if everything but its matmuls took no time.

For each of case 8's recipes (`benchmarks.quickstart.BENCHMARK_RECIPES`), on one thread with freed
memory kept: the step's model FLOPs (case 8's count, attention in full), the step's wall time and its
matmul time (`mm`, `addmm`, `bmm` self time, torch.profiler, `benchmarks.quickstart.profile_step`),
and the fp32 matmul peak of the same thread (case 7's 4096 x 4096 `torch.mm`, best of 5). MFU now =
FLOPs / wall / peak; the bound = FLOPs / matmul time / peak, the MFU of a step that were its matmuls
alone (generous: SDPA's own GEMMs are left out of the matmul time while their FLOPs are counted).

    PYTHONPATH=src:. python benchmarks/probes/mfu-bound.py [recipes] [steps]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from attn.app.allocator import keep_freed_memory
from benchmarks.harness import Settings
from benchmarks.quickstart import (
    BENCHMARK_RECIPES,
    MATMUL,
    build_trainer,
    fp32_peak,
    profile_step,
    step_flops,
)


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(BENCHMARK_RECIPES)
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    keep_freed_memory()
    with tempfile.TemporaryDirectory() as folder:
        peak = fp32_peak(Settings(torch.device("cpu"), torch.float32, 1, compile=False, quick=False, warmup=1, reps=5,
                                  out_dir=Path(folder), plot=Path(folder) / "plot.png"))
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

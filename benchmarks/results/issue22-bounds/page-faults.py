"""Page faults of the translator's step under glibc's default malloc and with freed memory kept
(issue 22, seventh session): the step's time and minor page faults, and those of a softmax over the
step's own logits (the loss's input), step by step from the first, 1 thread.

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/page-faults.py {keep,system}
"""

import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from attn.training import losses
from attn.training.allocator import keep_freed_memory
from benchmarks.quickstart import RECIPES, build_trainer

LOSS_FORWARD = losses._SmoothedCrossEntropy.forward


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def probed_forward(ctx, logits, *rest):
    z = logits.float().reshape(-1, logits.size(-1))
    before, start = faults(), time.perf_counter()
    torch.softmax(z, -1)
    print(f"  softmax over {tuple(z.shape)}: {(time.perf_counter() - start) * 1e3:.2f} ms, {faults() - before} faults")
    return LOSS_FORWARD(ctx, logits, *rest)


def main() -> None:
    mode = sys.argv[1]
    if mode == "keep":
        keep_freed_memory()
    torch.set_num_threads(1)
    losses._SmoothedCrossEntropy.forward = staticmethod(probed_forward)
    print(f"{mode}: torch {torch.__version__}, 1 thread, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(RECIPES["translation"], Path(folder) / "run")
        for step in range(8):
            before, start = faults(), time.perf_counter()
            trainer.train_step()
            print(f"step {step}: {(time.perf_counter() - start) * 1e3:.1f} ms, {faults() - before} faults")


if __name__ == "__main__":
    main()

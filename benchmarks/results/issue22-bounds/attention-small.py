"""SDPA's CPU kernel against the written-out softmax at the quickstart's short sequences (issue 22,
seventh session; not kept).

Part 1, one call, forward + backward, medians of 35 alternating calls: `F.scaled_dot_product_attention`
with a key-padding mask against Q K^T / sqrt(d) + an additive mask, softmax, times V (`torch.matmul`).
Part 2, the translator's whole `Trainer.train_step` (recipe's first batch, freed memory kept) with every
attention module's function swapped for the written-out form wherever Tq x Tk <= 4096, alternating
with the fused kernel, medians of 13 steps after 3, on 1 and 2 threads (2: the row split).

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/attention-small.py
"""

import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attn import attention
from attn.masks import materialize
from attn.training.allocator import keep_freed_memory
from benchmarks.quickstart import RECIPES, attn_split, build_trainer, split_step

SMALL = 4096  # Tq x Tk at most for the written-out form


def written_out(q, k, v, mask=None, bias=None, dropout=0.0):
    if dropout > 0 or q.size(-2) * k.size(-2) > SMALL:
        return attention.fast_attention(q, k, v, mask, bias, dropout)
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)
    keep = materialize(mask, q.size(-2), k.size(-2), q.device)
    if keep is not None:
        scores = scores + torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))
    if bias is not None:
        scores = scores + bias
    return scores.softmax(-1) @ v


def medians(contenders, rounds: int, skip: int, reset=lambda: None) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(rounds):
        for name, fn in contenders.items():
            reset()
            start = time.perf_counter()
            fn()
            if round_ >= skip:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(t), 2) for name, t in times.items()}


def one_call(b: int, h: int, t: int, d: int) -> None:
    q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, t, d)
    keep = torch.ones(b, 1, 1, t, dtype=torch.bool)
    keep[::2, :, :, -5:] = False

    def reset() -> None:
        q.grad = k.grad = v.grad = None

    contenders = {
        "SDPA kernel": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep).backward(grad),
        "written out": lambda: written_out(q, k, v, keep).backward(grad),
    }
    print(f"  ({b}, {h}, {t}, {d}) ms:", medians(contenders, 40, 5, reset))


def whole_step(threads: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(RECIPES["translation"], Path(folder) / "run")
        modules = [m for m in trainer.head.modules() if hasattr(m, "attend")]
        torch.set_num_threads(threads)
        step = split_step(trainer, attn_split(trainer, threads)) if threads > 1 else trainer.train_step

        def with_function(fn):
            def run() -> None:
                for module in modules:
                    module.attend = fn
                step()
            return run

        found = medians({"SDPA kernel": with_function(attention.fast_attention),
                         "written out": with_function(written_out)}, 16, 3)
        print(f"  translator step, {threads} thread(s), ms:", found,
              f"ratio {found['SDPA kernel'] / found['written out']:.3f}")


def main() -> None:
    keep_freed_memory()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}; one call, 1 thread:")
    for shape in ((16, 4, 38, 32), (32, 4, 32, 64), (16, 4, 128, 32)):
        one_call(*shape)
    for threads in (1, 2):
        whole_step(threads)


if __name__ == "__main__":
    main()

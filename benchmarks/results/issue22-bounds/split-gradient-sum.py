"""The row split's gradient sum, as `attn.training.cores.CoreSplit.backward` does it and with the first
part's backward accumulating into `.grad` itself (issue 22, seventh session; not kept).

"as run": every part returns its gradients (`torch.autograd.grad`), the loop's thread adds them in part
order and accumulates the sums through autograd. "into .grad": the first part calls `backward()` in its
worker (accumulation and hooks there), the other parts' gradients are then added to `.grad` in order.
The recipe's `Trainer.train_step` on its first batch, 2 threads split in two, freed memory kept, the
two alternating step by step, medians after 3.

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/split-gradient-sum.py RECIPE ROUNDS
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from attn.dropout import thread_generator
from attn.training import cores
from attn.training.allocator import keep_freed_memory
from benchmarks.quickstart import RECIPES, attn_split, build_trainer, split_step

AS_RUN = cores.CoreSplit.backward


def _into_grad(split, loss_of, part, factor, seed):
    torch.set_num_threads(split.threads)
    with thread_generator(torch.Generator().manual_seed(seed)):
        loss, nll = loss_of(*part)
        (loss * factor).backward()
    return loss.detach(), nll.detach(), None


def into_grad(self, batch, loss_of, factor):
    parts = cores.row_parts(batch, self.workers)
    seeds = torch.randint(0, 1 << 62, (len(parts),)).tolist()
    futures = [self._pool.submit(_into_grad, self, loss_of, parts[0], factor, seeds[0])]
    futures += [self._pool.submit(self._part, loss_of, part, factor, seed) for part, seed in zip(parts[1:], seeds[1:])]
    results = [future.result() for future in futures]
    for _, _, grads in results[1:]:
        for param, grad in zip(self.params, grads):
            if grad is not None:
                param.grad = grad if param.grad is None else param.grad.add_(grad)
    return torch.stack([r[0] for r in results]).sum(), torch.stack([r[1] for r in results]).sum()


def main() -> None:
    name, rounds = sys.argv[1], int(sys.argv[2])
    keep_freed_memory()
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(RECIPES[name], Path(folder) / "run")
        torch.set_num_threads(2)
        step = split_step(trainer, attn_split(trainer, 2))
        times: dict[str, list[float]] = {"as run": [], "into .grad": []}
        for round_ in range(rounds):
            for mode, backward in (("as run", AS_RUN), ("into .grad", into_grad)):
                cores.CoreSplit.backward = backward
                start = time.perf_counter()
                step()
                if round_ >= 3:
                    times[mode].append((time.perf_counter() - start) * 1e3)
        found = {mode: round(statistics.median(t), 1) for mode, t in times.items()}
        print(f"{name}: step ms {found}, as run / into .grad {found['as run'] / found['into .grad']:.3f}")


if __name__ == "__main__":
    main()

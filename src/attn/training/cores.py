"""Data parallelism across a CPU's cores inside one process: each of W threads trains on 1/W of a batch's rows.

On a few cores torch runs every kernel of a step on all of them, and the small kernels of a small
model (elementwise ops, LayerNorm, softmax, the many short matmuls) do not divide well: on 2 AVX2
cores the d256 translator's step ran at 1.6-1.8x the speed of one thread (benchmarks/README, issue
22). Here the batch's rows are cut into W parts and W threads each run the forward and backward
pass of one part on `threads // W` intra-op threads, at the same time; every kernel is then as long
as one core's share of the work, and the threads meet once a micro-batch instead of at every kernel.

How the numbers stay those of the whole batch: each part's summed loss is scaled by the update's
total of scored targets (as `accumulate_gradients` does for micro-batches), each thread returns its
gradients (`torch.autograd.grad`), and the caller's thread adds them in part order and accumulates
the sums into `.grad` through autograd. So the gradient is that of the whole batch up to float32
rounding (sums in another order), and a run with the same W repeats itself exactly. Dropout draws
its masks from torch's one default generator, so when the model drops anything the parts' forward
passes take turns in part order (their backward passes still overlap): the masks do not depend on
which thread runs first, and a checkpoint's RNG state resumes them.

Only for one process on the CPU, without `torch.compile` (`Trainer` checks); torch releases the GIL
inside its kernels and the autograd engine, so the threads' Python code is what they share.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor, nn

from attn.attention import MultiHead
from attn.data.batches import Batch

# (inputs, targets) -> (summed smoothed loss, summed NLL), both 0-dim tensors with the graph
LossFn = Callable[[tuple[Tensor, ...], Tensor], tuple[Tensor, Tensor]]


def row_parts(batch: Batch, parts: int) -> list[tuple[tuple[Tensor, ...], Tensor]]:
    """(inputs, targets) of up to `parts` slices of the batch's rows, in order; every tensor is batch-first."""
    pieces = [torch.tensor_split(t, parts) for t in (*batch.inputs, batch.targets)]
    rows = [tuple(piece[i] for piece in pieces) for i in range(parts)]
    return [(part[:-1], part[-1]) for part in rows if part[-1].size(0) > 0]


class CoreSplit:
    """A pool of `workers` threads that runs each micro-batch's forward and backward pass in row parts."""

    def __init__(self, module: nn.Module, workers: int, threads: int) -> None:
        """Args: module: whose trainable parameters get the gradients; workers: parts and threads (>= 2);
        threads: intra-op threads of each worker (>= 1)."""
        if workers < 2 or threads < 1:
            raise ValueError(f"a core split needs at least 2 workers of 1 thread, got {workers} x {threads}")
        self.workers, self.threads = workers, threads
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="attn-core")

    def close(self) -> None:
        """Ends the worker threads."""
        self._pool.shutdown()

    def backward(self, batch: Batch, loss_of: LossFn, factor: float) -> tuple[Tensor, Tensor]:
        """Adds the gradient of `factor` x (the batch's summed loss) to the parameters' `.grad`.

        Args:
            batch: the micro-batch, on the CPU.
            loss_of: its summed loss and NLL from (inputs, targets), run in the workers' threads.
            factor: the scale of the summed loss (1 / the update's scored targets).

        Returns:
            The batch's summed loss and NLL, detached.
        """
        parts = row_parts(batch, self.workers)
        turns = [threading.Event() for _ in range(len(parts) + 1)]  # turns[i]: part i's forward may start
        for turn in turns if not draws_masks(self.module) else turns[:1]:
            turn.set()
        futures = [self._pool.submit(self._part, loss_of, part, factor, turns[i], turns[i + 1])
                   for i, part in enumerate(parts)]
        results = [future.result() for future in futures]  # in part order, whichever finished first
        reached, totals = [], []
        for param, grads in zip(self.params, zip(*(grads for _, _, grads in results))):
            present = [grad for grad in grads if grad is not None]
            if present:
                reached.append(param)
                totals.append(functools.reduce(torch.Tensor.add_, present[1:], present[0]))
        # Through autograd, not by setting .grad: accumulation and any gradient hooks run as in backward().
        if reached:
            torch.autograd.backward(reached, totals)
        loss = torch.stack([loss for loss, _, _ in results]).sum()
        nll = torch.stack([nll for _, nll, _ in results]).sum()
        return loss, nll

    def _part(self, loss_of: LossFn, part: tuple[tuple[Tensor, ...], Tensor], factor: float,
              turn: threading.Event, next_turn: threading.Event):
        torch.set_num_threads(self.threads)  # this thread's OpenMP team
        turn.wait()
        try:
            loss, nll = loss_of(*part)
        finally:
            next_turn.set()
        grads = torch.autograd.grad(loss * factor, self.params, allow_unused=True)
        return loss.detach(), nll.detach(), grads


def draws_masks(module: nn.Module) -> bool:
    """Whether a forward pass of `module`, in its current mode, draws dropout masks."""
    return any(
        m.training and (isinstance(m, nn.Dropout) and m.p > 0 or isinstance(m, MultiHead) and m.dropout > 0)
        for m in module.modules()
    )

"""The output projection and the label-smoothed loss at the translator's shape, as attn runs them and
fused (issue 22, seventh session; not kept).

"as run": logits = h W^T, `attn.training.losses.label_smoothed_cross_entropy` (smoothing 0.1, padding
class 0), backward. "fused c": the same gradients computed in the forward, c rows at a time, so that
a (c, V) block of logits stays in the cache (softmax, minus the smoothed target, then dh = G W and
dW += G^T h). Medians of 10 alternating rounds after 2.

    PYTHONPATH=src:. python benchmarks/results/issue22-bounds/fused-output-loss.py THREADS N D V
"""

import statistics
import sys
import time

import torch

from attn.training.allocator import keep_freed_memory
from attn.training.losses import label_smoothed_cross_entropy

SMOOTHING = 0.1


def main() -> None:
    threads, n, d, v = (int(x) for x in sys.argv[1:5])
    keep_freed_memory()
    torch.set_num_threads(threads)
    h = torch.randn(n, d, requires_grad=True)
    w = (torch.randn(v, d) * 0.05).requires_grad_()
    y = torch.randint(1, v, (n,))
    share = SMOOTHING / (v - 2)

    def as_run() -> None:
        loss, _, _ = label_smoothed_cross_entropy(h @ w.t(), y, SMOOTHING, 0)
        loss.backward()

    def fused(chunk: int) -> None:
        grad_h, grad_w = torch.empty_like(h), torch.zeros_like(w)
        with torch.no_grad():
            for start in range(0, n, chunk):
                rows = h[start:start + chunk]
                g = torch.softmax(rows @ w.t(), 1).sub_(share)
                g[:, 0] += share
                g.scatter_add_(1, y[start:start + chunk, None], torch.full((len(rows), 1), -(1 - SMOOTHING - share)))
                torch.mm(g, w, out=grad_h[start:start + chunk])
                grad_w.addmm_(g.t(), rows)
        h.grad, w.grad = grad_h, grad_w

    contenders = {"as run": as_run, **{f"fused {c}": (lambda c=c: fused(c)) for c in (128, 512, n)}}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(12):
        for name, fn in contenders.items():
            h.grad = w.grad = None
            start = time.perf_counter()
            fn()
            if round_ >= 2:
                times[name].append((time.perf_counter() - start) * 1e3)
    print(f"{threads} thread(s), {n} x {d} -> {v}:", {name: round(statistics.median(t), 1) for name, t in times.items()})


if __name__ == "__main__":
    main()

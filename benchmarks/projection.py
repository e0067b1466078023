"""Layouts of the output projection on the CPU for the few rows of a decode step.

    python -m benchmarks.projection --threads 1 --out benchmarks/results/projection-cpu-1thread

A decode step multiplies a few rows (one per sequence or beam) by the whole (vocab, d_model) output
weight. Measured with `torch.utils.benchmark` (`blocked_autorange`), no autograd, the contenders in turn
for several rounds (a busy machine's drift touches all alike), at gpt2's shape (768 x 50,257) and
marian-base's (512 x 58,101), for 1 to 256 rows (256: case 2's prefill at batch 8):

- `F.linear`: `F.linear(x, W)`, what `nn.Linear` does;
- `x @ W^T copy`: `x @ Wt` with Wt a contiguous (d_model, vocab) copy of W^T;
- `(W @ x^T)^T`: the (vocab, d_model) weight on the left, the result transposed back into place.

The model's `lm_head` is a plain `nn.Linear` (`F.linear`): the faster layouts were not worth a second copy
of the output matrix and the code that keeps it in step with the weight.

Speed-up = time of `F.linear` / time of the contender, from the medians of the rounds and from the best
round (the least disturbed on a shared machine). Writes `projection.json` and `projection.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from benchmarks.harness import RESULTS_DIR, device_name, git_commit

SHAPES = {"gpt2": (768, 50257), "marian-base": (512, 58101)}
ROWS = (1, 4, 8, 32, 256)  # one sequence; a small batch; 8 sources x beam 4 (case 3); a prefill
BASELINE = "F.linear"


def _contenders(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    copy = weight.t().contiguous()
    return {
        BASELINE: lambda x: F.linear(x, weight),
        "x @ W^T copy": lambda x: x @ copy,
        "(W @ x^T)^T": lambda x: (weight @ x.t()).t().contiguous(),
    }


def _median_ms(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, seconds: float) -> float:
    timer = benchmark.Timer(stmt="fn(x)", globals={"fn": fn, "x": x}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=seconds).median * 1e3


def _alternating(contenders: dict, x: torch.Tensor, rounds: int, seconds: float) -> dict[str, list[float]]:
    """Each round measures every contender once, in turn, so a drift of the machine touches all alike."""
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for _ in range(rounds):
        for label, fn in contenders.items():
            times[label].append(_median_ms(fn, x, seconds))
    return times


def measure(rounds: int, seconds: float) -> list[dict]:
    """One row per (shape, rows, contender): the median and the best of the rounds' median milliseconds, and
    the speed-ups over F.linear (of the medians and of the bests)."""
    rows = []
    for name, (d_model, vocab) in SHAPES.items():
        torch.manual_seed(0)
        weight = torch.nn.init.xavier_uniform_(torch.empty(vocab, d_model))
        contenders = _contenders(weight)
        for count in ROWS:
            x = torch.randn(count, d_model)
            with torch.no_grad():
                expected = F.linear(x, weight)
                for fn in contenders.values():
                    torch.testing.assert_close(fn(x), expected, atol=1e-4, rtol=1e-4)
                times = _alternating(contenders, x, rounds, seconds)
            base = times[BASELINE]
            rows += [{"shape": f"{name} {d_model}x{vocab}", "rows": count, "contender": label, "rounds_ms": ms,
                      "median_ms": statistics.median(ms), "best_ms": min(ms),
                      "speedup_median": statistics.median(base) / statistics.median(ms),
                      "speedup_best": min(base) / min(ms)} for label, ms in times.items()]
    return rows


def markdown(rows: Sequence[dict], info: dict) -> str:
    lines = [
        f"Measured {info['date']} (commit {info['commit']}) on {info['device']}; torch {info['torch']}, "
        f"{info['threads']} threads, fp32, no autograd, {info['rounds']} alternating rounds of at least "
        f"{info['seconds']} s per contender; "
        f"load average before {info['load_before']}, after {info['load_after']}",
        "",
        "| shape | rows | contender | median ms | best ms | speed-up (medians) | speed-up (bests) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['shape']} | {r['rows']} | {r['contender']} | {r['median_ms']:.3f} | {r['best_ms']:.3f} "
              f"| {r['speedup_median']:.2f} | {r['speedup_best']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def _load() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.projection", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=0.2, help="least run time per measurement (default 0.2)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "projection-cpu-1thread")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = _load()
    rows = measure(args.rounds, args.seconds)
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "device": device_name(torch.device("cpu")), "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(),
        "rounds": args.rounds, "seconds": args.seconds, "load_before": load_before, "load_after": _load(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "projection.json").write_text(json.dumps({"settings": info, "rows": rows}, indent=2) + "\n")
    table = markdown(rows, info)
    (args.out / "projection.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

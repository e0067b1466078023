"""Kernels for a float32 linear layer on the CPU without autograd: what a decode step or a prefill multiplies.

    python -m benchmarks.linear --out benchmarks/results/linear-cpu
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python -m benchmarks.linear --out benchmarks/results/linear-cpu-avx2

Measured with `torch.utils.benchmark` (`blocked_autorange`), the contenders in turn for several rounds
(a busy machine's drift touches all alike), for 1 to 256 rows (one sequence; a small batch; 8 sources
x beam 4; a prefill), on three weight sets: gpt2's output projection (768 x 50,257), marian-base's
(512 x 58,101), and every matrix of SmolLM2-135M (the 121 weights a decode step reads, 538 MB: too
big for any cache, as in a real step):

- `F.linear`: what `nn.Linear` does (MKL's sgemm for float32);
- `(W @ x^T)^T`: the (out, in) weight on the left, the result transposed back into place;
- `attn Linear`: `attn.core.linear.Linear`, oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`).

Speed-up = time of `F.linear` / time of the contender, from the medians of the rounds and from the best
round (the least disturbed on a shared machine). Writes `linear.json` and `linear.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from attn.core.linear import Linear
from attn.models import build_model
from attn.core.presets import preset
from benchmarks.harness import RESULTS_DIR, device_name, git_commit

ROWS = (1, 4, 8, 32, 256)
BASELINE = "F.linear"
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def weight_sets() -> dict[str, list[torch.Tensor]]:
    """Name -> the (out, in) weights one call multiplies, each by its own input."""
    torch.manual_seed(0)
    smollm2 = build_model(preset("smollm2-135m"))
    return {
        "gpt2 output 768x50257": [torch.nn.init.xavier_uniform_(torch.empty(50257, 768))],
        "marian-base output 512x58101": [torch.nn.init.xavier_uniform_(torch.empty(58101, 512))],
        "SmolLM2-135M, all 121 matrices": [p.detach() for p in smollm2.parameters() if p.dim() == 2],
    }


def _layers(weights: Sequence[torch.Tensor]) -> list[Linear]:
    layers = []
    for w in weights:
        layer = Linear(w.size(1), w.size(0), bias=False)
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        layers.append(layer)
    return layers


def _contenders(weights: Sequence[torch.Tensor]) -> dict[str, Callable[[dict[int, torch.Tensor]], list]]:
    layers = _layers(weights)
    return {
        BASELINE: lambda xs: [F.linear(xs[w.size(1)], w) for w in weights],
        "(W @ x^T)^T": lambda xs: [(w @ xs[w.size(1)].t()).t().contiguous() for w in weights],
        "attn Linear": lambda xs: [layer(xs[layer.in_features]) for layer in layers],
    }


def _median_ms(fn: Callable, xs: dict[int, torch.Tensor], seconds: float) -> float:
    timer = benchmark.Timer(stmt="fn(xs)", globals={"fn": fn, "xs": xs}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=seconds).median * 1e3


def _alternating(contenders: dict, xs: dict[int, torch.Tensor], rounds: int, seconds: float) -> dict[str, list]:
    """Each round measures every contender once, in turn, so a drift of the machine touches all alike."""
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for _ in range(rounds):
        for label, fn in contenders.items():
            times[label].append(_median_ms(fn, xs, seconds))
    return times


@torch.no_grad()
def measure(rounds: int, seconds: float) -> list[dict]:
    """One row per (weight set, rows, contender): the median and the best of the rounds' median milliseconds,
    and the speed-ups over F.linear (of the medians and of the bests)."""
    rows = []
    for name, weights in weight_sets().items():
        contenders = _contenders(weights)
        for count in ROWS:
            xs = {w.size(1): torch.randn(count, w.size(1)) for w in weights}
            expected = contenders[BASELINE](xs)
            for fn in contenders.values():
                for got, want in zip(fn(xs), expected, strict=True):
                    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            times = _alternating(contenders, xs, rounds, seconds)
            base = times[BASELINE]
            rows += [{"weights": name, "rows": count, "contender": label, "rounds_ms": ms,
                      "median_ms": statistics.median(ms), "best_ms": min(ms),
                      "speedup_median": statistics.median(base) / statistics.median(ms),
                      "speedup_best": min(base) / min(ms)} for label, ms in times.items()]
    return rows


def markdown(rows: Sequence[dict], info: dict) -> str:
    isa = ", ".join(f"{k}={v}" for k, v in info["isa"].items()) or "none (the CPU's own ISA)"
    lines = [
        f"Measured {info['date']} (commit {info['commit']}) on {info['device']}; torch {info['torch']}, "
        f"{info['threads']} threads, fp32, no autograd, {info['rounds']} alternating rounds of at least "
        f"{info['seconds']} s per contender; ISA caps: {isa}; "
        f"load average before {info['load_before']}, after {info['load_after']}",
        "",
        "| weights | rows | contender | median ms | best ms | speed-up (medians) | speed-up (bests) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['weights']} | {r['rows']} | {r['contender']} | {r['median_ms']:.3f} | {r['best_ms']:.3f} "
              f"| {r['speedup_median']:.2f} | {r['speedup_best']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def _load() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.linear", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=0.2, help="least run time per measurement (default 0.2)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "linear-cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = _load()
    rows = measure(args.rounds, args.seconds)
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "device": device_name(torch.device("cpu")), "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(),
        "isa": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
        "rounds": args.rounds, "seconds": args.seconds, "load_before": load_before, "load_after": _load(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linear.json").write_text(json.dumps({"settings": info, "rows": rows}, indent=2) + "\n")
    table = markdown(rows, info)
    (args.out / "linear.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

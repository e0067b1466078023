"""Case 8's training steps under glibc's default malloc and with freed memory kept (`train.keep_memory`).

The allocator is a setting of the whole process, so every measurement is a process of its own: for
each recipe of case 8 and each round, attn's step and each peer's step (built as case 8 builds them,
`benchmarks.quickstart`) run once under the C library's defaults ("system") and once after
`attn.app.allocator.keep_freed_memory` ("keep"), the processes one after the other in
alternating order. Each process runs `--warmup` untimed steps, then `--steps` timed ones, and
reports the median milliseconds and the median minor page faults of a step. The table gives the
median over rounds, keep's speed-up over system for each contender, and attn against the best peer
three ways: both as their libraries run them (attn keeps freed memory during `fit`, the peers do
not), both under the defaults, both keeping.

    python -m benchmarks.allocator --recipes translation,d256 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import device_name, git_commit

RESULTS_DIR = Path(__file__).resolve().parent / "results" / "cores" / "allocator"
MODES = ("system", "keep")
OURS = "attn"


def child(recipe: str, contender: str, mode: str, warmup: int, steps: int) -> dict[str, float]:
    """One process's measurement (see the module): median ms and page faults of a step, peak resident MB."""
    from attn.app.allocator import keep_freed_memory
    from benchmarks.quickstart import BENCHMARK_RECIPES, build_trainer, peer_step

    if mode == "keep" and not keep_freed_memory():
        raise SystemExit("freed memory can be kept only under glibc's malloc")
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(BENCHMARK_RECIPES[recipe], Path(folder) / "run")
        step = trainer.train_step if contender == OURS else peer_step(contender, trainer)
        for _ in range(warmup):
            step()
        times, faults = [], []
        for _ in range(steps):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ms": statistics.median(times), "faults": statistics.median(faults), "peak_mb": round(peak_mb)}


def measure(recipe: str, contender: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    """`child` in a fresh process."""
    command = [sys.executable, "-m", "benchmarks.allocator", "--child", recipe, contender, mode,
               "--warmup", str(args.warmup), "--steps", str(args.steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> None:
    from benchmarks.quickstart import BENCHMARK_RECIPES, PEERS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(BENCHMARK_RECIPES), type=lambda s: s.split(","))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--child", nargs=3, metavar=("RECIPE", "CONTENDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.warmup, args.steps)))
        return
    unknown = sorted(set(args.recipes) - set(BENCHMARK_RECIPES))
    if unknown:
        parser.error(f"unknown recipes {unknown}; choose from {sorted(BENCHMARK_RECIPES)}")
    record: dict[str, Any] = {
        "command": "python -m benchmarks.allocator " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "machine": device_name(torch.device("cpu")), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "load_before": os.getloadavg()[0], "runs": [],
    }
    for round_ in range(args.rounds):
        for recipe in args.recipes:
            runs = [(contender, mode) for contender in (OURS, *PEERS[recipe]) for mode in MODES]
            for contender, mode in runs if round_ % 2 == 0 else reversed(runs):
                found = measure(recipe, contender, mode, args)
                run = {"round": round_, "recipe": recipe, "contender": contender, "mode": mode, **found}
                record["runs"].append(run)
                print(json.dumps(run), flush=True)
    record["load_after"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(markdown(record), encoding="utf-8")
    print(markdown(record))


def markdown(record: dict[str, Any]) -> str:
    """The table of medians over rounds and the ratios the module describes."""
    runs = record["runs"]
    lines = [f"# Freed memory kept against glibc's defaults, case 8's steps ({record['date']})", "",
             f"`{record['command']}` at {record['commit']} on {record['machine']}, torch {record['torch']}, "
             f"{record['torch_threads']} threads, load {record['load_before']:.2f} -> {record['load_after']:.2f}", "",
             "| recipe | contender | ms/step system | ms/step keep | keep speed-up | faults/step system | faults/step keep "
             "| peak MB system | peak MB keep |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    medians: dict[tuple[str, str, str], float] = {}
    for recipe in dict.fromkeys(run["recipe"] for run in runs):
        for contender in dict.fromkeys(run["contender"] for run in runs if run["recipe"] == recipe):
            cells = {}
            for mode in MODES:
                mine = [run for run in runs if (run["recipe"], run["contender"], run["mode"]) == (recipe, contender, mode)]
                medians[recipe, contender, mode] = statistics.median(run["ms"] for run in mine)
                cells[mode] = (medians[recipe, contender, mode], statistics.median(run["faults"] for run in mine),
                               max(run["peak_mb"] for run in mine))
            lines.append(f"| {recipe} | {contender} | {cells['system'][0]:.1f} | {cells['keep'][0]:.1f} | "
                         f"{cells['system'][0] / cells['keep'][0]:.2f} | {cells['system'][1]:,.0f} | "
                         f"{cells['keep'][1]:,.0f} | {cells['system'][2]:,} | {cells['keep'][2]:,} |")
    lines += ["", "attn against the best peer (ratio of step times; > 1: attn is faster):", ""]
    for recipe in dict.fromkeys(run["recipe"] for run in runs):
        peers = [c for (r, c, _) in medians if r == recipe and c != OURS]

        def best(mode: str) -> float:
            return min(medians[recipe, peer, mode] for peer in peers)

        lines.append(f"- {recipe}: as run by default (attn keep, peers system) "
                     f"{best('system') / medians[recipe, OURS, 'keep']:.2f}; both system "
                     f"{best('system') / medians[recipe, OURS, 'system']:.2f}; both keep "
                     f"{best('keep') / medians[recipe, OURS, 'keep']:.2f}")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()

"""Updates in a time budget with `train.threads` = auto against torch's fixed count, on an idle and a busy CPU.

A quickstart recipe trains for `--minutes` (its own budget by default) once per setting and round,
the settings alternating, with `--busy` other processes spinning on the CPU meanwhile (0 = the
machine as it is). Each run is `attn.app.runs.train` on the recipe's config with
`train.max_minutes`, `train.threads` and a fresh run directory overridden; the table gives each
run's updates and tokens/s, the counts `auto` chose, and auto's updates over the fixed count's.

    python -m benchmarks.threads --recipe translation --minutes 1.5 --busy 0,1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from attn.app.runs import load_run_config, train
from attn.training.logs import read_metrics
from benchmarks.harness import device_name, git_commit

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RESULTS_DIR = Path(__file__).resolve().parent / "results" / "threads"
SETTINGS = {"fixed": "train.threads={all}", "auto": "train.threads=0"}


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` Python processes spinning on the CPU for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinners:
            process.kill()
            process.wait()


def one_run(recipe: str, minutes: float | None, threads: str, run_dir: Path) -> dict[str, Any]:
    """Trains the recipe once; returns its updates, tokens/s and the thread choices in its metrics."""
    overrides = [f"run_dir={run_dir}", threads, "train.quiet=true", "train.checkpoint_interval=0"]
    if minutes:
        overrides.append(f"train.max_minutes={minutes}")
    result = train(load_run_config(CONFIGS / f"quickstart-{recipe}.toml", overrides))
    choices = [r["threads"] for r in read_metrics(run_dir / "metrics.jsonl") if "threads" in r]
    return {"updates": result.step, "tokens_per_s": round(result.tokens_per_s, 1), "choices": choices,
            "load_after": os.getloadavg()[0]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="translation", choices=("translation", "lm", "classification"))
    parser.add_argument("--minutes", type=float, help="the training budget (default: the recipe's)")
    parser.add_argument("--busy", default="0,1", type=lambda s: [int(n) for n in s.split(",")],
                        help="numbers of spinning processes, one condition each")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    cores = torch.get_num_threads()
    record: dict[str, Any] = {
        "command": "python -m benchmarks.threads " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "machine": device_name(torch.device("cpu")), "torch": torch.__version__,
        "torch_threads": cores, "recipe": args.recipe, "minutes": args.minutes, "runs": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        for busy in args.busy:
            with busy_processes(busy):
                for round_ in range(args.rounds):
                    for name, setting in SETTINGS.items():
                        run_dir = Path(scratch) / f"{busy}-{round_}-{name}"
                        found = one_run(args.recipe, args.minutes, setting.format(all=cores), run_dir)
                        record["runs"].append({"busy": busy, "round": round_, "setting": name, **found})
                        print(json.dumps(record["runs"][-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{args.recipe}-{datetime.datetime.now().strftime('%Y%m%dT%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(markdown(record), encoding="utf-8")
    print(markdown(record))


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# train.threads auto against {record['torch_threads']} fixed threads ({record['date']})", "",
             f"`{record['command']}` at {record['commit']} on {record['machine']}, torch {record['torch']}; "
             f"recipe {record['recipe']}, budget {record['minutes'] or 'the recipe’s'} min", "",
             "| busy processes | round | setting | updates | tokens/s | counts auto chose | load after |",
             "|---:|---:|---|---:|---:|---|---:|"]
    for run in record["runs"]:
        lines.append(f"| {run['busy']} | {run['round']} | {run['setting']} | {run['updates']} | "
                     f"{run['tokens_per_s']:,.0f} | {run['choices'] or '-'} | {run['load_after']:.2f} |")
    lines.append("")
    for busy in sorted({run["busy"] for run in record["runs"]}):
        updates = {name: sum(r["updates"] for r in record["runs"] if r["busy"] == busy and r["setting"] == name)
                   for name in SETTINGS}
        lines.append(f"- {busy} busy: auto / fixed updates = {updates['auto'] / max(updates['fixed'], 1):.2f}")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()

"""Variants of a time-budgeted char-LM recipe, each trained for the updates the CPU would give it in its budget.

A recipe such as configs/shakespeare-char-12min.toml stops after a wall-clock budget, so a variant that costs
more per update gets fewer of them. This probe separates the two questions:
- `speed`: on this machine, each variant's updates per second over a short run (after a warm-up), written to
  a JSON file;
- `train`: with those speeds, each variant trains for the updates it would reach in the budget
  (`--minutes`), all variants at once as separate processes (on a GPU, where that is quick), then is scored
  on the validation text in non-overlapping windows of its own context. Writes one JSON (commit, machine,
  each variant's overrides, updates and validation nats/char).

    python benchmarks/probes/char-sweep.py speed OUT.json [--recipe configs/shakespeare-char-12min.toml]
    python benchmarks/probes/char-sweep.py train SPEEDS.json OUT.json [--minutes 12] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import git_commit

B256 = ["model.max_positions=256", "batch.block_size=256", "batch.batch_size=8"]
VARIANTS: dict[str, list[str]] = {
    "recipe": [],
    "wd-0.3": ["optim.weight_decay=0.3"],
    "wd-1.0": ["optim.weight_decay=1.0"],
    "block-256-wd-0.3": [*B256, "optim.weight_decay=0.3"],
    "block-256-wd-1.0": [*B256, "optim.weight_decay=1.0"],
    "block-512-wd-0.3": ["model.max_positions=512", "batch.block_size=512", "batch.batch_size=4",
                         "optim.weight_decay=0.3"],
    "block-256-batch-4-wd-0.3": [*B256, "batch.batch_size=4", "optim.weight_decay=0.3"],
    "block-256-wd-0.3-lr-2e-3": [*B256, "optim.weight_decay=0.3", "optim.lr=2e-3"],
}
SPEED_STEPS, SPEED_SKIP = 120, 40


def one(recipe: str, run_dir: str, device: str, steps: int, overrides: list[str]) -> dict[str, object]:
    """Trains one variant for `steps` updates, then scores it on the validation text at its own context."""
    from attn.inference.evaluation import evaluate_lm
    from attn.app.runs import load_run_config, train
    from attn.artifacts import load_model

    settings = [f"run_dir={run_dir}", "train.quiet=true", "train.max_minutes=0", "train.eval_interval=100000",
                "train.checkpoint_interval=100000", f"train.device={device}", f"train.max_steps={steps}"]
    train(load_run_config(recipe, [*settings, *overrides]))
    loaded = load_model(run_dir, device)
    return evaluate_lm(loaded, "data/shakespeare/valid.txt", loaded.model.max_positions)


def speed(args: argparse.Namespace) -> None:
    speeds = {}
    with tempfile.TemporaryDirectory() as root:
        for name, overrides in VARIANTS.items():
            run_dir = Path(root) / name
            one(args.recipe, str(run_dir), "cpu", SPEED_STEPS, ["train.log_interval=1", *overrides])
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            times = {row["step"]: row["elapsed"] for row in rows if "elapsed" in row}
            speeds[name] = (SPEED_STEPS - SPEED_SKIP) / (times[SPEED_STEPS] - times[SPEED_SKIP])
            print(name, round(speeds[name], 2), "updates/s", flush=True)
    Path(args.out).write_text(json.dumps({"recipe": args.recipe, "commit": git_commit(), "speeds": speeds},
                                         indent=2))


def train(args: argparse.Namespace) -> None:
    measured = json.loads(Path(args.speeds).read_text())
    recipe, speeds = measured["recipe"], measured["speeds"]
    root = Path(tempfile.mkdtemp())
    jobs = {}
    for name, overrides in VARIANTS.items():
        steps = int(speeds[name] * args.minutes * 60)
        command = [sys.executable, __file__, "one", recipe, str(root / name), args.device, str(steps), *overrides]
        jobs[name] = (steps, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = {}
    for name, (steps, job) in jobs.items():
        out, err = job.communicate()
        if job.returncode:
            results[name] = {"error": err[-1000:]}
            continue
        results[name] = {"overrides": VARIANTS[name], "updates": steps,
                         "valid_nats_per_char": json.loads(out)["nats_per_char"]}
        print(name, results[name], flush=True)
    Path(args.out).write_text(json.dumps({"recipe": recipe, "minutes": args.minutes, "speeds_commit": measured["commit"],
                                          "commit": git_commit(), "device": args.device, "results": results}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("speed")
    s.add_argument("out")
    s.add_argument("--recipe", default="configs/shakespeare-char-12min.toml")
    t = sub.add_parser("train")
    t.add_argument("speeds")
    t.add_argument("out")
    t.add_argument("--minutes", type=float, default=12.0)
    t.add_argument("--device", default="cuda")
    o = sub.add_parser("one")
    for name in ("recipe", "run_dir", "device"):
        o.add_argument(name)
    o.add_argument("steps", type=int)
    o.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.mode == "one":
        print(json.dumps(one(args.recipe, args.run_dir, args.device, args.steps, args.overrides)))
    else:
        speed(args) if args.mode == "speed" else train(args)


if __name__ == "__main__":
    main()

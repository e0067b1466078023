"""A language model on a corpus larger than memory: peak memory and the token cache's build speed.

Writes a synthetic corpus of `--parts` files of about 50 MB each (the lines of the shipped
Shakespeare, Bible and fortune texts, shuffled with a fixed seed per file) into `--folder`, then
for the first file alone (about 50 MB) and for all of them (about 500 MB with 10 parts):

1. the data path alone, in a fresh process: train the character tokenizer on the streamed text
   and build the token cache, each timed (MB/s of text), and the process's peak resident set;
2. `attn train` of the quickstart's character LM for `--steps` steps on that corpus, a fresh run
   (it trains its tokenizer and builds its cache itself), under `/usr/bin/time -v`: the whole
   process's peak resident set ("Maximum resident set size") and wall time;
3. the same run resumed for `--steps` more steps, which finds its cache and reuses it.

Prints the results and writes them as JSON (`--out`). The corpus and the runs stay in `--folder`
(never in the repository). Linux only (`/usr/bin/time`, `/proc`).

    python -m benchmarks.lm_corpus --folder /tmp/lm-corpus --out benchmarks/results/lm-corpus/cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from attn.data.readers import load_labelled, load_parallel
from attn.data.text import read_text

ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000
PART_BYTES = 50 * MB

DATA_PATH = """
import json, resource, sys, time
from pathlib import Path
from attn.data.text_files import corpus_files, text_chunks
from attn.data.token_cache import token_ids
from attn.data.tokenizers import Tokenizer
files = corpus_files(sys.argv[1], "data.train")
start = time.perf_counter()
tokenizer = Tokenizer.train_chars(text_chunks(files, cut_anywhere=True))
trained = time.perf_counter()
ids = token_ids(files, tokenizer, Path(sys.argv[2]))
built = time.perf_counter()
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"tokenizer_s": trained - start, "cache_s": built - trained, "tokens": len(ids),
                  "vocab_size": tokenizer.vocab_size, "dtype": ids.dtype.name, "peak_rss_mb": peak_kb * 1024 / 2**20}))
"""


def shipped_lines() -> list[str]:
    """Every line of the shipped English and Spanish texts."""
    lines = read_text("data/shakespeare/train.txt.gz").splitlines()
    bible = load_parallel("data/bible-en-es/train.tsv.gz")
    lines += bible.sources + bible.targets + load_labelled("data/fortunes-topics/train.tsv").texts
    return [line for line in lines if line.strip()]


def make_corpus(folder: Path, parts: int) -> list[Path]:
    """`parts` files of about 50 MB of shuffled shipped lines (kept if already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    paths = [folder / f"part-{i:02d}.txt" for i in range(parts)]
    for number, path in enumerate(paths):
        if path.exists() and path.stat().st_size >= PART_BYTES:
            continue
        lines = lines or shipped_lines()
        rng = random.Random(number)
        with open(path, "w", encoding="utf-8") as out:
            written = 0
            while written < PART_BYTES:
                rng.shuffle(lines)
                block = "\n".join(lines) + "\n"
                out.write(block)
                written += len(block.encode("utf-8"))
    return paths


def data_path(spec: str, stem: Path) -> dict[str, Any]:
    """Step 1: tokenizer training and cache building alone, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", DATA_PATH, spec, str(stem)], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed_train(run_dir: Path, spec: str, steps: int) -> dict[str, Any]:
    """Steps 2 and 3: `attn train` under /usr/bin/time -v; its peak resident set and wall time."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "attn.app.cli", "train", "--config",
               "configs/quickstart-lm.toml", f"run_dir={run_dir}", f"data.train={spec}", "data.valid=",
               f"train.max_steps={steps}", "optim.warmup_steps=5", "train.max_minutes=0", "train.checkpoint_interval=0",
               "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr)
    assert rss and wall, done.stderr[-3000:]
    seconds = sum(float(x) * 60**i for i, x in enumerate(reversed(wall.group(1).split(":"))))
    return {"command": " ".join(command[2:]), "peak_rss_mb": int(rss.group(1)) * 1024 / 2**20, "wall_s": seconds}


def measure(folder: Path, spec: str, name: str, steps: int) -> dict[str, Any]:
    """The three measurements of one corpus."""
    files = sorted(folder.glob(Path(spec).name))
    megabytes = sum(f.stat().st_size for f in files) / MB
    alone = data_path(spec, folder / f"cache-{name}" / "train")
    fresh = timed_train(folder / f"run-{name}", spec, steps)
    resumed = timed_train(folder / f"run-{name}", spec, 2 * steps)
    row = {"corpus": spec, "files": len(files), "megabytes": round(megabytes, 1), "data_path": alone,
           "tokenizer_mb_per_s": round(megabytes / alone["tokenizer_s"], 2),
           "cache_mb_per_s": round(megabytes / alone["cache_s"], 2), "fresh_run": fresh, "resumed_run": resumed}
    print(json.dumps(row, indent=1), flush=True)
    return row


def cpu_model() -> str:
    found = re.search(r"Model name:\s*(.+)", subprocess.run(["lscpu"], capture_output=True, text=True).stdout)
    return found.group(1).strip() if found else platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="where the corpus and the runs go (not the repo)")
    parser.add_argument("--parts", type=int, default=10, help="50 MB files in the large corpus")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    paths = make_corpus(args.folder, args.parts)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rows = [measure(args.folder, str(paths[0]), "small", args.steps),
            measure(args.folder, str(args.folder / "part-*.txt"), "large", args.steps)]
    machine = {"cpu": cpu_model(), "logical_cpus": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
               "python": platform.python_version()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"measured": started, "machine": machine, "steps": args.steps, "rows": rows},
                                   indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""Case 10's beam search with the cache rows left in place (`KVCache.follow`) against every row copied.

The translation workload of case 10 (`benchmarks.engines`: marian-base shape with an 8,000-word vocabulary,
seeded random weights, beam 4, 32 sources of 30 tokens, exactly 40 new tokens), 2 threads, fp32 and
int8-dynamic weights. Each search runs twice a round, alternated: as attn runs it (after a step, only the cache
rows that no beam continues are overwritten) and with every step's `follow` replaced by a `reorder` of all
rows into beam order (what beam search did before `follow`). Reports the median seconds of each, the share of
rows `follow` copied, the seconds spent in it, and whether both give the same hypotheses.

    python benchmarks/probes/beam-cache-rows.py benchmarks/results/engines-cpu/beam-cache-rows.json
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor

from attn.artifacts import load_model
from attn.core.kv_cache import KVCache
from attn.core.quantized import quantize
from benchmarks.engines import (
    BEAMS,
    TRANSLATION,
    VOCAB,
    export_translation,
    translate_in_process,
)
from benchmarks.harness import device_name, git_commit

ROUNDS = 7
THREADS = 2
FOLLOW = KVCache.follow


def copy_every_row(cache: KVCache, parents: Tensor) -> Tensor:
    """`follow` as a full reorder: every row copied into beam order."""
    cache.reorder(parents)
    return torch.arange(parents.numel(), device=parents.device)


def counting(tally: dict[str, float]):
    """`KVCache.follow` that adds the rows it is given, the rows it copies and its seconds to `tally`."""

    def follow(cache: KVCache, parents: Tensor) -> Tensor:
        started = time.perf_counter()
        rows = FOLLOW(cache, parents)
        tally["seconds"] += time.perf_counter() - started
        tally["rows"] += parents.numel()
        tally["copied"] += int((rows != parents).sum())
        return rows

    return follow


def timed(search) -> tuple[float, list]:
    started = time.perf_counter()
    found = search()
    return time.perf_counter() - started, [[h.tokens for h in hypotheses] for hypotheses in found]


def main(out: Path) -> None:
    torch.set_num_threads(THREADS)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        sources = export_translation(Path(scratch))
        for scheme in ("fp32", "int8-dynamic"):
            model = load_model(Path(scratch), "cpu").model
            model = model if scheme == "fp32" else quantize(model, scheme)
            search = functools.partial(translate_in_process, model, sources)

            seconds: dict[str, list[float]] = {"follow": [], "every row copied": []}
            outputs = {}
            for round_ in range(ROUNDS + 1):
                for name, step in (("follow", FOLLOW), ("every row copied", copy_every_row)):
                    KVCache.follow = step
                    try:
                        took, outputs[name] = timed(search)
                    finally:
                        KVCache.follow = FOLLOW
                    if round_:
                        seconds[name].append(took)
            tally = {"rows": 0, "copied": 0, "seconds": 0.0}
            KVCache.follow = counting(tally)
            try:
                whole, _ = timed(search)
            finally:
                KVCache.follow = FOLLOW
            median = {name: statistics.median(values) for name, values in seconds.items()}
            results[scheme] = {
                "median_s": {name: round(value, 4) for name, value in median.items()},
                "rounds_s": {name: [round(v, 4) for v in values] for name, values in seconds.items()},
                "shorter": round(1 - median["follow"] / median["every row copied"], 4),
                "rows_copied_share": round(tally["copied"] / tally["rows"], 4),
                "follow_s_of_one_search": [round(tally["seconds"], 4), round(whole, 4)],
                "same_hypotheses": outputs["follow"] == outputs["every row copied"],
            }
    record = {
        "command": f"python benchmarks/probes/beam-cache-rows.py {out}",
        "commit": git_commit(),
        "machine": {"device": device_name(torch.device("cpu")), "threads": THREADS, "torch": torch.__version__,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "workload": {**TRANSLATION, "beam": BEAMS, "vocab": VOCAB, "model": "marian-base"},
        "rounds": ROUNDS,
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

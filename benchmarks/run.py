"""Runs the side-by-side benchmark suite and writes its JSON files and Markdown table.

    python -m benchmarks.run                    # the full CPU run (about 30-40 minutes on 2 cores)
    python -m benchmarks.run --quick            # tiny shapes, a smoke run of every case (< 3 minutes)
    python -m benchmarks.run --cases 1,7        # some cases only
    python -m benchmarks.run --cases 1 --models gpt2   # some training presets only
    python -m benchmarks.run --device cuda --dtype bf16 --compile

Cases: 1 training throughput, 2 greedy generation, 3 beam search, 4 sentence embeddings,
5 scaling with length, 6 peak training memory, 7 dense-matmul peak and MFU; 8 the
quickstart recipes' training steps on the CPU; 9 a real chat model (SmolLM2-135M-Instruct from its
GGUF file) decoding greedily; 10 attn beside the CPU inference engines CTranslate2 and llama.cpp; 11 GGUF files
(SmolLM2's and a 1B-shaped one) decoded by attn beside llama.cpp on the same file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.harness import (
    DTYPES,
    RESULTS_DIR,
    CaseResult,
    Settings,
    markdown,
    write_case,
)

TABLE = "results.md"
QUICK_DIR = RESULTS_DIR / "quick"
PLOT = "scaling.png"
REPETITIONS = {"quick": (1, 2), "cpu": (1, 5), "cuda": (3, 10)}  # (warm-up rounds, timed rounds)

Runner = Callable[[Settings, float | None], CaseResult]


def _runners() -> dict[int, Runner]:
    from benchmarks import (
        chat_model,
        embeddings,
        engines,
        generation,
        gguf_speed,
        memory,
        peak,
        quickstart,
        scaling,
        training,
    )

    return {
        1: training.run,
        2: lambda settings, _: generation.greedy(settings),
        3: lambda settings, _: generation.beam(settings),
        4: lambda settings, _: embeddings.run(settings),
        5: lambda settings, _: scaling.run(settings),
        6: lambda settings, _: memory.run(settings),
        7: lambda settings, _: peak.run(settings),
        8: quickstart.run,
        9: lambda settings, _: chat_model.run(settings),
        10: lambda settings, _: engines.run(settings),
        11: lambda settings, _: gguf_speed.run(settings),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from benchmarks.gguf_speed import FILES as GGUF_FILES
    from benchmarks.training import CONTENDERS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="1,2,3,4,5,6,7,8,9,10", help="comma-separated case numbers, 1 to 11 (default: 1 to 10; case 11 "
                        "runs on its own: it writes a 0.8 GB file once and takes about half an hour)")
    parser.add_argument("--models", default="", help=f"comma-separated training presets for cases 1 and 6, "
                        f"from {', '.join(CONTENDERS)}, and files for case 11, from {', '.join(GGUF_FILES)} "
                        "(default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 1 warm-up + 2 timed rounds")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="default fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile the training models")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads (default: %(default)s)")
    parser.add_argument("--warmup", type=int, help="untimed rounds (default: 1; 3 on a GPU)")
    parser.add_argument("--reps", type=int, help="timed rounds (default: 5, 2 with --quick; 10 on a GPU)")
    parser.add_argument("--out", type=Path,
                        help=f"output folder (default {RESULTS_DIR}/cases-DEVICE, or {QUICK_DIR} with --quick)")
    return parser.parse_args(argv)


def _cases(text: str) -> list[int]:
    try:
        numbers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SystemExit(f"--cases: expected comma-separated numbers such as 1,2,7, got {text!r}") from None
    unknown = [n for n in numbers if n not in range(1, 12)]
    if unknown or not numbers:
        raise SystemExit(f"--cases: the cases are 1 to 11, got {text!r}")
    return numbers


def _models(text: str) -> tuple[str, ...]:
    from benchmarks.gguf_speed import FILES as GGUF_FILES
    from benchmarks.training import CONTENDERS

    models = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [model for model in models if model not in (*CONTENDERS, *GGUF_FILES)]
    if unknown:
        raise SystemExit(f"--models: the training presets are {', '.join(CONTENDERS)} and the files of case 11 "
                         f"{', '.join(GGUF_FILES)}, got {text!r}")
    return models


def settings_from_args(args: argparse.Namespace) -> Settings:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this torch sees no GPU; run on CPU or on a machine with CUDA")
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    kind = "quick" if args.quick else ("cuda" if device.type == "cuda" else "cpu")
    warmup, reps = REPETITIONS[kind]
    out_dir = args.out or (QUICK_DIR if args.quick else RESULTS_DIR / f"cases-{device.type}")
    return Settings(
        device=device, dtype=DTYPES[args.dtype], threads=args.threads, compile=args.compile, quick=args.quick,
        warmup=warmup if args.warmup is None else args.warmup, reps=reps if args.reps is None else args.reps,
        out_dir=out_dir, plot=out_dir / PLOT, models=_models(args.models),
    )


def run_cases(numbers: Sequence[int], settings: Settings) -> tuple[list[CaseResult], list[int]]:
    """Runs the cases (case 7 first: case 1's MFU needs its peak), writing each result as it comes.

    Returns:
        The results, and the numbers of the cases that failed (their tracebacks go to stderr).
    """
    from benchmarks.peak import peak_of

    runners, results, failed = _runners(), [], []
    peak = None
    for number in sorted(numbers, key=lambda n: n != 7):
        start = time.perf_counter()
        print(f"case {number} ...", file=sys.stderr, flush=True)
        try:
            result = runners[number](settings, peak)
        except Exception:  # a broken case must not lose the others' results
            traceback.print_exc()
            failed.append(number)
            continue
        peak = peak_of(result, settings) if number == 7 else peak
        results.append(result)
        write_case(result, settings)
        ordered = sorted(results, key=lambda r: r.number)
        (settings.out_dir / TABLE).write_text(markdown(ordered, settings), encoding="utf-8")
        print(f"case {number} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return sorted(results, key=lambda r: r.number), failed


def main(argv: Sequence[str] | None = None) -> int:
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    args = parse_args(argv)
    numbers = _cases(args.cases)
    settings = settings_from_args(args)
    torch.set_num_threads(settings.threads)
    results, failed = run_cases(numbers, settings)
    if results:
        print(markdown(results, settings))
        print(f"written: {settings.out_dir / TABLE} and case<N>.json", file=sys.stderr)
    if failed:
        print(f"failed cases: {', '.join(map(str, failed))} (tracebacks above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

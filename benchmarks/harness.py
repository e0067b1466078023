"""What every case shares: the run settings, alternating timed repetitions, result rows and their files.

Method: every contender of a comparison is built first and kept alive, then called in turn
(A B A B ...) for `warmup` untimed rounds and `reps` timed ones, so a slow drift of the machine
(another process, thermal limits) touches all of them alike. Each repetition gives one throughput
(work units / second); a row reports their median, minimum and maximum and the ratio of the
medians `attn / peer`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OURS = "attn"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a run measures; the same for every contender of every case.

    Attributes:
        device: where models run.
        dtype: float32, or bfloat16 (autocast for training and embeddings, bf16 weights for decoding).
        threads: `torch.set_num_threads` value, set once for the whole run.
        compile: whether training models go through `torch.compile`.
        quick: tiny shapes and few repetitions, a smoke run of the whole suite.
        warmup: untimed rounds before timing.
        reps: timed rounds.
        out_dir: where the JSON files and the Markdown table go.
        plot: where case 5 draws its figure.
        models: the training presets cases 1 and 6 measure (empty: all of them).
    """

    device: torch.device
    dtype: torch.dtype
    threads: int
    compile: bool
    quick: bool
    warmup: int
    reps: int
    out_dir: Path
    plot: Path
    models: tuple[str, ...] = ()

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for training in bf16 (weights stay fp32); nothing in fp32."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def sync(self) -> None:
        """Waits for queued GPU work, so a timer sees the whole of it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def describe(self) -> dict[str, Any]:
        """The machine and the settings, recorded with every result file."""
        return {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(),
            "device": device_name(self.device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "dtype": self.dtype_name,
            "compile": self.compile,
            "quick": self.quick,
            "warmup": self.warmup,
            "reps": self.reps,
            "peers": peer_versions(),
        }


def dtype_name(dtype: torch.dtype) -> str:
    """The command-line name of a dtype ("fp32", "bf16")."""
    return next(name for name, value in DTYPES.items() if value == dtype)


def git_commit() -> str:
    """The checked-out commit (with "+changes" when the work tree differs outside `benchmarks/results/`, whose
    files a run writes as it goes), or "unknown" outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  ":(exclude)benchmarks/results"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+changes" if changed else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} logical CPUs"


def peer_versions() -> dict[str, str]:
    """Versions of the peer libraries that are installed."""
    from importlib import metadata

    versions = {}
    for package in ("transformers", "sentence-transformers", "ctranslate2", "llama_cpp_python"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return versions


@dataclasses.dataclass
class Contender:
    """One implementation in a comparison: each `run()` call does `work` units (tokens, sentences...)."""

    name: str
    run: Callable[[], Any]
    work: float


class ContendersDisagree(RuntimeError):
    """The contenders of a setting produced different outputs: their timings compare different work."""


def require_same(setting: str, outputs: dict[str, Sequence[Any]]) -> None:
    """Fails the case unless every contender produced the first one's outputs, row for row.

    Args:
        setting: the row's setting, named in the error.
        outputs: contender name -> one output per row (e.g. token lists), attn first.

    Raises:
        ContendersDisagree: naming the contender and the first row that differs.
    """
    (first, expected), *others = outputs.items()
    for name, got in others:
        if list(got) != list(expected):
            rows = [i for i, (a, b) in enumerate(zip(expected, got)) if a != b] or [min(len(expected), len(got))]
            raise ContendersDisagree(
                f"{setting}: {name} and {first} differ at row {rows[0]} ({len(rows)} rows differ): "
                f"{first} {_fmt_row(expected, rows[0])}, {name} {_fmt_row(got, rows[0])}"
            )


def _fmt_row(rows: Sequence[Any], index: int) -> str:
    return repr(rows[index]) if index < len(rows) else "(no such row)"


def timed(fn: Callable[[], Any], settings: Settings) -> float:
    """Seconds one call of `fn` takes, with queued GPU work included and garbage collected beforehand."""
    gc.collect()
    settings.sync()
    start = time.perf_counter()
    fn()
    settings.sync()
    return time.perf_counter() - start


def self_timed(fn: Callable[[], float], settings: Settings) -> float:
    """The seconds that `fn` reports: a contender in another process times its own calls."""
    return fn()


def compare(
    contenders: Sequence[Contender], settings: Settings, clock: Callable[[Callable[[], Any], Settings], float] = timed
) -> dict[str, list[float]]:
    """Runs the contenders in turn (A B A B ...), first untimed, then timed.

    Args:
        clock: gives the seconds of one call of a contender's `run` (`timed`, or `self_timed`).

    Returns:
        contender name -> throughput (work / second) of each timed repetition.
    """
    for _ in range(settings.warmup):
        for contender in contenders:
            contender.run()
    rates: dict[str, list[float]] = {c.name: [] for c in contenders}
    for _ in range(settings.reps):
        for contender in contenders:
            rates[contender.name].append(contender.work / clock(contender.run, settings))
    return rates


@dataclasses.dataclass
class Row:
    """One contender's figures at one setting of a case.

    Attributes:
        setting: the shape or configuration measured, e.g. "gpt2 T=128 B=8".
        contender: "attn" or the peer's name.
        unit: what `values` count, e.g. "tokens/s" or "MB".
        values: one figure per repetition; none where the contender could not run (its notes say why).
        ratio: median of attn / median of this contender at the same setting (`rows_for`), or of this
            contender / a reference contender (`rows_against`); None on attn's own row and without values.
        notes: other figures of the row (MFU, whether the outputs matched, ...).
    """

    setting: str
    contender: str
    unit: str
    values: list[float]
    ratio: float | None = None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "median": self.median if self.values else None,
            "min": min(self.values, default=None),
            "max": max(self.values, default=None),
        }


def rows_for(setting: str, unit: str, values: dict[str, list[float]]) -> list[Row]:
    """Rows of one setting, attn first, each peer with the ratio attn / peer of the medians."""
    rows = [Row(setting, name, unit, figures) for name, figures in values.items()]
    ours = next(row for row in rows if row.contender == OURS)
    for row in rows:
        if row is not ours:
            row.ratio = ours.median / row.median
    return [ours] + [row for row in rows if row is not ours]


def rows_against(setting: str, unit: str, values: dict[str, list[float]], reference: str) -> list[Row]:
    """Rows of one setting in the order of `values`, each with the ratio of its median to the reference's
    (1.00 on the reference's own row; none on a row without values).

    Args:
        values: contender name -> figures; an empty list where the contender did not run.
        reference: the contender every row is divided by.
    """
    rows = [Row(setting, name, unit, figures) for name, figures in values.items()]
    base = next(row for row in rows if row.contender == reference).median
    for row in rows:
        row.ratio = row.median / base if row.values else None
    return rows


@dataclasses.dataclass
class CaseResult:
    """Everything one case measured.

    Attributes:
        number: the case number.
        title: a one-line description.
        ratio_means: how to read the ratio column, e.g. "> 1: attn is faster".
        rows: the figures.
        summary: case-level figures (fitted exponents, the plot's path, the matmul peak, ...).
        ratio: what the ratio column divides (`rows_for`'s "attn / peer", or what `rows_against` was given).
    """

    number: int
    title: str
    ratio_means: str
    rows: list[Row]
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    ratio: str = "attn / peer"

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "title": self.title,
            "ratio": self.ratio,
            "ratio_means": self.ratio_means,
            "rows": [row.to_dict() for row in self.rows],
            "summary": self.summary,
        }


def write_case(result: CaseResult, settings: Settings) -> Path:
    """Writes `case<N>.json` (the settings, the machine and every repetition) into the output folder."""
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    path = settings.out_dir / f"case{result.number}.json"
    document = {"settings": settings.describe(), **result.to_dict()}
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def script_record(script: str, argv: Sequence[str] | None, model: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The head of a benchmark script's record: its command (`python -m benchmarks.<script> ...`), the date, the
    commit, the machine, torch and its threads, the machine's load now (`uptime`), the model and the settings."""
    return {"command": f"python -m benchmarks.{script} " + shlex.join(sys.argv[1:] if argv is None else argv),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(), "machine": device_name(torch.device("cpu")), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_before": subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip(),
            "model": model, "settings": settings}


def write_record(out_dir: Path, suffix: str, record: dict[str, Any], text: str) -> None:
    """Writes a script's record as `<date><suffix>.json` and its Markdown `text` as `.md` into `out_dir`, and
    prints the text and where both went."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / (datetime.datetime.now().strftime("%Y%m%dT%H%M%S") + suffix)
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)
    print(f"written: {stem}.json, {stem}.md")


def markdown(results: Sequence[CaseResult], settings: Settings) -> str:
    """One Markdown section per case: a table of median, min, max and ratio, then the case summary."""
    info = settings.describe()
    lines = [
        f"Measured {info['date']} (commit {info['commit']}) on {info['device']}; torch {info['torch']}, "
        f"{info['threads']} threads, "
        f"{info['dtype']}, compile={info['compile']}, {info['warmup']} warm-up + {info['reps']} timed "
        f"rounds{' (quick)' if settings.quick else ''}; peers: "
        + ", ".join(f"{name} {version}" for name, version in info["peers"].items()),
        "",
    ]
    for result in results:
        lines += [f"### {result.number}. {result.title}", "", f"Ratio = {result.ratio}; {result.ratio_means}.", ""]
        lines += _table(result.rows)
        lines += [f"- {key}: {_fmt(value)}" for key, value in result.summary.items()]
        lines.append("")
    return "\n".join(lines)


def _table(rows: Sequence[Row]) -> list[str]:
    lines = [
        "| setting | contender | unit | median | min | max | ratio | notes |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        notes = "; ".join(f"{key} {_fmt(value)}" for key, value in row.notes.items())
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
        figures = [_fmt(f) for f in (row.median, min(row.values), max(row.values))] if row.values else ["", "", ""]
        lines.append(f"| {row.setting} | {row.contender} | {row.unit} | {' | '.join(figures)} | {ratio} | {notes} |")
    return lines + [""]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)

"""Case 6: peak memory of case 1's training steps, each contender and shape in a fresh process.

A fresh process per measurement keeps one contender's peak out of another's. The probe first
trains the contender's tiny variant for two steps, so the libraries it needs are imported and
initialised, and notes the memory then in use; it then builds the model and its optimizer and
trains `STEPS` steps. The compared figure, "training memory", is the peak of those steps minus
the memory in use with the libraries loaded: weights, gradients, AdamW state, activations and
temporaries. The absolute peak (libraries included) is noted too.
- CPU: resident set size. The high-water mark is reset once the model is built (Linux
  `/proc/self/clear_refs`), because building a Hugging Face peer briefly holds our exported twin
  too; glibc is told to map every block of 64 KiB or more on its own (`MALLOC_MMAP_THRESHOLD_`), so
  freed tensors leave the resident set at once instead of staying in the heap. Linux only.
- GPU: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`.

Run by `benchmarks.run`; `python -m benchmarks.memory '<request JSON>'` is the probe itself.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks import training
from benchmarks.harness import DTYPES, CaseResult, Row, Settings, rows_for

STEPS = 3
MB = 2**20
ROOT = Path(__file__).resolve().parents[1]
PROBE_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}: the CPU memory probe needs Linux")


def resident_bytes(peak: bool = False) -> float:
    """The resident set of this process now, or its high-water mark (Linux). The mark is this program's own:
    `getrusage`'s `ru_maxrss` would start from the parent's resident set, which it keeps across fork and exec."""
    return _status_kb("VmHWM" if peak else "VmRSS") * 1024.0


def _current(device: torch.device) -> float:
    """Bytes in use now: resident set on CPU, allocated tensors on GPU."""
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    return resident_bytes()


def reset_peak(device: torch.device) -> None:
    """Starts the peak over from the memory in use now (Linux on the CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _peak(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return resident_bytes(peak=True)


def _load_libraries(shape: training.Shape, contender: str, settings: Settings) -> None:
    """Trains the contender's tiny variant for two steps, so every lazily imported module is loaded."""
    tiny = training.Shape(shape.model, training.QUICK_SEQUENCES[0], 1)
    step = training.prepared_step(tiny, contender, dataclasses.replace(settings, quick=True, compile=False))
    step()
    step()


def probe(request: dict[str, Any]) -> dict[str, float]:
    """Builds one contender at one shape and trains `STEPS` steps.

    Returns:
        Bytes in use once the libraries are loaded ("loaded") and at the peak of the steps.
    """
    settings = settings_from(request["settings"])
    torch.set_num_threads(settings.threads)
    shape, contender = training.Shape(**request["shape"]), request["contender"]
    _load_libraries(shape, contender, settings)
    gc.collect()
    loaded = _current(settings.device)
    step = training.prepared_step(shape, contender, settings)
    gc.collect()
    reset_peak(settings.device)  # building a peer briefly holds our exported twin as well
    for _ in range(STEPS):
        step()
    settings.sync()
    return {"loaded": loaded, "peak": _peak(settings.device)}


def settings_to(settings: Settings) -> dict[str, Any]:
    """The settings as JSON for the probe's command line."""
    document = dataclasses.asdict(settings)
    return {**document, "device": str(settings.device), "dtype": settings.dtype_name,
            "out_dir": str(settings.out_dir), "plot": str(settings.plot)}


def settings_from(document: dict[str, Any]) -> Settings:
    """The settings `settings_to` wrote."""
    paths = {"out_dir": Path(document["out_dir"]), "plot": Path(document["plot"])}
    return Settings(**{**document, **paths, "device": torch.device(document["device"]),
                       "dtype": DTYPES[document["dtype"]],
                       "models": tuple(document.get("models", ()))})


def measure(shape: training.Shape, contender: str, settings: Settings) -> dict[str, float]:
    """Runs the probe for one contender and shape in a fresh Python process."""
    request = {"shape": dataclasses.asdict(shape), "contender": contender, "settings": settings_to(settings)}
    command = [sys.executable, "-m", "benchmarks.memory", json.dumps(request)]
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **PROBE_ENV}, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"memory probe of {contender} at {shape.label} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(settings: Settings) -> CaseResult:
    """Case 6."""
    rows: list[Row] = []
    shapes = training.shapes(settings)
    if settings.quick:  # one sequence length per model keeps the smoke run short
        shapes = [shape for shape in shapes if shape.seq == training.QUICK_SEQUENCES[0]]
    for shape in shapes:
        found = {name: measure(shape, name, settings) for name in training.CONTENDERS[shape.model]}
        values = {name: [(m["peak"] - m["loaded"]) / MB] for name, m in found.items()}
        shape_rows = rows_for(shape.label, "MB", values)
        for row in shape_rows:
            row.notes["peak MB"] = found[row.contender]["peak"] / MB
        rows += shape_rows
    where = "GPU tensors (max_memory_allocated)" if settings.device.type == "cuda" else "resident set size"
    summary = {"measured": f"{where}, {STEPS} steps in a fresh process per row; one measurement per row"}
    return CaseResult(6, "Peak training memory of case 1 (peak minus the loaded libraries)",
                      "< 1: attn needs less memory", rows, summary)


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))

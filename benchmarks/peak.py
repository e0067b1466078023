"""Case 7: the machine's own dense-matmul peak, a large fp32 and bf16 `torch.mm`, measured in the same run.

The peak of a dtype is the best repetition (the machine can do at least that much); case 1 divides
its achieved model FLOP/s by the peak of the run's dtype to give each training row's MFU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from benchmarks.harness import (
    DTYPES,
    CaseResult,
    Contender,
    Row,
    Settings,
    compare,
    dtype_name,
)

SIZES = {"cpu": 4096, "cuda": 8192}
QUICK_SIZE = 1024


def _matmul(n: int, dtype: torch.dtype, settings: Settings) -> Contender:
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(settings.device, dtype) for _ in range(2))
    return Contender(f"torch.mm {dtype_name(dtype)}", lambda: torch.mm(a, b), 2 * n**3)


def run(settings: Settings, dtypes: Sequence[torch.dtype] = tuple(DTYPES.values())) -> CaseResult:
    """Case 7. The summary holds `peak FLOP/s <dtype>` for every dtype measured."""
    n = QUICK_SIZE if settings.quick else SIZES["cuda" if settings.device.type == "cuda" else "cpu"]
    contenders = [_matmul(n, dtype, settings) for dtype in dtypes]
    rates = compare(contenders, settings)
    rows = [Row(f"n={n}", name, "TFLOP/s", [r / 1e12 for r in values]) for name, values in rates.items()]
    summary = {f"peak FLOP/s {name.split()[-1]}": max(values) for name, values in rates.items()}
    summary["MFU"] = "each training row of case 1 notes its MFU against the peak of the run's dtype"
    return CaseResult(7, f"Dense-matmul peak ({n} x {n} torch.mm)", "no peer: the machine's own limit", rows,
                      summary)


def peak_of(result: CaseResult, settings: Settings) -> float:
    """The peak FLOP/s of the run's dtype from a case-7 result."""
    return float(result.summary[f"peak FLOP/s {settings.dtype_name}"])

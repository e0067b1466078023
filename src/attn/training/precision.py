"""The numeric precision of the matrix work, chosen from what this machine does, not assumed.

bfloat16 autocast halves memory traffic and runs several times faster than float32 on hardware with bf16 matrix
units (recent GPUs, CPUs with AVX-512 BF16 or AMX). On a CPU without them PyTorch emulates it, many times *slower*,
and a recipe tuned for a few minutes then makes a small fraction of its updates. So `precision = "auto"` measures:

- on a GPU: bf16 when the device supports it (`torch.cuda.is_bf16_supported()`), else fp32;
- on a CPU: a probe times one matmul of the model's shape (`probe_shape`) in fp32 and under bf16 autocast, once
  per process and shape; where bf16 is emulated the run trains in fp32. A matmul measurably faster in bf16
  (`BF16_MIN_SPEEDUP`) is not yet a faster training step (autocast casts every weight at every pass and leaves the
  softmaxes, norms and optimizer in fp32), and so short a product is timed roughly
  (`benchmarks/results/precision/`). So a time-budgeted run's set-up (`attn.training.machine`) times training
  passes in both precisions wherever the probe did not find bf16 emulated (`PASSES_MIN_SPEEDUP`), and those
  passes decide, in either direction (`passes_decide`).

An explicit "bf16" is obeyed, with a warning when the probe finds it slower than fp32; "fp16" needs a GPU's
gradient scaler, and on a CPU training runs in fp32 and says so. `ATTN_AUTO_PRECISION` (`bf16` or `fp32`) makes
"auto" choose that precision on a CPU without probing, so that tests take either path on any CPU; unset or
`probe`, "auto" measures.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from attn.artifacts.dtypes import AUTO_ENV, auto_precision

BF16_MIN_SPEEDUP = 1.1  # "measurably faster": bf16 must beat fp32 by this factor to be chosen
PASSES_MIN_SPEEDUP = 0.5  # a matmul probe below this found bf16 emulated: its training passes are not worth timing
_PROBE_BUDGET_S = 0.05  # the timed repetitions of one dtype stop once they have taken this long
_PROBE_REPS = 20


class Precision(str, enum.Enum):
    AUTO = "auto"  # bf16 where it is measurably faster than fp32 on this device, else fp32
    FP32 = "fp32"
    BF16 = "bf16"  # autocast to bfloat16, on GPU or CPU
    FP16 = "fp16"  # autocast to float16 with a gradient scaler, GPU only


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses, why, and the probe's figures when there was a probe.

    Attributes:
        used: what runs: FP32, BF16 or FP16 (never AUTO).
        reason: a short phrase for people: how the bf16 probe compared with fp32, or why there was no probe.
        fp32_ms, bf16_ms: the probe's best time of one matmul in each precision, or None.
        warning: a line to show the user when their explicit choice is a poor one, or "".
        fp32_pass_ms, bf16_pass_ms: the median time of a training pass in each precision, or None where none ran.
    """

    requested: Precision
    used: Precision
    reason: str
    fp32_ms: float | None = None
    bf16_ms: float | None = None
    warning: str = ""
    fp32_pass_ms: float | None = None
    bf16_pass_ms: float | None = None

    @property
    def bf16_speedup(self) -> float | None:
        """fp32 time / bf16 time of the probe (above 1: bf16 is faster), or None without a probe."""
        if self.fp32_ms is None or self.bf16_ms is None:
            return None
        return self.fp32_ms / self.bf16_ms

    @property
    def wants_passes(self) -> bool:
        """Whether a run's set-up should time training passes before keeping this choice: "auto" chose on the
        matmul probe's word alone, and that probe did not find bf16 emulated."""
        return (self.requested == Precision.AUTO and self.bf16_speedup is not None
                and self.bf16_speedup >= PASSES_MIN_SPEEDUP and self.fp32_pass_ms is None)

    def describe(self) -> str:
        """One line for the run's log."""
        return f"precision {self.used.value} (requested {self.requested.value}: {self.reason})"

    def record(self) -> dict[str, Any]:
        """The JSON-ready fields of a `metrics.jsonl` record."""
        out: dict[str, Any] = {"precision": self.used.value, "precision_requested": self.requested.value,
                               "precision_reason": self.reason}
        if self.bf16_speedup is not None:
            out.update(probe_fp32_ms=self.fp32_ms, probe_bf16_ms=self.bf16_ms, bf16_speedup=self.bf16_speedup)
        if self.fp32_pass_ms is not None:
            out.update(pass_fp32_ms=self.fp32_pass_ms, pass_bf16_ms=self.bf16_pass_ms)
        return out


def passes_decide(choice: PrecisionChoice, fp32_s: float, bf16_s: float) -> PrecisionChoice:
    """`choice` (see `PrecisionChoice.wants_passes`) after timing the run's training passes: bf16 where its
    median pass is `BF16_MIN_SPEEDUP` times faster than fp32's, whatever the matmul probe chose, else fp32.

    >>> matmul = PrecisionChoice(Precision.AUTO, Precision.BF16, "", fp32_ms=0.44, bf16_ms=0.12)
    >>> passes_decide(matmul, 0.270, 0.400).describe()
    'precision fp32 (requested auto: a bf16 training pass runs at 0.68x the speed of fp32 on this CPU, a matmul at 3.7x)'
    >>> misjudged = PrecisionChoice(Precision.AUTO, Precision.FP32, "", fp32_ms=0.25, bf16_ms=0.26)
    >>> passes_decide(misjudged, 0.270, 0.180).used.value
    'bf16'
    """
    speedup = fp32_s / bf16_s
    used = Precision.BF16 if speedup >= BF16_MIN_SPEEDUP else Precision.FP32
    reason = (f"a bf16 training pass runs at {speedup:.2g}x the speed of fp32 on this CPU, "
              f"a matmul at {choice.bf16_speedup:.2g}x")
    return dataclasses.replace(choice, used=used, reason=reason, fp32_pass_ms=1e3 * fp32_s, bf16_pass_ms=1e3 * bf16_s)


# seconds of one probe matmul: (device, (M, K, N), autocast dtype or None for plain fp32) -> seconds
MatmulTimer = Callable[[torch.device, tuple[int, int, int], "torch.dtype | None"], float]


def probe_shape(d_model: int, d_ff: int, tokens: int = 128) -> tuple[int, int, int]:
    """(M, K, N) of the probe: `tokens` rows times the model's first feed-forward matrix, kept between
    128 x 256 (smaller products time call overhead, not arithmetic) and 256 x 512 (so that an
    emulated bf16 product takes tens of milliseconds, not seconds)."""
    return tokens, min(max(d_model, 128), 256), min(max(d_ff, 256), 512)


def time_matmul(device: torch.device, shape: tuple[int, int, int], autocast: torch.dtype | None) -> float:
    """The best time in seconds of one (M, K) @ (K, N) float32 matmul, under autocast to `autocast` if given.

    One untimed call, then up to `_PROBE_REPS` timed ones (one call is short where bf16 units do it) until they
    have taken `_PROBE_BUDGET_S` (one emulated bf16 call says enough). On a CPU it runs on one thread: the ratio of
    the precisions is a property of a core, and one thread is not thrown off by processes competing for the cores.
    """
    m, k, n = shape
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device)
    b = torch.randn(k, n, generator=generator).to(device)

    def once() -> float:
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        once()
        times: list[float] = []
        while len(times) < _PROBE_REPS and sum(times) < _PROBE_BUDGET_S:
            times.append(once())
    finally:
        torch.set_num_threads(threads)
    return min(times)


@functools.lru_cache(maxsize=None)
def _probe(device: torch.device, shape: tuple[int, int, int]) -> tuple[float, float]:
    """(fp32 seconds, bf16 seconds) of the default timer, once per process, device and shape."""
    return time_matmul(device, shape, None), time_matmul(device, shape, torch.bfloat16)


def choose_precision(
    requested: Precision | str, device: torch.device, shape: tuple[int, int, int],
    timer: MatmulTimer | None = None,
) -> PrecisionChoice:
    """The precision to train (or run) in on `device`: what to use, why, and the probe's figures.

    Args:
        shape: the probe's (M, K, N), see `probe_shape`.
        timer: times one matmul (tests pass a fake one); default `time_matmul`, cached per process.
    """
    requested = Precision(requested)
    if requested == Precision.FP32:
        return PrecisionChoice(requested, Precision.FP32, "as configured")
    if device.type == "cuda":
        return _choose_on_gpu(requested, device)
    if requested == Precision.FP16:
        return PrecisionChoice(requested, Precision.FP32, "fp16 needs a GPU", warning=(
            "train.precision = fp16 needs a GPU's gradient scaler; this run trains in fp32 on the CPU "
            "(set precision = \"auto\" or \"fp32\" to silence this)"))
    if requested == Precision.AUTO and (forced := auto_override()) is not None:
        return PrecisionChoice(requested, forced, f"{AUTO_ENV}={forced.value}")
    fp32_s, bf16_s = _probe(device, shape) if timer is None else (timer(device, shape, None),
                                                                   timer(device, shape, torch.bfloat16))
    speedup = fp32_s / bf16_s
    figures = dict(fp32_ms=1e3 * fp32_s, bf16_ms=1e3 * bf16_s)
    reason = f"a bf16 matmul runs at {speedup:.2g}x the speed of fp32 on this CPU"
    if requested == Precision.BF16:
        warning = "" if speedup >= 1.0 else (
            f"train.precision = bf16, but {reason} ({1e3 * bf16_s:.2f} ms against {1e3 * fp32_s:.2f} ms for a "
            f"{shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]} product): training will make far fewer updates; "
            "set precision = \"auto\" or \"fp32\"")
        return PrecisionChoice(requested, Precision.BF16, reason, warning=warning, **figures)
    used = Precision.BF16 if speedup >= BF16_MIN_SPEEDUP else Precision.FP32
    return PrecisionChoice(requested, used, reason, **figures)


def auto_override() -> Precision | None:
    """The precision `ATTN_AUTO_PRECISION` makes "auto" choose on a CPU, or None to probe (`auto_precision`, which
    loading's "auto" dtype reads too).

    Raises:
        ConfigError: the variable holds anything but bf16, fp32, probe or nothing.
    """
    forced = auto_precision()
    return None if forced is None else Precision(forced)


def _choose_on_gpu(requested: Precision, device: torch.device) -> PrecisionChoice:
    supported = torch.cuda.is_bf16_supported()
    if requested == Precision.FP16:
        return PrecisionChoice(requested, Precision.FP16, "as configured")
    if requested == Precision.BF16:
        warning = "" if supported else (
            f"train.precision = bf16, but {torch.cuda.get_device_name(device)} has no bf16 support; "
            "set precision = \"auto\", \"fp16\" or \"fp32\"")
        return PrecisionChoice(requested, Precision.BF16, "as configured", warning=warning)
    if supported:
        return PrecisionChoice(requested, Precision.BF16, "the GPU supports bf16")
    return PrecisionChoice(requested, Precision.FP32, "the GPU has no bf16 support")

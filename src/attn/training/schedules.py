"""Learning-rate schedules as `torch.optim.lr_scheduler.LambdaLR` factors.

Each schedule is a frozen dataclass called with `done`, the optimizer updates already made (LambdaLR's
`last_epoch`), and returns the factor of the base learning rate for the *next* update. The formulas count updates
from 1, so the factor for `done` is the formula at step `done + 1`, and step 0 (where the paper's `step^-0.5` is
undefined) is never evaluated. `Noam` is the paper's schedule (section 5.3; a base rate of 1.0 reproduces it);
`WarmupCosine` is the linear-warmup, cosine-decay schedule of GPT/BERT-style runs, whose base rate is the peak.

A run with a wall-clock budget (`train.max_minutes`) stops at a step nobody knows in advance, so the factor also
takes `budget_used`, the fraction of that budget spent (0 without one). Warmup ends after `warmup` updates or
`warmup_fraction` of the budget, whichever comes first (on a machine slower than the one a recipe was tuned on, a
step-only warmup could outlast the budget), and the cosine decays with whichever of steps and time runs out first.
The factor is warmup ramp x decay, both continuous, so the rate never jumps. Noam ignores the budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from attn.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Noam:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (equation 3).

    Rises linearly for `warmup` steps to its peak d_model^-0.5 * warmup^-0.5, then decays with
    the inverse square root of the step.
    """

    d_model: int
    warmup: int = 4000

    def __post_init__(self) -> None:
        _check_positive("model.d_model", self.d_model)
        _check_positive("optim.warmup_steps", self.warmup)

    def rate(self, step: int) -> float:
        """The formula at 1-based update `step`."""
        return self.d_model**-0.5 * min(step**-0.5, step * self.warmup**-1.5)

    def __call__(self, done: int, budget_used: float = 0.0) -> float:
        return self.rate(done + 1)


def warmup_ramp(step: int, warmup: int, budget_used: float = 0.0, warmup_fraction: float = 0.1) -> float:
    """The linear warmup factor in [0, 1] at 1-based update `step`: step / warmup, or the share of
    the time budget's warmup part already spent (budget_used / warmup_fraction) if that is further."""
    if warmup == 0:
        return 1.0
    return min(1.0, max(step / warmup, budget_used / warmup_fraction))


@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    """Linear warmup (`warmup_ramp`) times a cosine decay to `min_ratio` at `total` steps or at the budget's end;
    the decay's progress is the steps after `warmup` or the budget used, whichever is further."""

    warmup: int
    total: int
    min_ratio: float = 0.0
    warmup_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ConfigError("optim.warmup_steps", f"must be >= 0, got {self.warmup}")
        if self.total <= self.warmup:
            raise ConfigError(
                "train.max_steps",
                f"the cosine schedule needs max_steps > optim.warmup_steps, got {self.total} <= {self.warmup}; "
                "raise max_steps or lower warmup_steps",
            )
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ConfigError("optim.min_lr_ratio", f"must be in [0, 1], got {self.min_ratio}")
        _check_fraction(self.warmup_fraction)

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        """The factor at 1-based update `step`, with `budget_used` of the time budget spent."""
        ramp = warmup_ramp(step, self.warmup, budget_used, self.warmup_fraction)
        steps_done = max(0, step - self.warmup) / (self.total - self.warmup)
        progress = min(1.0, max(steps_done, budget_used))
        return ramp * (self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))

    def __call__(self, done: int, budget_used: float = 0.0) -> float:
        return self.rate(done + 1, budget_used)


@dataclasses.dataclass(frozen=True)
class Constant:
    """Linear warmup (see `warmup_ramp`), then the base learning rate unchanged."""

    warmup: int = 0
    warmup_fraction: float = 0.1

    def __post_init__(self) -> None:
        _check_fraction(self.warmup_fraction)

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        """The factor at 1-based update `step`, with `budget_used` of the time budget spent."""
        return warmup_ramp(step, self.warmup, budget_used, self.warmup_fraction)

    def __call__(self, done: int, budget_used: float = 0.0) -> float:
        return self.rate(done + 1, budget_used)


SCHEDULES = ("noam", "cosine", "constant")


def make_schedule(
    name: str, d_model: int, warmup: int, total: int, min_ratio: float = 0.0, warmup_fraction: float = 0.1
) -> Callable[[int, float], float]:
    """The schedule called `name` ("noam", "cosine" or "constant") as a LambdaLR factor function.

    "noam" uses `d_model`; "cosine" decays to `min_ratio` at `total` updates; under a time budget the warmup of
    "cosine" and "constant" ends after `warmup_fraction` of it at the latest.
    """
    if name == "noam":
        return Noam(d_model, warmup)
    if name == "cosine":
        return WarmupCosine(warmup, total, min_ratio, warmup_fraction)
    if name == "constant":
        return Constant(warmup, warmup_fraction)
    raise ConfigError("schedule", f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def _check_positive(field: str, value: int) -> None:
    if value < 1:
        raise ConfigError(field, f"must be a positive integer, got {value}")


def _check_fraction(value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ConfigError("optim.warmup_fraction", f"must be in (0, 1), got {value}")

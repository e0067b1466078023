"""Learning-rate schedules as `torch.optim.lr_scheduler.LambdaLR` factors.

Each schedule is a small frozen dataclass called with the number of optimizer updates already
made, `done` (LambdaLR's `last_epoch`: 0 before the first update), and returns the factor that
multiplies the optimizer's base learning rate for the *next* update. The formulas count updates
from 1, so the factor for `done` is the formula at step `done + 1`: the first update uses step 1,
and step 0 (where the paper's `step^-0.5` is undefined) is never evaluated.

`Noam` is the paper's schedule (section 5.3) with a base learning rate of 1.0 reproducing it
exactly; `WarmupCosine` is the linear-warmup, cosine-decay schedule of GPT/BERT-style runs,
whose base learning rate is the peak.

A run with a wall-clock budget (`train.max_minutes`) stops at a step nobody knows in advance, so
the factor also takes `budget_used`, the fraction of that budget already spent: the cosine decays
with whichever of steps and time runs out first, and reaches its floor when the time does. Noam and
Constant do not decay towards an end and ignore it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from attn.errors import ConfigError


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


@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    """Linear warmup from 0 to 1 over `warmup` steps, then a cosine decay to `min_ratio` at `total`.

    After `total` steps the factor stays at `min_ratio`.
    """

    warmup: int
    total: int
    min_ratio: float = 0.0

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

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        """The factor at 1-based update `step`, with `budget_used` of the time budget spent."""
        if step <= self.warmup:
            return step / self.warmup
        progress = min(1.0, max((step - self.warmup) / (self.total - self.warmup), budget_used))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def __call__(self, done: int, budget_used: float = 0.0) -> float:
        return self.rate(done + 1, budget_used)


@dataclasses.dataclass(frozen=True)
class Constant:
    """Linear warmup over `warmup` steps, then the base learning rate unchanged."""

    warmup: int = 0

    def rate(self, step: int) -> float:
        """The factor at 1-based update `step`."""
        return min(1.0, step / self.warmup) if self.warmup else 1.0

    def __call__(self, done: int, budget_used: float = 0.0) -> float:
        return self.rate(done + 1)


SCHEDULES = ("noam", "cosine", "constant")


def make_schedule(
    name: str, d_model: int, warmup: int, total: int, min_ratio: float = 0.0
) -> Callable[[int, float], float]:
    """The schedule called `name` ("noam", "cosine" or "constant") as a LambdaLR factor function.

    Args:
        name: schedule name.
        d_model: model width (used by "noam").
        warmup: warmup updates.
        total: the run's total updates (used by "cosine").
        min_ratio: final factor of "cosine".
    """
    if name == "noam":
        return Noam(d_model, warmup)
    if name == "cosine":
        return WarmupCosine(warmup, total, min_ratio)
    if name == "constant":
        return Constant(warmup)
    raise ConfigError("schedule", f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def _check_positive(field: str, value: int) -> None:
    if value < 1:
        raise ConfigError(field, f"must be a positive integer, got {value}")

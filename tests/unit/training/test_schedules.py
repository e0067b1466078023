"""Learning-rate schedules against their formulas, and through torch's LambdaLR."""

import math

import pytest
import torch

from attn.core.errors import ConfigError
from attn.training.schedules import (
    Constant,
    Noam,
    WarmupCosine,
    make_schedule,
    warmup_ramp,
)


def paper_rate(step, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 4000, 40000])
def test_noam_equals_the_papers_formula(step):
    assert Noam(512, 4000).rate(step) == pytest.approx(paper_rate(step), rel=1e-12)


def test_noam_hand_values_and_peak():
    noam = Noam(512, 4000)
    assert noam.rate(1) == pytest.approx(512**-0.5 * 4000**-1.5)  # 1.747e-7
    assert noam.rate(1) == pytest.approx(1.74692811e-07, rel=1e-8)
    assert noam.rate(4000) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak
    assert noam.rate(4000) == pytest.approx(6.98771242e-04, rel=1e-8)
    assert noam.rate(40000) == pytest.approx(2.20970869e-04, rel=1e-8)
    assert max(noam.rate(s) for s in range(1, 20000, 7)) <= noam.rate(4000)


def test_noam_counts_updates_from_one():
    noam = Noam(64, 10)
    assert noam(0) == noam.rate(1) and noam(9) == noam.rate(10)


def test_lambda_lr_applies_the_rate_of_update_n_to_update_n():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=2.0)  # a multiplier of the formula
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Noam(512, 4000))
    seen = []
    for _ in range(3):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([2.0 * paper_rate(s) for s in (1, 2, 3)], rel=1e-12)


def test_cosine_warms_up_linearly_then_decays_to_the_floor():
    schedule = WarmupCosine(warmup=10, total=110, min_ratio=0.1)
    assert schedule.rate(1) == pytest.approx(0.1)
    assert schedule.rate(10) == pytest.approx(1.0)
    assert schedule.rate(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # 0.55
    assert schedule.rate(110) == pytest.approx(0.1)
    assert schedule.rate(500) == pytest.approx(0.1)


def test_cosine_follows_the_time_budget_when_it_runs_out_before_the_steps():
    schedule = WarmupCosine(warmup=10, total=100_000, min_ratio=0.1)
    # 5 of 10 warmup steps, but 90 % of the budget spent: the time ended warmup long ago
    assert schedule.rate(5, budget_used=0.9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(0.9 * math.pi)))
    assert schedule.rate(50, budget_used=0.5) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule.rate(50, budget_used=1.0) == pytest.approx(0.1)
    assert schedule.rate(50, budget_used=1.7) == pytest.approx(0.1)
    steps_first = WarmupCosine(warmup=0, total=100, min_ratio=0.0)
    assert steps_first.rate(75, budget_used=0.5) == pytest.approx(0.5 * (1 + math.cos(0.75 * math.pi)))
    assert Noam(512, 10)(49, budget_used=0.9) == Noam(512, 10)(49)


def test_constant_with_warmup():
    assert [Constant(4).rate(s) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    assert Constant(0).rate(1) == 1.0


def test_warmup_ends_at_its_steps_or_its_share_of_the_time_budget_whichever_comes_first():
    # 200 warmup steps or 10 % of the budget. Hand values: ramp = min(1, max(step / 200, used / 0.1)).
    assert warmup_ramp(20, 200, budget_used=0.0) == pytest.approx(0.1)
    assert warmup_ramp(20, 200, budget_used=0.03) == pytest.approx(0.3)  # the slow machine: time is further
    assert warmup_ramp(150, 200, budget_used=0.03) == pytest.approx(0.75)  # the fast one: steps are
    assert warmup_ramp(20, 200, budget_used=0.1) == 1.0 and warmup_ramp(200, 200) == 1.0
    assert warmup_ramp(1, 0, budget_used=0.0) == 1.0
    assert Constant(200, warmup_fraction=0.2).rate(20, budget_used=0.05) == pytest.approx(0.25)
    cosine = WarmupCosine(warmup=200, total=100_000, min_ratio=0.0, warmup_fraction=0.1)
    # 40 updates into the budget's first 4 %: ramp 0.4, decay progress 0.04
    assert cosine.rate(40, budget_used=0.04) == pytest.approx(0.4 * 0.5 * (1 + math.cos(0.04 * math.pi)))
    # without a budget only steps count, as before: 20 / 200 of the warmup
    assert cosine.rate(20) == pytest.approx(0.1)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match="optim.warmup_fraction"):
            WarmupCosine(warmup=10, total=100, warmup_fraction=bad)


def test_a_time_budget_five_times_too_short_for_the_steps_still_warms_up_and_decays_to_the_floor():
    # A recipe tuned for 1,000 updates with 100 warmup steps, on a machine that makes only 200 in the budget.
    cosine = make_schedule("cosine", 128, warmup=100, total=100_000, min_ratio=0.05, warmup_fraction=0.1)
    factors = [cosine(done, budget_used=done / 200) for done in range(200)]

    def decay(progress):
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))

    # update 21 (done = 20) starts with 10 % of the time spent: warmup is over, the decay is at 0.1
    assert factors[10] == pytest.approx(0.5 * decay(0.05))
    assert factors[20] == pytest.approx(decay(0.1)) and factors.index(max(factors)) == 20
    assert factors[-1] == pytest.approx(decay(199 / 200)) == pytest.approx(0.05, abs=1e-3)  # the floor
    assert all(later < earlier for earlier, later in zip(factors[20:], factors[21:]))


def test_make_schedule_names_and_errors():
    assert isinstance(make_schedule("noam", 512, 4000, 100), Noam)
    assert isinstance(make_schedule("cosine", 512, 10, 100), WarmupCosine)
    with pytest.raises(ConfigError, match="schedule"):
        make_schedule("linear", 512, 10, 100)
    with pytest.raises(ConfigError) as err:
        make_schedule("cosine", 512, 100, 50)
    assert err.value.field == "train.max_steps" and "warmup_steps" in str(err.value)
    with pytest.raises(ConfigError, match="warmup_steps"):
        Noam(512, 0)

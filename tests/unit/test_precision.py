"""`precision = "auto"`: bf16 only where a probe measures it faster than fp32, with fakes for both kinds of CPU."""

import pytest
import torch

from attn.core.errors import ConfigError
from attn.training.precision import (
    AUTO_ENV,
    BF16_MIN_SPEEDUP,
    PASSES_MIN_SPEEDUP,
    Precision,
    choose_precision,
    probe_shape,
    time_matmul,
)

CPU = torch.device("cpu")
SHAPE = (128, 128, 512)


@pytest.fixture(autouse=True)
def probe_decides(monkeypatch):
    """These tests are about the probe: the suite's own choice of "auto" (ATTN_AUTO_PRECISION) is set aside."""
    monkeypatch.delenv(AUTO_ENV, raising=False)


def fake_timer(fp32_s, bf16_s):
    """A timer that reports the given seconds per dtype and records what it was asked."""
    asked = []

    def timer(device, shape, dtype):
        asked.append((device.type, shape, dtype))
        return bf16_s if dtype == torch.bfloat16 else fp32_s

    return timer, asked


def test_auto_on_a_cpu_whose_bf16_is_emulated_trains_in_fp32():
    timer, asked = fake_timer(1e-3, 9e-2)  # an AVX2-only CPU: bf16 about 90x slower
    choice = choose_precision("auto", CPU, SHAPE, timer)
    assert choice.used is Precision.FP32 and choice.requested is Precision.AUTO and not choice.warning
    assert choice.bf16_speedup == pytest.approx(1 / 90)
    assert asked == [("cpu", SHAPE, None), ("cpu", SHAPE, torch.bfloat16)]
    assert choice.record()["probe_bf16_ms"] == pytest.approx(90.0)


def test_auto_on_a_cpu_with_bf16_units_trains_in_bf16():
    timer, _ = fake_timer(1e-3, 4e-4)  # AMX: 2.5x faster
    choice = choose_precision("auto", CPU, SHAPE, timer)
    assert choice.used is Precision.BF16 and choice.bf16_speedup == pytest.approx(2.5)
    assert choice.describe() == "precision bf16 (requested auto: a bf16 matmul runs at 2.5x the speed of fp32 on this CPU)"


def test_auto_needs_bf16_to_be_measurably_faster():
    timer, _ = fake_timer(1.05e-3, 1e-3)  # 5 % faster: within noise, not worth the rounding
    assert choose_precision("auto", CPU, SHAPE, timer).used is Precision.FP32
    timer, _ = fake_timer(BF16_MIN_SPEEDUP * 1e-3, 1e-3)
    assert choose_precision("auto", CPU, SHAPE, timer).used is Precision.BF16


def test_training_passes_check_every_auto_choice_but_an_emulated_bf16():
    """A sub-millisecond product is timed roughly, so the trainer's passes check the probe both ways;
    an emulated bf16 (tens of times slower) is not worth a pass."""
    for bf16_s, wanted in ((4e-4, True), (0.95e-3, True), (1e-3 / PASSES_MIN_SPEEDUP, True), (2.1e-3, False)):
        timer, _ = fake_timer(1e-3, bf16_s)
        assert choose_precision("auto", CPU, SHAPE, timer).wants_passes is wanted, bf16_s
    timer, _ = fake_timer(1e-3, 4e-4)
    assert not choose_precision("bf16", CPU, SHAPE, timer).wants_passes  # obeyed as configured


def test_an_explicit_bf16_is_obeyed_and_warns_with_the_ratio_only_where_it_is_slower():
    timer, _ = fake_timer(1e-3, 8e-2)
    slow = choose_precision("bf16", CPU, SHAPE, timer)
    assert slow.used is Precision.BF16
    assert "runs at 0.013x the speed of fp32" in slow.warning and "80.00 ms against 1.00 ms" in slow.warning
    assert 'set precision = "auto" or "fp32"' in slow.warning
    timer, _ = fake_timer(1e-3, 5e-4)
    assert choose_precision("bf16", CPU, SHAPE, timer).warning == ""


def test_fp32_needs_no_probe_and_fp16_on_a_cpu_runs_fp32_with_a_warning():
    def refuse(*_):
        raise AssertionError("fp32 must not probe")

    assert choose_precision("fp32", CPU, SHAPE, refuse).used is Precision.FP32
    fp16 = choose_precision("fp16", CPU, SHAPE, refuse)
    assert fp16.used is Precision.FP32 and "needs a GPU" in fp16.warning


@pytest.mark.parametrize("supported, expected", [(True, Precision.BF16), (False, Precision.FP32)])
def test_auto_on_a_gpu_follows_its_bf16_support(monkeypatch, supported, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Old GPU")
    assert choose_precision("auto", torch.device("cuda"), SHAPE).used is expected
    forced = choose_precision("bf16", torch.device("cuda"), SHAPE)
    assert forced.used is Precision.BF16 and (forced.warning == "") == supported


def test_probe_shapes_follow_the_model_within_bounds():
    assert probe_shape(128, 512) == (128, 128, 512)
    assert probe_shape(32, 64) == (128, 128, 256)  # tiny models: big enough to time arithmetic
    assert probe_shape(1024, 4096) == (128, 256, 512)  # large ones: small enough to stay fast


def test_the_real_probe_times_both_precisions_and_restores_the_thread_count():
    threads = torch.get_num_threads()
    seconds = [time_matmul(CPU, (16, 16, 16), dtype) for dtype in (None, torch.bfloat16)]
    assert all(0 < s < 10 for s in seconds) and torch.get_num_threads() == threads


@pytest.mark.parametrize("value, expected", [("bf16", Precision.BF16), ("FP32 ", Precision.FP32)])
def test_the_environment_makes_auto_choose_without_a_probe(monkeypatch, value, expected):
    monkeypatch.setenv(AUTO_ENV, value)
    timer, asked = fake_timer(1e-3, 9e-2)  # the probe would say fp32; it is not asked
    choice = choose_precision("auto", CPU, SHAPE, timer)
    assert choice.used is expected and asked == [] and choice.reason == f"{AUTO_ENV}={expected.value}"
    assert choose_precision("fp32", CPU, SHAPE, timer).used is Precision.FP32  # explicit choices are obeyed
    assert choose_precision("bf16", CPU, SHAPE, timer).used is Precision.BF16


def test_the_environment_set_to_probe_or_empty_measures_and_anything_else_is_an_error(monkeypatch):
    timer, asked = fake_timer(1e-3, 4e-4)
    for value in ("probe", ""):
        monkeypatch.setenv(AUTO_ENV, value)
        assert choose_precision("auto", CPU, SHAPE, timer).used is Precision.BF16
    assert len(asked) == 4
    monkeypatch.setenv(AUTO_ENV, "fp16")
    with pytest.raises(ConfigError, match="ATTN_AUTO_PRECISION.*bf16, fp32 or probe"):
        choose_precision("auto", CPU, SHAPE, timer)

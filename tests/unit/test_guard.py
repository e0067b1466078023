"""Never silently worthless: the baseline checks fire on an untrained model and stay quiet on a trained one."""

import json
import math

import pytest

from attn.app import cli
from attn.app.commands import training
from attn.app.guard import (
    classification_check,
    likely_causes,
    lm_check,
    precision_record,
    translation_check,
    verdict,
)
from attn.training import RunResult
from attn.training.precision import Precision, PrecisionChoice
from attn.training.runconfig import RunConfig


def test_translation_must_beat_copying_the_source_by_two_bleu():
    sources = ["the cat sat on the mat today", "a dog ran in the park at noon"]
    references = ["el gato se sentó en la alfombra hoy", "un perro corrió en el parque al mediodía"]
    check = translation_check(1.5, sources, references, "test")
    assert check.baseline == 0.0 and check.required == 2.0 and not check.passed  # no shared word: copy BLEU 0
    assert translation_check(2.0, sources, references, "test").passed
    copied = translation_check(99.0, references, references, "test")  # a source equal to its reference
    assert copied.baseline == pytest.approx(100.0) and copied.required == 100.0 and not copied.passed


def test_lm_must_have_a_tenth_fewer_nats_than_the_unigram_model():
    # Train ids: four 0s over V = 6, add-one: P(0) = 5 / 10. Eval ids [5, 0, 0]: the first is context only.
    check = lm_check(0.62, [0, 0, 0, 0], [5, 0, 0], vocab_size=6, units=2, unit="char", split="test")
    assert check.baseline == pytest.approx(-math.log(0.5))  # two predicted zeros, 2 characters
    assert check.required == pytest.approx(0.9 * math.log(2)) and check.passed  # 0.62 <= 0.624
    assert not lm_check(0.63, [0, 0, 0, 0], [5, 0, 0], 6, 2, "char", "test").passed
    assert not lm_check(math.nan, [0, 0, 0, 0], [5, 0, 0], 6, 2, "char", "test").passed


def test_classification_must_beat_naive_bayes_by_two_points():
    check = classification_check(29.1, {"accuracy": 60.89, "macro_f1": 52.7}, "test")
    assert not check.passed
    assert check.line() == "test accuracy (%) 29.10 against 60.89 for naive Bayes: NOT clearly better"
    assert check.warning(["too few updates"]) == (
        "the classification model is not clearly better than naive Bayes: test accuracy (%) 29.10 against 60.89 "
        "(at least 62.89 needed); likely cause: too few updates")
    assert classification_check(62.89, {"accuracy": 60.89}, "test").passed


def test_no_more_than_the_best_score_is_asked_for():
    near = classification_check(100.0, {"accuracy": 99.0}, "valid")  # 99 + 2 would be 101 %
    assert near.required == 100.0 and near.passed and not near.baseline_at_best
    assert near.line() == "valid accuracy (%) 100.00 against 99.00 for naive Bayes: clearly better"
    both = classification_check(100.0, {"accuracy": 100.0}, "valid")  # three easy topics: naive Bayes is perfect
    assert both.required == 100.0 and both.passed and both.baseline_at_best
    assert both.line() == ("valid accuracy (%) 100.00 against 100.00 for naive Bayes: as good; 100.00 is the best "
                           "score, so this data cannot tell the model from the baseline")
    assert both.record()["baseline_at_best"] and both.record()["required"] == 100.0
    worse = classification_check(97.5, {"accuracy": 100.0}, "valid")
    assert not worse.passed and "(at least 100.00 needed)" in worse.warning(["x"])
    sources = ["el gato se sentó en la alfombra hoy"]
    assert translation_check(100.0, sources, sources, "test").passed  # copying scores 100 + 4e-14 BLEU


def precision(requested: Precision, used: Precision, speedup: float | None) -> dict:
    """A run's precision record as the trainer writes it, with the probe's bf16 speed-up (None: no probe)."""
    figures = {} if speedup is None else {"fp32_ms": 1.0, "bf16_ms": 1.0 / speedup}
    return PrecisionChoice(requested, used, "a reason", **figures).record()


CHOSEN_BF16 = precision(Precision.AUTO, Precision.BF16, 1.8)  # the probe measured bf16 faster
FORCED_SLOW_BF16 = precision(Precision.BF16, Precision.BF16, 0.01)  # asked for, 100x slower


def test_likely_causes_read_what_the_run_did():
    few = likely_causes(120, 200, FORCED_SLOW_BF16, [7.0, 6.5, 6.0])
    assert few[0].startswith("too few updates (120; warmup alone is 200)")
    assert few[1] == ("train.precision = \"bf16\" although the probe measured a bf16 matmul at 0.01x the speed of "
                      "fp32 on this CPU: set train.precision = \"auto\"")
    rising = likely_causes(5000, 200, precision(Precision.FP32, Precision.FP32, None), [3.0] * 10 + [5.0] * 90)
    assert rising == ["the learning rate may have diverged (training loss 3 at the start, 5 at the end): "
                      "lower optim.lr or set optim.clip"]
    assert "non-finite loss" in likely_causes(5000, 200, {}, [3.0, math.nan, 2.0])[0]


@pytest.mark.parametrize("record", [CHOSEN_BF16, precision(Precision.BF16, Precision.BF16, 1.5),
                                    precision(Precision.BF16, Precision.BF16, None), {}],
                         ids=["chosen-by-the-probe", "forced-and-faster", "forced-on-a-gpu", "no-record"])
def test_bf16_is_blamed_only_where_the_run_forced_it_and_measured_it_slower(record):
    assert likely_causes(5000, 200, record, [3.0, 2.0, 1.0]) == [
        "none in the run's record (enough updates, falling losses, the precision it chose); the model may be too "
        "small, or the budget too short, for this data"]


def test_the_verdict_reads_the_precision_of_the_runs_last_start(tmp_path):
    config = RunConfig.from_dict({"optim": {"warmup_steps": 10}})
    result = RunResult(tmp_path, 5000, [3.0, 2.0, 1.0], {}, None, None, None, False, precision="bf16")
    check = classification_check(40.0, {"accuracy": 60.0}, "valid")
    records = [{"step": 0, **FORCED_SLOW_BF16}, {"step": 0, "loss": 3.0}, {"step": 2500, **CHOSEN_BF16}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert precision_record(tmp_path) == {"step": 2500, **CHOSEN_BF16}  # resumed with precision = "auto"
    assert "bf16" not in verdict(check, config, result)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, **FORCED_SLOW_BF16}) + "\n", encoding="utf-8")
    assert "train.precision = \"bf16\" although" in verdict(check, config, result)
    assert verdict(classification_check(100.0, {"accuracy": 100.0}, "valid"), config, result) == ""


def _lm_run(tmp_path, steps):
    """`attn train` of a character LM on a text whose next character is always determined (in two
    files named by a glob: the baseline counts the run's token cache of the whole corpus)."""
    text = "abcdefgh" * 200 + "\n"
    (tmp_path / "train-1.txt").write_text(text)
    (tmp_path / "train-2.txt").write_text(text)
    (tmp_path / "valid.txt").write_text(text[:800])
    return cli.main([
        "train", "--config", "configs/quickstart-lm.toml", f"run_dir={tmp_path / 'run'}",
        f"data.train={tmp_path}/train-*.txt", f"data.valid={tmp_path / 'valid.txt'}", "model.d_model=32",
        "model.d_ff=64", "model.decoder_layers=1", "model.heads=2", "model.max_positions=32", "batch.block_size=32",
        f"train.max_steps={steps}", "train.max_minutes=0", "optim.warmup_steps=1", "train.checkpoint_interval=0",
        "train.precision=fp32", "--quiet",
    ])


def test_attn_train_warns_when_an_untrained_lm_is_no_better_than_unigrams(tmp_path, capsys):
    assert _lm_run(tmp_path, 2) == 0  # a warning, not a failure: the run itself worked
    out, err = capsys.readouterr()
    assert "valid nats/token" in out and "for a unigram model of the training text: NOT clearly better" in out
    assert "attn: warning: the lm model is not clearly better" in err and "too few updates (2; warmup alone is 1)" in err


def test_attn_train_stays_quiet_when_a_trained_lm_beats_unigrams(tmp_path, capsys):
    assert _lm_run(tmp_path, 150) == 0
    out, err = capsys.readouterr()
    assert ": clearly better" in out and "warning" not in err


@pytest.mark.parametrize("budget, passed, code", [("full", False, 1), ("full", True, 0), ("smoke", False, 0)])
def test_the_full_quickstart_fails_when_a_model_is_not_clearly_better(monkeypatch, capsys, budget, passed, code):
    monkeypatch.setattr(training, "run_quickstart",
                        lambda run_dir, budget, quiet: {"clearly_better_than_baselines": passed})
    assert cli.main(["quickstart", "--budget", budget]) == code
    assert ("not clearly better than its trivial baseline" in capsys.readouterr().err) == (code == 1)

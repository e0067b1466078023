"""Never silently worthless: the baseline checks fire on an untrained model and stay quiet on a trained one."""

import math

import pytest

from attn.app import cli
from attn.app.guard import (
    classification_check,
    likely_causes,
    lm_check,
    translation_check,
)


def test_translation_must_beat_copying_the_source_by_two_bleu():
    sources = ["the cat sat on the mat today", "a dog ran in the park at noon"]
    references = ["el gato se sentó en la alfombra hoy", "un perro corrió en el parque al mediodía"]
    check = translation_check(1.5, sources, references, "test")
    assert check.baseline == 0.0 and check.required == 2.0 and not check.passed  # no shared word: copy BLEU 0
    assert translation_check(2.0, sources, references, "test").passed
    copied = translation_check(99.0, references, references, "test")  # a source equal to its reference
    assert copied.baseline == pytest.approx(100.0) and not copied.passed


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


def test_likely_causes_read_what_the_run_did():
    few = likely_causes(120, 200, "bf16", "cpu", [7.0, 6.5, 6.0])
    assert few[0].startswith("too few updates (120; warmup alone is 200)") and "bf16 on a CPU" in few[1]
    rising = likely_causes(5000, 200, "fp32", "cpu", [3.0] * 10 + [5.0] * 90)
    assert rising == ["the learning rate may have diverged (training loss 3 at the start, 5 at the end): "
                      "lower optim.lr or set optim.clip"]
    assert "non-finite loss" in likely_causes(5000, 200, "fp32", "cpu", [3.0, math.nan, 2.0])[0]
    assert likely_causes(5000, 200, "bf16", "cuda", [3.0, 2.0, 1.0]) == [
        "the model may be too small, or the budget too short, for this data"]


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
    monkeypatch.setattr(cli, "run_quickstart",
                        lambda run_dir, budget, quiet: {"clearly_better_than_baselines": passed})
    assert cli.main(["quickstart", "--budget", budget]) == code
    assert ("not clearly better than its trivial baseline" in capsys.readouterr().err) == (code == 1)

"""The `attn` command line, run as a user runs it."""

import argparse
import json

import pytest
from cli_helpers import run_cli

from attn import __version__, load_model, load_run_config
from attn.app.cli import build_parser, main
from attn.app.commands import models
from attn.app.runs import configure, recipe_tables
from attn.app.tasks import get_task
from attn.core.errors import ConfigError
from attn.core.presets import preset_names
from attn.training.logs import read_metrics


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"attn {__version__}"


def test_presets_lists_every_preset_with_its_parameter_count(capsys):
    assert main(["presets", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert list(rows) == preset_names()
    assert rows["paper-base"]["parameters"] == 63_082_496
    assert rows["gpt2"]["parameters"] == 124_439_808


def test_presets_table(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "paper-big" in out and "214.2M" in out and "parameters" in out.splitlines()[0]


@pytest.mark.parametrize("args", [["frobnicate"], []])
def test_usage_errors_exit_2_without_traceback(args):
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "usage:" in result.stderr


def fail_presets(monkeypatch, error: Exception) -> None:
    monkeypatch.setattr(models, "presets_table", lambda: (_ for _ in ()).throw(error))


def test_an_unexpected_error_is_one_line_that_names_attn_debug(monkeypatch, capsys):
    fail_presets(monkeypatch, RuntimeError("tensor trouble\n  at line 42"))
    monkeypatch.delenv("ATTN_DEBUG", raising=False)
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert err == ("attn: internal error (RuntimeError: tensor trouble); run it again with ATTN_DEBUG=1 to see the "
                   "traceback\n")


def test_attn_debug_shows_the_traceback_of_an_unexpected_error_only(monkeypatch, capsys):
    monkeypatch.setenv("ATTN_DEBUG", "1")
    fail_presets(monkeypatch, RuntimeError("tensor trouble"))
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.endswith("RuntimeError: tensor trouble\n")
    fail_presets(monkeypatch, ConfigError("--json", "a user's mistake"))
    assert main(["presets"]) == 2
    assert capsys.readouterr().err == "attn: error: --json: a user's mistake\n"


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of the commands (or verbs) of `parser`, by name."""
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_every_command_of_the_parser_runs_its_function():
    parser = build_parser()
    assert parser.parse_args(["tokenizer", "encode", "-t", "tok", "x"]).func is models.cmd_tokenizer_encode
    assert parser.parse_args(["presets"]).func is models.cmd_presets
    named = dict(commands(parser))
    named.update({f"tokenizer {verb}": p for verb, p in commands(named.pop("tokenizer")).items()})
    assert [name for name, p in named.items() if p.get_default("func").__name__ != f"cmd_{name.replace(' ', '_')}"] == []


# -- attn train TASK: a run from the task's recipe, without a TOML --------------------------------

PAIRS = "ref\ten\tes\n" + "".join(f"v{i}\tIn the beginning {i}.\tEn el principio {i}.\n" for i in range(12))
LABELS = "label\ttext\n" + "".join(f"{label}\t{text} {i}\n" for i in range(6) for label, text in
                                   (("art", "A yawn is a silent shout."), ("law", "The court adjourned.")))
TINY = {  # task: (file name, contents, flags and overrides that make the run tiny and fast)
    "translation": ("pairs.tsv", PAIRS, ["--preset", "paper-base-tiny", "tokenizer.kind=chars",
                                         "batch.max_tokens=256"]),
    "lm": ("text.txt", "To be, or not to be, that is the question.\n" * 20,
           ["--preset", "char-gpt-tiny", "batch.block_size=16", "batch.batch_size=4"]),
    "classification": ("labels.tsv", LABELS, ["--preset", "bert-base-tiny", "tokenizer.kind=chars",
                                              "batch.batch_size=4"]),
}
FEW_STEPS = ["train.max_steps=2", "train.max_minutes=0", "optim.warmup_steps=1", "train.quiet=true",
             "train.device=cpu", "train.precision=fp32"]


def train_one_line(tmp_path, task, *extra):
    name, contents, flags = TINY[task]
    data = tmp_path / name
    data.write_text(contents, encoding="utf-8")
    run_dir = tmp_path / "run"
    argv = ["train", task, "--train", str(data), "--valid", str(data), "--run-dir", str(run_dir), *flags,
            *FEW_STEPS, *extra]
    return main(argv), run_dir


def test_init_fine_tunes_a_trained_model_with_its_own_tokenizer(tmp_path, capsys):
    code, first = train_one_line(tmp_path, "lm")
    assert code == 0
    data = tmp_path / TINY["lm"][0]
    second = tmp_path / "fine-tuned"
    argv = ["train", "lm", "--init", str(first), "--train", str(data), "--run-dir", str(second),
            "batch.block_size=16", "batch.batch_size=4", *FEW_STEPS]
    assert main(argv) == 0
    config = load_run_config(second / "run.toml")
    assert config.model.init_from == str(first)
    tuned, base = load_model(second, "cpu"), load_model(first, "cpu")
    assert tuned.tokenizer.digest() == base.tokenizer.digest() and tuned.model_config == base.model_config
    assert main([*argv[:-len(FEW_STEPS)], "--preset", "char-gpt-tiny", *FEW_STEPS]) == 2
    assert "give --preset char-gpt-tiny (a fresh model) or --init" in capsys.readouterr().err


@pytest.mark.parametrize("task", list(TINY))
def test_train_a_task_in_one_line_writes_the_run_config_it_trained(tmp_path, task, capsys):
    code, run_dir = train_one_line(tmp_path, task)
    assert code == 0
    assert load_model(run_dir, "cpu").task == task
    config = load_run_config(run_dir / "run.toml")
    recipe = load_run_config(get_task(task).recipe)
    assert config.task == task and config.run_dir == str(run_dir) and config.train.max_steps == 2
    assert config.data.train == config.data.valid == str(tmp_path / TINY[task][0])
    assert config.model.init_from == "" and config.model.overrides == ()  # --preset replaced the recipe's model
    assert (config.optim.lr, config.optim.schedule, config.train.eval_batches) == (  # the recipe's
        recipe.optim.lr, recipe.optim.schedule, recipe.train.eval_batches)
    assert f"attn train --config {run_dir / 'run.toml'}" in capsys.readouterr().out


def test_a_one_line_run_is_trained_again_from_its_run_toml(tmp_path):
    code, run_dir = train_one_line(tmp_path, "lm")
    assert code == 0
    again = tmp_path / "again"
    assert main(["train", "--config", str(run_dir / "run.toml"), f"run_dir={again}"]) == 0
    losses = [[r["loss"] for r in read_metrics(folder / "metrics.jsonl") if "loss" in r] for folder in (run_dir, again)]
    assert losses[0] == losses[1] and len(losses[0]) >= 1


def test_train_flags_set_the_data_fields_and_the_time_budget(tmp_path):
    tables = recipe_tables("translation")
    assert "train" not in tables["data"] and "valid" not in tables["data"]  # the recipe's corpus is not the user's
    config = configure(tables, {"train": "corpus/train", "source_field": "de", "target_field": "en"}, minutes=30,
                       run_dir="runs/de-en", overrides=["train.seed=3"])
    assert (config.data.train, config.data.valid, config.data.source_field, config.data.target_field) == (
        "corpus/train", "", "de", "en")
    assert config.train.max_minutes == 30 and config.train.max_steps == 1_000_000 and config.train.seed == 3
    assert config.run_dir == "runs/de-en" and config.model.preset == "paper-base"  # the recipe's model
    labelled = configure(recipe_tables("classification"), {"text_field": "review", "label_field": "stars"})
    assert (labelled.data.text_field, labelled.data.label_field, labelled.data.text_pair_field) == (
        "review", "stars", "")
    assert labelled.model.init_from == "all-MiniLM-L6-v2"


def test_a_one_line_run_writes_its_run_toml_before_training(tmp_path):
    """A run that stops before its first checkpoint (here: a training file without text) keeps the
    config that reproduces it."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    assert main(["train", "lm", "--train", str(empty), "--run-dir", str(run_dir), *FEW_STEPS]) != 0
    assert load_run_config(run_dir / "run.toml").data.train == str(empty)

"""RunConfig: TOML loading, command-line overrides, errors that name the key, shipped configs."""

import json
import tomllib
from pathlib import Path

import pytest

from attn.app.runs import load_run_config, run_config
from attn.core.config import NormPlacement
from attn.core.errors import ConfigError
from attn.training.config_sections import Optimizer, Schedule
from attn.training.precision import Precision
from attn.training.runconfig import RunConfig, parse_value
from benchmarks.bible_chat import FOLDER as CHAT_FILES

CONFIGS = sorted((Path(__file__).parents[3] / "configs").glob("*.toml"))


def test_configs_are_shipped():
    names = {path.stem for path in CONFIGS}
    assert {"translation-quick", "translation-cpu-1h", "translation-paper-base-gpu", "shakespeare-char-quick",
            "shakespeare-char-1h", "fortunes-classify"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_parses_and_round_trips(path):
    config = load_run_config(path)
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert RunConfig.from_dict(tomllib.loads(config.to_toml())) == config
    model = config.model_config()
    assert model.d_model % model.heads == 0
    for key in ("train", "valid"):
        file = getattr(config.data, key)
        if not file.startswith(f"{CHAT_FILES}/"):  # the chat recipes' data step writes theirs (test_chat_data)
            assert (Path(__file__).parents[3] / file).exists()


def test_a_config_written_as_toml_reads_back_equal(tmp_path):
    config = RunConfig().override(
        "task=lm", r'run_dir="runs/a \"quoted\" café\tdir"', "optim.eps=1e-9", "optim.lr=6e-4",
        "model.preset=gpt2-tiny", "model.d_model=64", "model.norm_placement=pre", "data.text_field=review",
        "train.max_minutes=2.5", "train.quiet=true",
    )
    path = tmp_path / "run.toml"
    path.write_text(config.to_toml(), encoding="utf-8")
    assert load_run_config(path) == config
    assert config.run_dir == 'runs/a "quoted" café\tdir' and config.optim.eps == 1e-9
    text = config.to_toml()
    assert 'text_field = "review"' in text and "eps = 1e-09" in text and "[model]\npreset = \"gpt2-tiny\"" in text


def test_paper_base_gpu_config_keeps_the_papers_model_and_optimizer():
    """The paper's dimensions, Adam and label smoothing; the small-corpus changes its comment measures."""
    config = load_run_config(Path(__file__).parents[3] / "configs" / "translation-paper-base-gpu.toml")
    optim, model = config.optim, config.model_config()
    assert (optim.optimizer, optim.beta1, optim.beta2, optim.eps) == (Optimizer.ADAM, 0.9, 0.98, 1e-9)
    assert config.train.label_smoothing == 0.1
    assert (model.d_model, model.heads, model.d_ff, model.encoder_layers, model.decoder_layers) == (512, 8, 2048, 6, 6)
    assert (model.norm_placement, model.dropout, optim.schedule) == (NormPlacement.PRE, 0.3, Schedule.COSINE)


def test_toml_sections_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'task = "lm"\nrun_dir = "runs/x"\n[model]\npreset = "gpt2-tiny"\nd_model = 64\n[train]\nmax_steps = 10\n'
    )
    config = load_run_config(
        path, ["train.max_steps=20", "optim.lr=1e-4", "train.precision=bf16", "data.train=data/a b.txt",
               "model.heads=8", "train.quiet=true", "run_dir=runs/y"]
    )
    assert config.task == "lm" and config.run_dir == "runs/y"
    assert config.train.max_steps == 20 and config.optim.lr == 1e-4 and config.train.quiet is True
    assert config.train.precision is Precision.BF16 and config.data.train == "data/a b.txt"
    model = config.model_config()
    assert (model.d_model, model.heads, model.decoder_layers) == (64, 8, 2)


def test_parse_value_reads_toml_values_else_strings():
    assert parse_value("3") == 3 and parse_value("1e-4") == 1e-4 and parse_value("false") is False
    assert parse_value('"7"') == "7" and parse_value("[1, 2]") == [1, 2] and parse_value("cuda:1") == "cuda:1"


@pytest.mark.parametrize(
    "override,key",
    [
        ("train.max_step=3", "train.max_step"),
        ("train.max_steps=three", "train.max_steps"),
        ("train.max_steps=1.5", "train.max_steps"),
        ("train.compile=1", "train.compile"),
        ("train.max_steps=0", "train.max_steps"),
        ("optim.schedule=linear", "optim.schedule"),
        ("optim.beta2=1.0", "optim.beta2"),
        ("batch.grad_accum=0", "batch.grad_accum"),
        ("tokenizer.kind=sentencepiece", "tokenizer.kind"),
        ("model.colour=blue", "model.colour"),
        ("model.preset=gpt3", "model.preset"),
        ("model.dropout=2.0", "model.dropout"),
        ("data.mask_probability=0", "data.mask_probability"),
        ("optimiser.lr=1", "optimiser.lr"),
        ("colour=blue", "colour"),
        ("train", "train"),
        ("a.b.c=1", "a.b.c"),
    ],
)
def test_bad_keys_and_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        RunConfig().override(override)
    assert err.value.field == key


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_run_config(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\nmax_steps = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_run_config(broken)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("train = 3\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(wrong)
    assert err.value.field == "train"


def test_left_out_fields_take_their_tasks_defaults():
    lm = run_config({"task": "lm"})
    assert (lm.optim.optimizer, lm.optim.schedule, lm.optim.lr, lm.optim.beta2) == (Optimizer.ADAMW, Schedule.COSINE,
                                                                                   6e-4, 0.95)
    assert lm.train.label_smoothing == 0.0 and lm.optim.clip == 1.0
    classify = run_config({"task": "classification", "optim": {"lr": 2e-5}})
    assert classify.optim.optimizer == Optimizer.ADAMW and classify.optim.lr == 2e-5  # the file wins
    assert classify.train.label_smoothing == 0.0
    mlm = run_config({"task": "mlm", "train": {"label_smoothing": 0.05}})
    assert mlm.optim.eps == 1e-6 and mlm.train.label_smoothing == 0.05
    paper = run_config({"task": "translation"})  # the paper's recipe, section 5.3-5.4
    assert (paper.optim.optimizer, paper.optim.schedule, paper.optim.lr, paper.optim.beta2, paper.optim.eps,
            paper.optim.warmup_steps, paper.train.label_smoothing) == (Optimizer.ADAM, Schedule.NOAM, 1.0, 0.98,
                                                                       1e-9, 4000, 0.1)
    assert RunConfig.from_dict(lm.to_dict()) == lm  # a stored config reads back as it was written


def test_a_run_toml_of_an_earlier_version_loads_with_a_warning_for_each_removed_setting(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(RunConfig().to_toml().replace("[train]\n", "[train]\nworkers = 2\nkeep_memory = true\n"))
    with pytest.warns(UserWarning) as caught:
        config = load_run_config(path)
    assert config == RunConfig()
    assert [str(w.message).split(" is ignored")[0] for w in caught] == ["train.workers", "train.keep_memory"]
    assert all("delete it from the config" in str(w.message) for w in caught)

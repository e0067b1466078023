"""Running the `attn` command line as a user does (imported by the end-to-end tests)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path = ROOT, stdin: str | None = None, timeout: int = 600,
            env: dict[str, str] | None = None):
    """Runs `attn ARGS` as a user would, from the repository root (in `env`, else this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "attn.app.cli", *args], cwd=cwd, input=stdin, capture_output=True, text=True,
        timeout=timeout, env=env,
    )

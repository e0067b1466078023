"""The `attn` command line, run as a user runs it."""

import json

import pytest
from cli_helpers import run_cli

from attn import __version__
from attn.app.cli import main
from attn.config import preset_names


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

"""Reference libraries that some tests compare with: skipped where missing, required in CI."""

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest


def in_ci() -> bool:
    """True under continuous integration, which sets CI=true."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def require(name: str) -> ModuleType:
    """Imports `name`; where it is missing, skips the calling test or module, or fails in CI.

    A skipped comparison would leave CI green with none of the checks against the reference
    implementations run, so there the missing package is an error that says what to install.
    """
    if not in_ci():
        return pytest.importorskip(name, reason=f"this test compares with {name}, which is not installed")
    try:
        return __import__(name)
    except ImportError as err:
        raise ImportError(
            f"CI=true and {name} cannot be imported ({err}): the comparisons with it must run in CI; "
            "install the test extra (pip install -c constraints.txt -e '.[test]')"
        ) from err


def require_file(package: str, name: str, install: str) -> Path:
    """The file `name` shipped inside `package`; where missing, skips the calling module, or fails in CI.

    The package is located, not imported: a data package may import what its own code needs (the
    SmolLM2 weights' package imports `llm` and `llama_cpp`), which the tests do not.

    Args:
        package: the import name of the package.
        name: the file's name inside it.
        install: the command that installs it, for the message.
    """
    spec = importlib.util.find_spec(package)
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(folders[0]) / name if folders else None
    if path is not None and path.is_file():
        return path
    reason = f"this test reads {name} of the {package} package, which is not installed"
    if not in_ci():
        pytest.skip(reason, allow_module_level=True)
    raise FileNotFoundError(f"CI=true and {reason}: the comparisons with it must run in CI; {install}")

"""Reference libraries that some tests compare with: skipped where missing, required in CI."""

import os
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

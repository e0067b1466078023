"""The public API: every name in `attn.__all__` has a docstring example, and the example runs."""

import doctest
from pathlib import Path

import pytest

import attn

ROOT = Path(__file__).resolve().parents[2]


def test_the_public_names_are_the_ones_a_user_needs():
    assert {"ModelConfig", "preset", "build_model", "load_model", "train", "generate", "translate", "classify",
            "embed"} <= set(attn.__all__)
    assert all(hasattr(attn, name) for name in attn.__all__)


@pytest.mark.parametrize("name", attn.__all__)
def test_each_public_name_has_an_example_that_runs(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples name the shipped configs by their path in the repository
    obj = getattr(attn, name)
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs={})
    examples = [test for test in tests if test.examples]
    assert examples, f"attn.{name} has no example in its docstring"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in examples:
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"the example of attn.{name} failed (doctest output above)"

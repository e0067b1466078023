"""The package list, which pyproject.toml cannot express: every package under src/ plus the two
top-level folders that pyproject.toml's `package-dir` maps into `attn.shipped`."""

from setuptools import find_packages, setup

setup(packages=[*find_packages("src"), "attn.shipped.configs", "attn.shipped.data"])

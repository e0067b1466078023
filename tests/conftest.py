"""Shared test setup."""

import os

import pytest
import torch

# The suite runs as two xdist workers on two cores: one thread each avoids oversubscription, and
# tiny models run faster single-threaded anyway.
torch.set_num_threads(1)
# Nothing in the tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_hub(tmp_path_factory):
    """A Hub on 127.0.0.1 that serves tiny models (`fake_hub.tiny_repos`), and the folder of their files."""
    from fake_hub import FakeHub, tiny_repos

    sources = tmp_path_factory.mktemp("repos")
    hub = FakeHub(tiny_repos(sources))
    yield hub, sources
    hub.close()

"""Shared test setup."""

import os

import torch

# The suite runs as two xdist workers on two cores: one thread each avoids oversubscription, and
# tiny models run faster single-threaded anyway.
torch.set_num_threads(1)
# Nothing in the tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

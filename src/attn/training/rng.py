"""The random generators' states that a checkpoint keeps, so that resuming repeats the same draws."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and CUDA) global generators, as plain data."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
            "has_gauss": int(has_gauss), "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restores generator states taken by `capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state((
        numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["gauss"]
    ))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Reading PyTorch pickle files without running code from them.

A pickle can call any function while it is read, so `attn` reads `.pt` / `.bin` files only with
`torch.load(weights_only=True)`, which accepts tensors, numbers, strings and containers and refuses everything
else, and says so in one line instead of torch's paragraph (which suggests turning the protection off).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from attn.core.errors import CheckpointError


def load_torch_file(path: str | Path, fix: str) -> Any:
    """`torch.load(path, weights_only=True)` onto the CPU, with one-line errors.

    Args:
        fix: what the user should do about a corrupt file, e.g. "restore the file".

    Raises:
        CheckpointError: the file holds other Python objects (refused, as reading them could run code), or it is
            not a readable PyTorch file.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip, pickle and torch each raise their own types for a torn or foreign file
        if not (isinstance(err, pickle.UnpicklingError) and "Weights only load failed" in str(err)):
            raise CheckpointError(f"{path}: not a readable PyTorch file ({_first_line(err)}); {fix}") from err
        found = re.search(r"GLOBAL (\S+)", str(err))
        raise CheckpointError(
            f"{path}: refused: it holds a Python object ({found[1] if found else 'not a tensor'}) and reading "
            "one can run code; attn reads only tensors, numbers, strings and containers: use a file that attn "
            "wrote, or model.safetensors from a source you trust"
        ) from err


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__

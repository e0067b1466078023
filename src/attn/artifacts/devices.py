"""Which device a name ("auto", "cpu", "cuda", "cuda:N") means on this machine."""

from __future__ import annotations

import torch

from attn.core.errors import ConfigError


def resolve_device(name: str, local_rank: int | None = None, field: str = "train.device") -> torch.device:
    """The device that `name` ("auto", "cpu", "cuda" or "cuda:N") means on this machine.

    "auto" is the GPU (this rank's, under torchrun) when there is one, else the CPU; a CUDA device
    always carries an index, which `torch.cuda.set_device` needs.

    Raises:
        ConfigError: (named `field`) an unknown name, CUDA without a GPU, or a GPU index past the last.
    """
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", local_rank or 0)
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):  # torch knows meta, mps, ...: attn runs on neither
        raise ConfigError(field, f"unknown device {name!r}; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(field, "CUDA was asked for but no GPU is available; use cpu or auto")
        if local_rank is not None:
            return torch.device("cuda", local_rank)
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ConfigError(field, f"{name!r}: this machine has {torch.cuda.device_count()} GPU(s), "
                                     f"numbered from 0; choose one of them")
        return torch.device("cuda", index)
    return device

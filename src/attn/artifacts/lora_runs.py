"""What a LoRA run's checkpoint records beside its adapters: `lora.json`, the adapters' settings and the base model.

A LoRA run's `model.safetensors` holds the adapters alone (`attn.core.lora.lora_state_dict`); the base is named by
its path (or packaged or Hub name) and a fingerprint of its weights, so resuming or loading the run reads the base
again and refuses one whose weights changed. The base is adapted as it was trained: in float, or quantized to int8 or
int4 rows first (QLoRA).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attn.core.errors import AttnError, CheckpointError
from attn.core.lora import LoRAConfig, add_lora
from attn.core.quantized import quantize

LORA_FILE = "lora.json"


class BasePrecision(str, enum.Enum):
    FLOAT = "float"  # the base's weights as loaded
    INT8 = "int8"  # QLoRA over int8 rows (`attn.core.quantized.Int8Linear`)
    INT4 = "int4"  # QLoRA over 4-bit groups (`Int4Linear`; layers the int4 kernel cannot take stay int8)


@dataclasses.dataclass(frozen=True)
class LoRARun:
    """The contents of `lora.json`: the adapters' settings, the base's path or name, the fingerprint of its weights
    (`fingerprint`) and the precision it is adapted in."""

    config: LoRAConfig
    base: str
    fingerprint: str
    precision: BasePrecision = BasePrecision.FLOAT

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "base": self.base, "fingerprint": self.fingerprint,
                "precision": self.precision.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str | Path) -> LoRARun:
        """The record of `lora.json`'s contents.

        Raises:
            CheckpointError: missing or bad settings.
        """
        try:
            return cls(LoRAConfig(**data["config"]), data["base"], data["fingerprint"], BasePrecision(data["precision"]))
        except (KeyError, TypeError, ValueError, AttnError) as err:
            raise CheckpointError(f"{where}: not a valid LoRA record ({err}); the checkpoint is corrupt, "
                                  "use another one") from None

    def adapt(self, model: nn.Module) -> nn.Module:
        """`model` (the base in float) quantized as `precision` says and given the adapters, in place."""
        if self.precision != BasePrecision.FLOAT:
            quantize(model, self.precision.value)
        return add_lora(model, self.config)

    def check_base(self, model: nn.Module, where: str | Path) -> None:
        """Raises a CheckpointError when `model`'s weights are not those the adapters were trained over."""
        found = fingerprint(model)
        if found != self.fingerprint:
            raise CheckpointError(f"{where}: the base model {self.base} has changed since its LoRA adapters were "
                                  f"trained (weights fingerprint {found[:12]}, recorded {self.fingerprint[:12]}); "
                                  "restore the base the run started from, or train new adapters in a new run_dir")


def base_name(init_from: str) -> str:
    """How `lora.json` names the base: an existing path made absolute (the run may be resumed from elsewhere),
    else the packaged or Hub name as given."""
    path = Path(init_from)
    return str(path.resolve()) if path.exists() else init_from


def fingerprint(model: nn.Module) -> str:
    """SHA-256 of the model's parameters: each one's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()

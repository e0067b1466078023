"""Rotary position settings of Llama-style config.json files: read into our rope fields, written back.

config.json spells them three ways. transformers 5 writes `rope_parameters`: `rope_type`, `rope_theta` and the
scaling's own keys. Older files keep `rope_theta` at the top level and the scaling in `rope_scaling` (which wins
when both are present, as in transformers). Gemma 3 keeps one entry per layer type. Exports write the
transformers 5 form.

attn has default, linear, llama3 and YaRN rotations; every other `rope_type` and a YaRN without truncation are
`CheckpointError`s that name the field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from attn.core.config import ModelConfig, RopeScaling
from attn.core.errors import CheckpointError

Params = Mapping[str, Any]


def _needed(params: Params, key: str, where: str) -> Any:
    if params.get(key) is None:
        raise CheckpointError(f"config.json: {where} has no {key!r}, which its rope_type "
                              f"{params.get('rope_type', params.get('type'))!r} needs; add it")
    return params[key]


def _original(params: Params, max_positions: int) -> int:
    """The context length the model was trained at; transformers falls back on max_position_embeddings."""
    return params.get("original_max_position_embeddings") or max_positions


def _unscaled(params: Params, max_positions: int, where: str) -> dict[str, Any]:
    return {"rope_scaling": RopeScaling.NONE}


def _linear(params: Params, max_positions: int, where: str) -> dict[str, Any]:
    return {"rope_scaling": RopeScaling.LINEAR, "rope_factor": _needed(params, "factor", where)}


def _llama3(params: Params, max_positions: int, where: str) -> dict[str, Any]:
    return {
        "rope_scaling": RopeScaling.LLAMA3,
        "rope_factor": _needed(params, "factor", where),
        "rope_original_positions": _original(params, max_positions),
        "rope_low_freq_factor": _needed(params, "low_freq_factor", where),
        "rope_high_freq_factor": _needed(params, "high_freq_factor", where),
    }


def _yarn(params: Params, max_positions: int, where: str) -> dict[str, Any]:
    if params.get("truncate", True) is not True:
        raise CheckpointError(f"config.json: {where}.truncate={params['truncate']!r} is not supported by attn "
                              "(supported: true); this checkpoint cannot be loaded exactly")
    original = _original(params, max_positions)
    factor = params.get("factor") or max_positions / original  # transformers' fallback
    return {
        "rope_scaling": RopeScaling.YARN,
        "rope_factor": factor,
        "rope_original_positions": original,
        "yarn_beta_fast": params.get("beta_fast") or 32.0,
        "yarn_beta_slow": params.get("beta_slow") or 1.0,
        "yarn_attention_factor": _yarn_attention(params, factor),
    }


def _yarn_attention(params: Params, factor: float) -> float:
    """config.json's scale of cos and sin; 0 (our default, 0.1 ln(factor) + 1) when it gives none."""
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if params.get("attention_factor") is not None:
        return params["attention_factor"]
    if not (mscale and mscale_all_dim) or factor <= 1:
        return 0.0
    return (0.1 * mscale * math.log(factor) + 1.0) / (0.1 * mscale_all_dim * math.log(factor) + 1.0)


READERS: dict[str, Callable[[Params, int, str], dict[str, Any]]] = {
    "default": _unscaled,
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
}


def _write_scaling(config: ModelConfig) -> dict[str, Any]:
    c = config
    original = {"original_max_position_embeddings": c.rope_original_positions}
    yarn_factor = {"attention_factor": c.yarn_attention_factor} if c.yarn_attention_factor else {}
    return {
        RopeScaling.NONE: lambda: {"rope_type": "default"},
        RopeScaling.LINEAR: lambda: {"rope_type": "linear", "factor": c.rope_factor},
        RopeScaling.LLAMA3: lambda: {
            "rope_type": "llama3", "factor": c.rope_factor, **original,
            "low_freq_factor": c.rope_low_freq_factor, "high_freq_factor": c.rope_high_freq_factor,
        },
        RopeScaling.YARN: lambda: {
            "rope_type": "yarn", "factor": c.rope_factor, **original,
            "beta_fast": c.yarn_beta_fast, "beta_slow": c.yarn_beta_slow, **yarn_factor,
        },
    }[c.rope_scaling]()


def read_rotation(params: Params, theta: float, max_positions: int, where: str, supported: tuple[str, ...]) -> dict:
    """Our rotary base and scaling fields from one rope entry of config.json.

    Args:
        theta: the base when the entry has no `rope_theta`.
        max_positions: config.json's max_position_embeddings (the fallback of the original length).
        where: the entry's name, for messages.
        supported: the rope types the family's transformers model reads as attn computes them.
    """
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in supported:
        raise CheckpointError(
            f"config.json: {where}.rope_type={kind!r} is not supported by attn (supported: "
            f"{', '.join(map(repr, supported))}); this checkpoint cannot be loaded exactly"
        )
    return {"rotary_base": params.get("rope_theta", theta), **READERS[kind](params, max_positions, where)}


def _entry(hf: Mapping[str, Any]) -> tuple[Params, str]:
    """The flat rope entry of config.json and its name (`rope_scaling` wins, as in transformers)."""
    for name in ("rope_scaling", "rope_parameters"):
        if hf.get(name):
            if not isinstance(hf[name], Mapping):
                raise CheckpointError(f"config.json: {name}={hf[name]!r} is not an object; it holds rope_type and "
                                      "its parameters, e.g. {\"rope_type\": \"default\"}")
            return hf[name], name
    return {}, "rope_parameters"


@dataclasses.dataclass(frozen=True)
class FlatRope:
    """One rotation for every layer, in `rope_parameters` (or the older `rope_theta` + `rope_scaling`).

    Attributes:
        partial: whether the family rotates `partial_rotary_factor` of each head (Phi-3); elsewhere a factor
            other than 1 is refused.
        supported: the rope types read (Phi-3's transformers model reads no scaling but longrope).
    """

    theta: float = 10000.0
    partial: bool = False
    supported: tuple[str, ...] = tuple(READERS)

    def read(self, hf: Mapping[str, Any], max_positions: int) -> dict[str, Any]:
        params, where = _entry(hf)
        fraction = params.get("partial_rotary_factor", hf.get("partial_rotary_factor")) or 1.0
        if fraction != 1.0 and not self.partial:
            raise CheckpointError(f"config.json: partial_rotary_factor={fraction!r} is not supported by attn for "
                                  f"model_type {hf.get('model_type')!r}, which rotates whole heads (supported: 1.0)")
        rotation = read_rotation(params, hf.get("rope_theta", self.theta), max_positions, where, self.supported)
        return {**rotation, "rotary_fraction": fraction}

    def write(self, config: ModelConfig) -> dict[str, Any]:
        fraction = {"partial_rotary_factor": config.rotary_fraction} if self.partial else {}
        return {"rope_parameters": {**_write_scaling(config), "rope_theta": config.rotary_base, **fraction}}


@dataclasses.dataclass(frozen=True)
class LayerTypeRope:
    """A rotation per layer type (Gemma 3): the full layers' may be scaled, the sliding layers' has
    its own base (our `local_rotary_base`) and no scaling."""

    theta: float = 1_000_000.0
    local_theta: float = 10_000.0

    def read(self, hf: Mapping[str, Any], max_positions: int) -> dict[str, Any]:
        nested = hf.get("rope_parameters") or {}
        full = {**(nested.get("full_attention") or {}), **(hf.get("rope_scaling") or {})}
        where = "rope_parameters.full_attention"
        rotation = read_rotation(full, hf.get("rope_theta", self.theta), max_positions, where, tuple(READERS))
        local = nested.get("sliding_attention") or {}
        read_rotation(local, 0.0, max_positions, "rope_parameters.sliding_attention", ("default",))
        return {**rotation, "local_rotary_base": local.get("rope_theta", hf.get("rope_local_base_freq",
                                                                                  self.local_theta))}

    def write(self, config: ModelConfig) -> dict[str, Any]:
        full = {**_write_scaling(config), "rope_theta": config.rotary_base}
        local = {"rope_type": "default", "rope_theta": config.local_rotary_base or config.rotary_base}
        return {"rope_parameters": {"full_attention": full, "sliding_attention": local}}

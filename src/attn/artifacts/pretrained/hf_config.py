"""The Hugging Face config vocabulary the families share, and what the loader needs of a family.

`ConfigTable` maps one family's config.json fields to ours and back; `same_config` checks that an
export reads back as the model it was made from; `Family` is one family's entry (its key table,
config readers and writers, task and decoding rules) in `attn.artifacts.pretrained.families.FAMILIES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from attn.artifacts.pretrained.decoding import DecodingRules, hf_decoding_rules
from attn.artifacts.pretrained.keymap import KeyTable
from attn.core.config import (
    Activation,
    Architecture,
    LayerType,
    ModelConfig,
    Positional,
    RopeScaling,
    Tying,
)
from attn.core.errors import CheckpointError
from attn.core.positional import yarn_attention_factor

HF_ACTIVATIONS: dict[str, Activation] = {
    "gelu": Activation.GELU,
    "gelu_new": Activation.GELU_TANH,
    "gelu_pytorch_tanh": Activation.GELU_TANH,
    "relu": Activation.RELU,
    "silu": Activation.SILU,
    "swish": Activation.SILU,
}
ACTIVATION_NAMES: dict[Activation, str] = {
    Activation.GELU: "gelu",
    Activation.GELU_TANH: "gelu_new",
    Activation.RELU: "relu",
    Activation.SILU: "swish",
}


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The special token ids a checkpoint's config.json records (None where it has none).

    `decoder_start` is the first decoder input of an encoder-decoder; Marian uses the pad id.
    """

    pad: int | None = None
    bos: int | None = None
    eos: int | None = None
    decoder_start: int | None = None

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> SpecialIds:
        """The ids of config.json; of a list of end ids (Llama 3 Instruct's) the first, as attn stops at one."""
        eos = hf.get("eos_token_id")
        first_eos = (eos or [None])[0] if isinstance(eos, list) else eos
        return cls(hf.get("pad_token_id"), hf.get("bos_token_id"), first_eos, hf.get("decoder_start_token_id"))

    def to_hf(self) -> dict[str, int | None]:
        return {
            "pad_token_id": self.pad,
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
            "decoder_start_token_id": self.decoder_start,
        }


def activation(hf: Mapping[str, Any], field: str, default: str) -> Activation:
    """Our activation for the Hugging Face name in `hf[field]`."""
    name = hf.get(field, default)
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"config.json: {field}={name!r} is not supported; attn has {', '.join(sorted(HF_ACTIVATIONS))}"
        )
    return HF_ACTIVATIONS[name]


def require(hf: Mapping[str, Any], field: str, default: Any, supported: Iterable[Any]) -> None:
    """Raises unless `hf[field]` (or its default) is one of `supported`: an option attn lacks."""
    value = hf.get(field, default)
    allowed = list(supported)
    if value not in allowed:
        raise CheckpointError(
            f"config.json: {field}={value!r} is not supported by attn (supported: "
            f"{', '.join(map(repr, allowed))}); this checkpoint cannot be loaded exactly"
        )


def _typed(hf: Mapping[str, Any], field: str, default: Any) -> Any:
    """config.json's `field`, of the type of its default: an int for a size, a number for a rate."""
    value = hf.get(field, default)
    expected = (int,) if type(default) is int else (int, float) if type(default) is float else (type(default),)
    if default is not None and (not isinstance(value, expected) or isinstance(value, bool) != isinstance(default, bool)):
        raise CheckpointError(f"config.json: {field}={value!r} is not {'an int' if expected == (int,) else 'a number'}"
                              f"; restore the model's config.json")
    return value


def output_tying(hf: Mapping[str, Any]) -> Tying:
    """A single-stack model's tying: the output projection shares the input embedding or not."""
    return Tying.DECODER if hf.get("tie_word_embeddings", True) else Tying.NONE


@dataclasses.dataclass(frozen=True)
class ConfigTable:
    """How one family's config.json and our `ModelConfig` correspond, in both directions.

    Attributes:
        renamed: our field -> (config.json field, its default in `transformers`).
        fixed: our fields that every checkpoint of the family has the same value for.
        activation: (config.json field, default) of the activation name.
        names: the name an export writes for each activation (the family's own spelling).
    """

    renamed: Mapping[str, tuple[str, Any]]
    fixed: Mapping[str, Any]
    activation: tuple[str, str]
    names: Mapping[Activation, str] = dataclasses.field(default_factory=lambda: ACTIVATION_NAMES)

    def read(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """Our config fields that config.json `hf` gives directly; CheckpointError for a value of the wrong type."""
        renamed = {ours: _typed(hf, theirs, default) for ours, (theirs, default) in self.renamed.items()}
        return {**self.fixed, **renamed, "activation": activation(hf, *self.activation)}

    def write(self, config: ModelConfig, ids: SpecialIds) -> dict[str, Any]:
        """The config.json fields that `config` and the special ids give directly."""
        return {
            **{theirs: getattr(config, ours) for ours, (theirs, _) in self.renamed.items()},
            self.activation[0]: self.names[config.activation],
            "tie_word_embeddings": config.tying != Tying.NONE,
            **ids.to_hf(),
        }


def same_config(ours: ModelConfig, parsed: ModelConfig, family: str) -> None:
    """Raises naming the first field of `ours` that a `family` checkpoint cannot express.

    `parsed` is `ours` written as that family's config.json and read back. Fields are compared by what the model
    computes with them (`_EFFECTIVE`); dropout rates and the options of unused schemes are not compared.
    """
    ignored = _inert_fields(ours)
    for field in dataclasses.fields(ModelConfig):
        effective = _EFFECTIVE.get(field.name, lambda c, name=field.name: getattr(c, name))
        if field.name not in ignored and effective(ours) != effective(parsed):
            mine, theirs = getattr(ours, field.name), getattr(parsed, field.name)
            raise CheckpointError(
                f"{field.name}={_shown(mine)} cannot be expressed as a {family} checkpoint "
                f"(it would read back as {_shown(theirs)}); export to a family "
                "whose architecture matches the model's config"
            )


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return repr(getattr(value, "value", value))


# Fields whose value stands for another: 0 (or None) meaning "the default" is that default.
_EFFECTIVE: dict[str, Callable[[ModelConfig], Any]] = {
    "attention_scale_dim": lambda c: c.attention_scale_dim or c.head_size,
    "layer_types": lambda c: c.decoder_layer_types,
    "yarn_attention_factor": lambda c: c.yarn_attention_factor or yarn_attention_factor(c.rope_factor),
    # Sliding layers rotate with local_rotary_base and no scaling, or (at 0) as the full layers do.
    "local_rotary_base": lambda c: (
        (c.local_rotary_base, RopeScaling.NONE) if c.local_rotary_base else (c.rotary_base, c.rope_scaling)
    ),
}

# The rope fields each scaling reads; the others are inert under it.
_SCALING_FIELDS: dict[RopeScaling, set[str]] = {
    RopeScaling.NONE: set(),
    RopeScaling.LINEAR: {"rope_factor"},
    RopeScaling.LLAMA3: {"rope_factor", "rope_original_positions", "rope_low_freq_factor", "rope_high_freq_factor"},
    RopeScaling.YARN: {"rope_factor", "rope_original_positions", "yarn_beta_fast", "yarn_beta_slow",
                       "yarn_attention_factor"},
}
_SCALING_OPTIONS: set[str] = set().union(*_SCALING_FIELDS.values())
_ROTARY_FIELDS = {"rotary_base", "rotary_fraction", "rope_scaling", "local_rotary_base", *_SCALING_OPTIONS}


def _inert_fields(config: ModelConfig) -> set[str]:
    """Fields of `config` that no module of its model reads (besides dropout)."""
    inert = {"dropout", "attention_dropout", "activation_dropout"}
    if config.positional != Positional.SINUSOIDAL:
        inert.add("sinusoidal_layout")
    if config.positional != Positional.ROTARY:
        inert |= _ROTARY_FIELDS
    else:
        inert |= _SCALING_OPTIONS - _SCALING_FIELDS[config.rope_scaling]
    if config.positional != Positional.RELATIVE:
        inert |= {"relative_buckets", "relative_max_distance"}
    if LayerType.SLIDING not in config.decoder_layer_types:
        inert |= {"sliding_window", "local_rotary_base"}
    if config.architecture != Architecture.ENCODER_ONLY:
        inert |= {"mlm_head", "pooler", "pooling"}
    elif not config.num_labels:
        inert.add("pooling")  # only a classifier reads the pooled vector
    return inert


@dataclasses.dataclass(frozen=True)
class Family:
    """What the loader needs from one model family (`attn.artifacts.pretrained.gpt2`, `.bert`, `.marian`, `.llama`).

    Attributes:
        name: the `model_type` of its config.json.
        model_config: our config from config.json and the checkpoint's keys (which heads exist).
        prefixed: whether an exported checkpoint of that config writes the base-model prefix.
        task: what an imported model of the family is used for ("lm", "translation", "embedding").
        decoding: the rules `generate` applies, from its generation settings and the decoder start id.
    """

    name: str
    model_config: Callable[[Mapping[str, Any], Collection[str]], ModelConfig]
    key_table: Callable[[ModelConfig], KeyTable]
    hf_config: Callable[[ModelConfig, SpecialIds], dict[str, Any]]
    prefixed: Callable[[ModelConfig], bool]
    task: str
    decoding: Callable[[Mapping[str, Any], int | None], DecodingRules] = hf_decoding_rules

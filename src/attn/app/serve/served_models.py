"""The models one server serves, by name, and what each can do.

A LoRA adapter (`--lora NAME=DIR`, PEFT's format) is served as a model of its own beside its base: its model shares
every weight of the base's (`attn.artifacts.adapters.with_adapter`), so one base in memory serves them all, and its
requests run in their own engine (batch and prefix cache), as another model's do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from attn.artifacts import Bundle, load_model
from attn.artifacts.adapters import ADAPTER_CONFIG, with_adapter
from attn.artifacts.checkpoint import read_json
from attn.core.attention import Heads
from attn.decoding.attention_maps import attention_module
from attn.core.errors import ConfigError
from attn.models import Decoder, Encoder, EncoderDecoder

# What each route needs of a model: the model class, and a word for the error that names it.
ROUTE_MODELS: dict[str, tuple[type, str]] = {
    "completions": (Decoder, "a decoder-only language model"),
    "chat/completions": (Decoder, "a decoder-only language model with a chat template"),
    "translate": (EncoderDecoder, "an encoder-decoder translation model"),
    "embeddings": (Encoder, "an encoder-only model"),
    "classify": (Encoder, "a trained classifier"),
}


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """A loaded model and the name clients call it by; `parent` names the served base of a LoRA adapter's model."""

    name: str
    bundle: Bundle
    parent: str | None = None

    @property
    def max_positions(self) -> int:
        model = self.bundle.model
        return model.stack.max_positions if isinstance(model, Encoder) else model.max_positions

    @property
    def takes_pairs(self) -> bool:
        """Whether the model classifies sentence pairs (it was trained with a `text_pair_field`)."""
        return bool(self.bundle.fields.text_pair_field) and self.can("classify") is None

    @property
    def layout(self) -> Heads:
        """The heads of the model's attention (of its encoder, for an encoder-decoder, whose stacks share one layout)."""
        model = self.bundle.model
        return attention_module(model, "encoder" if isinstance(model, EncoderDecoder) else "self", 0).layout

    def can(self, route: str) -> str | None:
        """None when the model serves `route` (every model serves "attention"), else what the route needs."""
        if route not in ROUTE_MODELS:
            return None
        kind, needs = ROUTE_MODELS[route]
        if (not isinstance(self.bundle.model, kind) or (route == "classify" and not self.bundle.label_names)
                or (route == "chat/completions" and self.bundle.chat_template is None)):
            return needs
        return None

    def card(self) -> dict[str, object]:
        """The model's entry in GET /v1/models."""
        config = self.bundle.model_config
        two_stacks = isinstance(self.bundle.model, EncoderDecoder)
        return {
            "id": self.name, "object": "model", "owned_by": "attn", "task": self.bundle.task,
            "architecture": config.architecture.value, "max_positions": self.max_positions,
            "layers": config.encoder_layers if two_stacks or isinstance(self.bundle.model, Encoder)
            else config.decoder_layers,
            "decoder_layers": config.decoder_layers if two_stacks else None, "heads": config.heads,
            "kv_heads": self.layout.kv_heads, "head_groups": list(self.layout.groups),
            "labels": list(self.bundle.label_names), "pairs": self.takes_pairs,
            "chat": self.can("chat/completions") is None, "parent": self.parent,
        }


def parse_model_specs(specs: Sequence[str], flag: str = "--model",
                      taken: Sequence[str] = ()) -> list[tuple[str, str]]:
    """`DIR` or `NAME=DIR` arguments -> (name, path); a bare DIR is named after its last folder.

    Args:
        flag: the flag the specs came from, for messages.
        taken: names already served, which these may not repeat.

    Raises:
        ConfigError: no model, an empty name, or two models of the same name.
    """
    if not specs and flag == "--model":
        raise ConfigError("--model", "give at least one model: --model DIR or --model NAME=DIR")
    found: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec.rstrip("/")).name or spec, spec
        if not name or not path:
            raise ConfigError(flag, f"{spec!r}: give DIR or NAME=DIR with a non-empty name and path")
        if name in {*taken, *(n for n, _ in found)}:
            raise ConfigError(flag, f"two models are named {name!r}; name them apart with NAME=DIR")
        found.append((name, path))
    return found


def load_served_models(specs: Sequence[str], device: str = "auto", quantize: str | None = None,
                       dtype: str = "float32", adapters: Sequence[str] = ()) -> list[ServedModel]:
    """Loads every `DIR` or `NAME=DIR` of `specs` with `load_model` (int8 weights with `quantize="int8"`, float
    weights in `dtype`), then each LoRA adapter `NAME=DIR` of `adapters` onto its base (see `adapter_models`)."""
    models = [ServedModel(name, load_model(path, device, quantize=quantize, dtype=dtype))
              for name, path in parse_model_specs(specs)]
    return models + adapter_models(models, adapters)


def adapter_models(models: Sequence[ServedModel], adapters: Sequence[str]) -> list[ServedModel]:
    """A model for each LoRA adapter `NAME=DIR` (PEFT's format) of `adapters`, sharing its base's weights.

    The base is the one decoder-only model of `models`, or, among several, the one whose name or path the
    adapter's `base_model_name_or_path` gives.

    Raises:
        ConfigError: a spec without a name, a name taken, or no base to apply an adapter to.
        CheckpointError: an adapter that does not fit its base (`attn.artifacts.adapters.load_adapter`).
    """
    bases = [served for served in models if isinstance(served.bundle.model, Decoder)]
    found = []
    for name, path in parse_model_specs(adapters, "--lora", [served.name for served in models]):
        base = _base_of(bases, Path(path))
        found.append(ServedModel(name, with_adapter(base.bundle, path), parent=base.name))
    return found


def _base_of(bases: Sequence[ServedModel], adapter: Path) -> ServedModel:
    if len(bases) == 1:
        return bases[0]
    named = read_json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
    chosen = [served for served in bases if named in (served.name, str(served.bundle.path))]
    if len(chosen) != 1:
        raise ConfigError("--lora", f"{adapter}: its base_model_name_or_path ({named!r}) names none of the served "
                          f"language models ({', '.join(s.name for s in bases) or 'none'}); serve its base with "
                          "--model, under the name or path that field gives")
    return chosen[0]

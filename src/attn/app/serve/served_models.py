"""The models one server serves, by name, and what each can do."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from attn.artifacts import Bundle, load_model
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
    """A loaded model and the name clients call it by."""

    name: str
    bundle: Bundle

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
            "chat": self.can("chat/completions") is None,
        }


def parse_model_specs(specs: Sequence[str]) -> list[tuple[str, str]]:
    """`DIR` or `NAME=DIR` arguments -> (name, path); a bare DIR is named after its last folder.

    Raises:
        ConfigError: no model, an empty name, or two models of the same name.
    """
    if not specs:
        raise ConfigError("--model", "give at least one model: --model DIR or --model NAME=DIR")
    found: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec.rstrip("/")).name or spec, spec
        if not name or not path:
            raise ConfigError("--model", f"{spec!r}: give DIR or NAME=DIR with a non-empty name and path")
        if name in {n for n, _ in found}:
            raise ConfigError("--model", f"two models are named {name!r}; name them apart with NAME=DIR")
        found.append((name, path))
    return found


def load_served_models(specs: Sequence[str], device: str = "auto", quantize: str | None = None,
                       dtype: str = "float32") -> list[ServedModel]:
    """Loads every `DIR` or `NAME=DIR` of `specs` with `load_model` (int8 weights with `quantize="int8"`, float
    weights in `dtype`)."""
    return [ServedModel(name, load_model(path, device, quantize=quantize, dtype=dtype))
            for name, path in parse_model_specs(specs)]

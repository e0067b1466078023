"""Checks of what a model is given on text, shared by the inference modules: the model's kind and the texts."""

from __future__ import annotations

from collections.abc import Sequence

from attn.artifacts import Bundle
from attn.core.errors import AttnError, GenerationError
from attn.models import Decoder, Encoder, EncoderDecoder

_KIND_NAMES = {EncoderDecoder: "an encoder-decoder", Decoder: "a decoder-only", Encoder: "an encoder-only"}


def expect_model(bundle: Bundle, kind: type, what: str) -> None:
    """Raises an AttnError unless `bundle` holds a model of `kind` (EncoderDecoder, Decoder or Encoder)."""
    if not isinstance(bundle.model, kind):
        raise AttnError(f"{bundle.path} holds {_KIND_NAMES[type(bundle.model)]} model ({bundle.task}); "
                        f"{what} needs {_KIND_NAMES[kind]} model: give a checkpoint trained for it")


def checked_texts(texts: Sequence[str]) -> list[str]:
    """The texts without their surrounding white space.

    Raises:
        GenerationError: no texts, or a blank one.
    """
    texts = [t.strip() for t in texts]
    if not texts or not all(texts):
        raise GenerationError("empty input text: give at least one non-blank line per input")
    return texts

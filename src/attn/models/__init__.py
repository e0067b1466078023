"""The three architectures and the builder that makes them from a config."""

from attn.models.build import Model, build_empty, build_model, count_parameters
from attn.models.decoder import Decoder
from attn.models.encoder import Encoder, EncoderStack
from attn.models.encoder_decoder import EncoderDecoder

__all__ = ["Decoder", "Encoder", "EncoderDecoder", "EncoderStack", "Model", "build_empty", "build_model", "count_parameters"]

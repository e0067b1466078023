"""The one place where a `ModelConfig` chooses modules.

`build_model(config)` returns an `EncoderDecoder`, an `Encoder` or a `Decoder`; every variant
(norm placement, positional scheme, activation, tying, biases) is decided here, so no model's
`forward` branches on the config.
"""

from __future__ import annotations

import torch
from torch import nn

from attn.attention import ATTENTION_FUNCTIONS, CrossAttention, SelfAttention
from attn.blocks import Block, DecoderBlock
from attn.config import (
    Architecture,
    ModelConfig,
    NormPlacement,
    Pooling,
    Positional,
    Tying,
)
from attn.errors import ConfigError
from attn.layers import (
    ACTIVATIONS,
    Embeddings,
    FeedForward,
    OutputProjection,
    PostNorm,
    PreNorm,
    embedding_scale,
)
from attn.models.decoder import Decoder
from attn.models.encoder import (
    Encoder,
    EncoderStack,
    FirstToken,
    MaskedLMTransform,
    MeanPool,
    Pooler,
)
from attn.models.encoder_decoder import EncoderDecoder
from attn.positional import (
    LearnedPositions,
    NoPositions,
    RelativePositionBias,
    RotaryPositions,
    SinusoidalPositions,
)

Model = EncoderDecoder | Encoder | Decoder


def build_model(config: ModelConfig, attention: str = "fast") -> Model:
    """Builds the model a config describes, with freshly initialised weights.

    Args:
        config: the model configuration.
        attention: "fast" (torch's fused SDPA) or "reference" (the plain formula, for tests).

    Example:
        >>> import torch
        >>> from attn import build_model, preset
        >>> from attn.models import count_parameters
        >>> with torch.device("meta"):  # shapes only, no memory
        ...     count_parameters(build_model(preset("paper-base")))
        63082496
    """
    if attention not in ATTENTION_FUNCTIONS:
        raise ConfigError("attention", f"unknown attention {attention!r}; use 'fast' or 'reference'")
    parts = _Parts(config, attention)
    builders = {
        Architecture.ENCODER_DECODER: parts.encoder_decoder,
        Architecture.ENCODER_ONLY: parts.encoder,
        Architecture.DECODER_ONLY: parts.decoder,
    }
    model = builders[config.architecture]()
    init_weights(model, config)
    return model


class _Parts:
    """Module factories for one config."""

    def __init__(self, config: ModelConfig, attention: str) -> None:
        self.c = config
        self.attend = ATTENTION_FUNCTIONS[attention]

    def positions(self, bidirectional: bool) -> NoPositions:
        c = self.c
        return {
            Positional.SINUSOIDAL: lambda: SinusoidalPositions(c.max_positions, c.d_model, c.sinusoidal_layout),
            Positional.LEARNED: lambda: LearnedPositions(c.max_positions, c.d_model),
            Positional.ROTARY: lambda: RotaryPositions(c.max_positions, c.head_dim, c.rotary_base),
            Positional.RELATIVE: lambda: RelativePositionBias(
                c.heads, c.relative_buckets, c.relative_max_distance, bidirectional
            ),
            Positional.NONE: NoPositions,
        }[c.positional]()

    def embeddings(self, tokens: nn.Embedding, bidirectional: bool) -> Embeddings:
        c = self.c
        segments = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        norm = nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.embedding_norm else nn.Identity()
        scale = embedding_scale(c.d_model, c.scale_embedding)
        return Embeddings(tokens, scale, self.positions(bidirectional), segments, norm, c.dropout)

    def residual(self) -> nn.Module:
        wrapper = PostNorm if self.c.norm == NormPlacement.POST else PreNorm
        return wrapper(self.c.d_model, self.c.norm_eps, self.c.dropout)

    def final_norm(self) -> nn.Module:
        return nn.LayerNorm(self.c.d_model, eps=self.c.norm_eps) if self.c.final_norm else nn.Identity()

    def self_attention(self) -> SelfAttention:
        c = self.c
        return SelfAttention(c.d_model, c.heads, c.attention_bias, c.attention_dropout, self.attend)

    def ffn(self) -> FeedForward:
        c = self.c
        return FeedForward(c.d_model, c.d_ff, c.activation, c.ffn_bias, c.activation_dropout)

    def block(self) -> Block:
        return Block(self.self_attention(), self.ffn(), self.residual)

    def decoder_block(self) -> DecoderBlock:
        c = self.c
        cross = CrossAttention(c.d_model, c.heads, c.attention_bias, c.attention_dropout, self.attend)
        return DecoderBlock(self.self_attention(), cross, self.ffn(), self.residual)

    def lm_head(self, tokens: nn.Embedding) -> OutputProjection:
        """The vocabulary projection, logits = x W^T + b; W is the token embedding when tied (section 3.4)."""
        projection = OutputProjection(self.c.d_model, self.c.vocab_size, bias=self.c.output_bias)
        if self.c.tying != Tying.NONE:
            projection.weight = tokens.weight
        return projection

    def encoder_stack(self, tokens: nn.Embedding) -> EncoderStack:
        blocks = [self.block() for _ in range(self.c.encoder_layers)]
        return EncoderStack(self.embeddings(tokens, True), blocks, self.final_norm(), self.c.max_positions)

    def encoder_decoder(self) -> EncoderDecoder:
        c = self.c
        tgt_tokens = nn.Embedding(c.vocab_size, c.d_model)
        src_tokens = tgt_tokens if c.tying == Tying.ALL else nn.Embedding(c.source_vocab_size, c.d_model)
        blocks = [self.decoder_block() for _ in range(c.decoder_layers)]
        return EncoderDecoder(
            self.encoder_stack(src_tokens), self.embeddings(tgt_tokens, False), blocks, self.final_norm(),
            self.lm_head(tgt_tokens), c.max_positions,
        )

    def encoder(self) -> Encoder:
        c = self.c
        tokens = nn.Embedding(c.vocab_size, c.d_model)
        mlm = lm_head = None
        if c.mlm_head:
            norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
            mlm = MaskedLMTransform(nn.Linear(c.d_model, c.d_model), ACTIVATIONS[c.activation], norm)
            lm_head = self.lm_head(tokens)
        pooler = MeanPool() if c.pooling == Pooling.MEAN else Pooler(c.d_model) if c.pooler else FirstToken()
        classifier = nn.Linear(c.d_model, c.num_labels) if c.num_labels else None
        return Encoder(self.encoder_stack(tokens), mlm, lm_head, pooler, classifier, c.dropout)

    def decoder(self) -> Decoder:
        c = self.c
        tokens = nn.Embedding(c.vocab_size, c.d_model)
        blocks = [self.block() for _ in range(c.decoder_layers)]
        return Decoder(
            self.embeddings(tokens, False), blocks, self.final_norm(), self.lm_head(tokens), c.max_positions
        )


def init_weights(model: nn.Module, config: ModelConfig) -> None:
    """Xavier-uniform matrices and zero biases; embeddings N(0, d_model^-1/2) when scaled by sqrt(d_model).

    With the sqrt(d_model) scale the embedded vectors then have unit variance, like the sinusoids
    they are added to; unscaled embeddings (BERT, GPT-2) use N(0, 0.02) as those models do. Embeddings
    are initialised last, so a tied output projection keeps the embedding initialisation.
    """
    std = config.d_model**-0.5 if config.scale_embedding else 0.02
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    with torch.no_grad():
        for linear in linears:
            nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                linear.bias.zero_()
        for embedding in embeddings:
            nn.init.normal_(embedding.weight, std=std)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)



"""The one place where a `ModelConfig` chooses modules.

`build_model(config)` returns an `EncoderDecoder`, an `Encoder` or a `Decoder`; every variant
(norm and its placement, positional scheme and rope scaling, activation and gating, head layout,
QK-norm, score scale and caps, sliding windows, tying, biases) is decided here, so no model's
`forward` branches on the config.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from attn.core.attention import (
    ATTENTION_FUNCTIONS,
    CrossAttention,
    Heads,
    Scores,
    SelfAttention,
)
from attn.core.blocks import Block, DecoderBlock, SlidingWindow
from attn.core.config import (
    Architecture,
    LayerType,
    ModelConfig,
    Norm,
    NormPlacement,
    Pooling,
    Positional,
    QKNorm,
    RopeScaling,
    Tying,
)
from attn.core.errors import ConfigError
from attn.core.layers import (
    ACTIVATIONS,
    Embeddings,
    FeedForward,
    GatedFeedForward,
    OutputNorm,
    PostNorm,
    PreNorm,
    PrePostNorm,
    RMSNorm,
    SoftCappedProjection,
    embedding_scale,
)
from attn.core.linear import Linear
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
from attn.core.positional import (
    LearnedPositions,
    NoPositions,
    PositionScheme,
    RelativePositionBias,
    RotaryPositions,
    SinusoidalPositions,
    linear_scaling,
    llama3_scaling,
    rotary_frequencies,
    yarn_attention_factor,
    yarn_scaling,
)

Model = EncoderDecoder | Encoder | Decoder


def build_model(config: ModelConfig, attention: str = "fast") -> Model:
    """Builds the model a config describes, with freshly initialised weights.

    Args:
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


def build_empty(config: ModelConfig, attention: str = "fast") -> Model:
    """The model a config describes with its parameters on the meta device (no memory, no values) and its buffers
    (rotary and sinusoidal tables) computed: a model whose weights a loader puts in place. Not thread-safe: it
    patches `nn.Module.register_parameter` while the model is built."""
    with _parameters_on_meta():
        return build_model(config, attention)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Puts every parameter registered meanwhile on the meta device, and skips `nn.init.normal_` for meta tensors:
    torch runs it there through its Python reference operators, whose first use imports torch._dynamo and sympy,
    resident for the rest of the process, for values that are never read."""
    register, normal = nn.Module.register_parameter, nn.init.normal_

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:  # a parameter already on meta is a tie: kept as it is
            param = nn.Parameter(param.to("meta"), param.requires_grad)
        register(module, name, param)

    def normal_unless_meta(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return tensor if tensor.is_meta else normal(tensor, *args, **kwargs)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    nn.init.normal_ = normal_unless_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
        nn.init.normal_ = normal


class _Parts:
    """Module factories for one config."""

    def __init__(self, config: ModelConfig, attention: str) -> None:
        self.c = config
        self.attend = ATTENTION_FUNCTIONS[attention]

    def positions(self, bidirectional: bool) -> PositionScheme:
        c = self.c
        return {
            Positional.SINUSOIDAL: lambda: SinusoidalPositions(c.max_positions, c.d_model, c.sinusoidal_layout),
            Positional.LEARNED: lambda: LearnedPositions(c.max_positions, c.d_model),
            Positional.ROTARY: lambda: RotaryPositions(*rope_frequencies(c)),
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

    def norm(self, size: int | None = None) -> nn.Module:
        """The model's norm over `size` features (d_model by default; d_k for QK-norm per head)."""
        c, size = self.c, size or self.c.d_model
        return {
            Norm.LAYER: lambda: nn.LayerNorm(size, eps=c.norm_eps),
            Norm.RMS: lambda: RMSNorm(size, c.norm_eps),
            Norm.RMS_UNIT_OFFSET: lambda: RMSNorm(size, c.norm_eps, offset=1.0),
        }[c.norm]()

    def residual(self) -> nn.Module:
        c = self.c
        return {
            NormPlacement.POST: lambda: PostNorm(self.norm(), c.dropout),
            NormPlacement.PRE: lambda: PreNorm(self.norm(), c.dropout),
            NormPlacement.PRE_POST: lambda: PrePostNorm(self.norm(), self.norm(), c.dropout),
            NormPlacement.OUTPUT: lambda: OutputNorm(self.norm(), c.dropout),
        }[c.norm_placement]()

    def final_norm(self) -> nn.Module:
        return self.norm() if self.c.final_norm else nn.Identity()

    def heads(self) -> Heads:
        return Heads(self.c.heads, self.c.kv_heads, self.c.head_size)

    def qk_norms(self) -> tuple[nn.Module, nn.Module] | None:
        """Norms of the query and key projections: per head over d_k, or over each whole projection."""
        c = self.c
        return {
            QKNorm.NONE: lambda: None,
            QKNorm.HEAD: lambda: (self.norm(c.head_size), self.norm(c.head_size)),
            QKNorm.PROJECTION: lambda: (self.norm(c.heads * c.head_size), self.norm(c.kv_heads * c.head_size)),
        }[c.qk_norm]()

    def self_attention(self) -> SelfAttention:
        c = self.c
        scale = c.attention_scale_dim**-0.5 if c.attention_scale_dim else None
        scores = Scores(scale, c.attention_softcap)
        bias = (c.attention_bias, c.attention_out_bias)
        return SelfAttention(c.d_model, self.heads(), bias, c.attention_dropout, self.attend, scores, self.qk_norms())

    def ffn(self) -> FeedForward:
        c = self.c
        kind = GatedFeedForward if c.gated_ffn else FeedForward
        return kind(c.d_model, c.d_ff, c.activation, c.ffn_bias, c.activation_dropout)

    def block(self) -> Block:
        return Block(self.self_attention(), self.ffn(), self.residual)

    def decoder_block(self) -> DecoderBlock:
        c = self.c
        bias = (c.attention_bias, c.attention_out_bias)
        cross = CrossAttention(c.d_model, self.heads(), bias, c.attention_dropout, self.attend)
        return DecoderBlock(self.self_attention(), cross, self.ffn(), self.residual)

    def lm_head(self, tokens: nn.Embedding) -> Linear:
        """The vocabulary projection, logits = x W^T + b; W is the token embedding when tied (section 3.4)."""
        c = self.c
        projection = (
            SoftCappedProjection(c.d_model, c.vocab_size, c.output_bias, c.logit_softcap)
            if c.logit_softcap
            else Linear(c.d_model, c.vocab_size, bias=c.output_bias)
        )
        if c.tying != Tying.NONE:
            projection.weight = tokens.weight
        return projection

    def encoder_stack(self, tokens: nn.Embedding) -> EncoderStack:
        blocks = [self.block() for _ in range(self.c.encoder_layers)]
        return EncoderStack(self.embeddings(tokens, True), blocks, self.final_norm(), self.c.max_positions)

    def encoder_decoder(self) -> EncoderDecoder:
        c = self.c
        tgt_tokens = nn.Embedding(c.vocab_size, c.d_model)
        src_tokens = tgt_tokens if c.tying == Tying.ALL else nn.Embedding(c.src_vocab_size, c.d_model)
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
            mlm = MaskedLMTransform(Linear(c.d_model, c.d_model), ACTIVATIONS[c.activation], norm)
            lm_head = self.lm_head(tokens)
        pooler = MeanPool() if c.pooling == Pooling.MEAN else Pooler(c.d_model) if c.pooler else FirstToken()
        classifier = Linear(c.d_model, c.num_labels) if c.num_labels else None
        return Encoder(self.encoder_stack(tokens), mlm, lm_head, pooler, classifier, c.dropout)

    def sliding_window(self, positions: PositionScheme) -> SlidingWindow | None:
        """What sliding layers attend with: their window, and `positions` (the stack's own: absolute ones
        are already in the embeddings, rotary ones shared) or, with `local_rotary_base`, rotary positions
        of that base, unscaled."""
        c = self.c
        if LayerType.SLIDING not in c.decoder_layer_types:
            return None
        if c.positional == Positional.ROTARY and c.local_rotary_base:
            local = c.replace(rotary_base=c.local_rotary_base, rope_scaling=RopeScaling.NONE)
            return SlidingWindow(c.sliding_window, RotaryPositions(*rope_frequencies(local)))
        return SlidingWindow(c.sliding_window, positions if c.positional == Positional.ROTARY else NoPositions())

    def decoder(self) -> Decoder:
        c = self.c
        tokens = nn.Embedding(c.vocab_size, c.d_model)
        embeddings = self.embeddings(tokens, False)
        blocks = [self.block() for _ in range(c.decoder_layers)]
        sliding = [kind == LayerType.SLIDING for kind in c.decoder_layer_types]
        return Decoder(
            embeddings, blocks, self.final_norm(), self.lm_head(tokens), c.max_positions,
            self.sliding_window(embeddings.positions), sliding,
        )


def rope_frequencies(config: ModelConfig) -> tuple[Tensor, float]:
    """The rotary inverse frequencies of `config` after its rope scaling, and the scale of cos and sin."""
    c = config
    inv_freq = rotary_frequencies(c.rotary_dims, c.rotary_base)
    original = c.rope_original_positions
    return {
        RopeScaling.NONE: lambda: (inv_freq, 1.0),
        RopeScaling.LINEAR: lambda: (linear_scaling(inv_freq, c.rope_factor), 1.0),
        RopeScaling.LLAMA3: lambda: (
            llama3_scaling(inv_freq, c.rope_factor, original, c.rope_low_freq_factor, c.rope_high_freq_factor), 1.0
        ),
        RopeScaling.YARN: lambda: (
            yarn_scaling(inv_freq, c.rotary_base, c.rope_factor, original, c.yarn_beta_fast, c.yarn_beta_slow),
            c.yarn_attention_factor or yarn_attention_factor(c.rope_factor),
        ),
    }[c.rope_scaling]()


def init_weights(model: nn.Module, config: ModelConfig) -> None:
    """Xavier-uniform matrices and zero biases; embeddings N(0, d_model^-1/2) when scaled by sqrt(d_model).

    The scaled embeddings then have unit variance, like the sinusoids added to them; unscaled ones (BERT, GPT-2)
    use N(0, 0.02). Embeddings come last, so a tied output projection keeps their initialisation.
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



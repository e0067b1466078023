"""Marian translation checkpoints (`MarianMTModel`, e.g. Helsinki-NLP/opus-mt-*).

Marian is the paper's post-norm encoder-decoder with: all sines before all cosines in its sinusoidal positions
(`SinusoidalLayout.CONCATENATED`), embeddings scaled by sqrt(d_model) when `scale_embedding`, swish activations,
a final-logits bias (our `output_bias`), and the pad id as the decoder's start token. Stored position tables
(`embed_positions.weight`) are checked to equal our sinusoids.

Embedding sharing: `share_encoder_decoder_embeddings` with tied output is our `Tying.ALL`; separate
vocabularies with a tied output are `Tying.DECODER`; nothing tied is `Tying.NONE`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from typing import Any

from attn.artifacts.pretrained.decoding import hf_decoding_rules
from attn.artifacts.pretrained.hf_config import (
    ConfigTable,
    Family,
    SpecialIds,
    output_tying,
)
from attn.artifacts.pretrained.keymap import (
    ROW_VECTOR,
    Derived,
    KeyTable,
    Rule,
    linear,
    rule,
)
from attn.core.config import (
    Architecture,
    ModelConfig,
    NormPlacement,
    Positional,
    SinusoidalLayout,
    Tying,
)
from attn.core.errors import CheckpointError
from attn.core.positional import sinusoidal_table


def _attention(ours: str, theirs: str) -> list[Rule]:
    """Self-attention: separate q/k/v projections stacked into our qkv."""
    return [
        *linear(f"{ours}.qkv", *(f"{theirs}.{p}_proj" for p in ("q", "k", "v"))),
        *linear(f"{ours}.out", f"{theirs}.out_proj"),
    ]


def _layer(ours: str, theirs: str) -> list[Rule]:
    """The self-attention and FFN sub-layers that encoder and decoder layers share."""
    return [
        *_attention(f"{ours}.attn", f"{theirs}.self_attn"),
        *linear(f"{ours}.attn_residual.norm", f"{theirs}.self_attn_layer_norm"),
        *linear(f"{ours}.ffn.w1", f"{theirs}.fc1"),
        *linear(f"{ours}.ffn.w2", f"{theirs}.fc2"),
        *linear(f"{ours}.ffn_residual.norm", f"{theirs}.final_layer_norm"),
    ]


def _cross(ours: str, theirs: str) -> list[Rule]:
    """Attention over the encoder output: q alone, k and v stacked into our kv."""
    return [
        *linear(f"{ours}.cross.q", f"{theirs}.encoder_attn.q_proj"),
        *linear(f"{ours}.cross.kv", f"{theirs}.encoder_attn.k_proj", f"{theirs}.encoder_attn.v_proj"),
        *linear(f"{ours}.cross.out", f"{theirs}.encoder_attn.out_proj"),
        *linear(f"{ours}.cross_residual.norm", f"{theirs}.encoder_attn_layer_norm"),
    ]


def _embedding_rules(tying: Tying) -> list[Rule]:
    shared = tying == Tying.ALL
    rules = [rule("encoder.embeddings.tokens.weight", "shared.weight")] if shared else []
    return rules + [
        rule("encoder.embeddings.tokens.weight", "encoder.embed_tokens.weight", optional=shared),
        rule("embeddings.tokens.weight", "decoder.embed_tokens.weight", optional=shared),
        rule("lm_head.weight", "lm_head.weight", optional=tying != Tying.NONE),
        rule("lm_head.bias", "final_logits_bias", transform=ROW_VECTOR),
    ]


def key_table(config: ModelConfig) -> KeyTable:
    """The Marian key table for `config` (an encoder-decoder)."""
    why = "the fixed sinusoidal table; attn computes it"
    rules = [
        *_embedding_rules(config.tying),
        *_layer("encoder.blocks.{enc}", "encoder.layers.{enc}"),
        *_layer("blocks.{dec}", "decoder.layers.{dec}"),
        *_cross("blocks.{dec}", "decoder.layers.{dec}"),
    ]
    table = functools.partial(sinusoidal_table, config.max_positions, config.d_model, SinusoidalLayout.CONCATENATED)
    derived = tuple(Derived(f"{stack}.embed_positions.weight", table, why) for stack in ("encoder", "decoder"))
    return KeyTable(
        tuple(rules),
        slots={"enc": config.encoder_layers, "dec": config.decoder_layers},
        derived=derived,
        prefix="model.",
        heads=("lm_head.", "final_logits_bias"),
    )


CONFIG = ConfigTable(
    renamed={
        "d_model": ("d_model", 1024),
        "encoder_layers": ("encoder_layers", 12),
        "decoder_layers": ("decoder_layers", 12),
        "max_positions": ("max_position_embeddings", 1024),
        "dropout": ("dropout", 0.1),
        "attention_dropout": ("attention_dropout", 0.0),
        "activation_dropout": ("activation_dropout", 0.0),
        "scale_embedding": ("scale_embedding", False),
    },
    fixed={
        "architecture": Architecture.ENCODER_DECODER,
        "norm_placement": NormPlacement.POST,
        "norm_eps": 1e-5,  # torch's LayerNorm default, which Marian layers use
        "positional": Positional.SINUSOIDAL,
        "sinusoidal_layout": SinusoidalLayout.CONCATENATED,
        "output_bias": True,
    },
    activation=("activation_function", "gelu"),
)
# Our fields that Marian gives once per stack: (encoder field, decoder field, default).
PER_STACK = {"heads": ("encoder_attention_heads", "decoder_attention_heads", 16),
             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim", 4096)}


def _tying(hf: Mapping[str, Any]) -> Tying:
    target = output_tying(hf)  # DECODER when the output projection is the target embedding
    if not hf.get("share_encoder_decoder_embeddings", True):
        return target
    if target == Tying.NONE:
        raise CheckpointError(
            "config.json: share_encoder_decoder_embeddings=true with tie_word_embeddings=false is not "
            "supported; attn shares either all three embedding matrices or only the target ones"
        )
    return Tying.ALL


def _per_stack(hf: Mapping[str, Any]) -> dict[str, int]:
    fields = {}
    for ours, (encoder, decoder, default) in PER_STACK.items():
        fields[ours] = hf.get(encoder, default)
        if hf.get(decoder, default) != fields[ours]:
            raise CheckpointError(
                f"config.json: {encoder}={fields[ours]} differs from {decoder}={hf.get(decoder, default)}; "
                "attn uses one value for both stacks"
            )
    return fields


def model_config(hf: Mapping[str, Any], keys: Collection[str]) -> ModelConfig:
    """Our config for a Marian config.json (defaults as in `transformers.MarianConfig`)."""
    source_vocab = hf.get("vocab_size", 58101)
    target_vocab = hf.get("decoder_vocab_size") or source_vocab
    return ModelConfig(
        **CONFIG.read(hf),
        **_per_stack(hf),
        vocab_size=target_vocab,
        src_vocab_size=source_vocab if source_vocab != target_vocab else 0,
        tying=_tying(hf),
    )


def hf_config(config: ModelConfig, ids: SpecialIds) -> dict[str, Any]:
    """config.json of a `MarianMTModel` for `config`; the decoder starts with the pad id unless told."""
    per_stack = {name: getattr(config, ours) for ours, names in PER_STACK.items() for name in names[:2]}
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        **CONFIG.write(config, ids),
        **per_stack,
        "vocab_size": config.src_vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "share_encoder_decoder_embeddings": config.tying == Tying.ALL,
        "is_encoder_decoder": True,
        "decoder_start_token_id": ids.pad if ids.decoder_start is None else ids.decoder_start,
    }


# `generate`'s rules for a Marian directory: its tokenizer frames sources as `… </s>`.
FAMILY = Family("marian", model_config, key_table, hf_config, prefixed=lambda config: True, task="translation",
                decoding=functools.partial(hf_decoding_rules, frame_sources=True))

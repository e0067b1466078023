"""GPT-2 checkpoints (`GPT2LMHeadModel`, or the bare `GPT2Model` without the `transformer.` prefix).

GPT-2 stores its linear maps as Conv1D, (in, out): every matrix is transposed on the way. The
fused `c_attn` is already [q; k; v] along its output, which is our `qkv`. Old checkpoints also
hold each layer's causal-mask buffer `attn.bias` and the fill value `attn.masked_bias`; both are
checked against what they must be and not loaded.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from attn.artifacts.pretrained.hf_config import (
    ConfigTable,
    Family,
    SpecialIds,
    output_tying,
    require,
)
from attn.artifacts.pretrained.keymap import (
    TRANSPOSE,
    Derived,
    KeyTable,
    Rule,
    linear,
    rule,
)
from attn.core.config import Architecture, ModelConfig, NormPlacement, Positional, Tying


def conv1d(ours: str, theirs: str) -> list[Rule]:
    """Rules for a Conv1D's weight (transposed) and bias."""
    return [rule(f"{ours}.weight", f"{theirs}.weight", transform=TRANSPOSE), rule(f"{ours}.bias", f"{theirs}.bias")]


def key_table(config: ModelConfig) -> KeyTable:
    """The GPT-2 key table for `config` (a decoder-only model)."""
    positions = config.max_positions
    rules = [
        rule("embeddings.tokens.weight", "wte.weight"),
        rule("embeddings.positions.table.weight", "wpe.weight"),
        *linear("blocks.{layer}.attn_residual.norm", "h.{layer}.ln_1"),
        *conv1d("blocks.{layer}.attn.qkv", "h.{layer}.attn.c_attn"),
        *conv1d("blocks.{layer}.attn.out", "h.{layer}.attn.c_proj"),
        *linear("blocks.{layer}.ffn_residual.norm", "h.{layer}.ln_2"),
        *conv1d("blocks.{layer}.ffn.w1", "h.{layer}.mlp.c_fc"),
        *conv1d("blocks.{layer}.ffn.w2", "h.{layer}.mlp.c_proj"),
        *linear("final_norm", "ln_f"),
        rule("lm_head.weight", "lm_head.weight", optional=config.tying != Tying.NONE),
    ]
    derived = [
        Derived(
            "h.{layer}.attn.bias",
            lambda: torch.ones(positions, positions).tril()[None, None],
            "the causal mask as a buffer; attn builds it from attn.core.masks",
        ),
        Derived("h.{layer}.attn.masked_bias", lambda: torch.tensor(-1e4), "the old fill value for masked scores"),
    ]
    return KeyTable(
        tuple(rules),
        slots={"layer": config.decoder_layers},
        derived=tuple(derived),
        prefix="transformer.",
        heads=("lm_head.",),
    )


CONFIG = ConfigTable(
    renamed={
        "d_model": ("n_embd", 768),
        "heads": ("n_head", 12),
        "decoder_layers": ("n_layer", 12),
        "vocab_size": ("vocab_size", 50257),
        "max_positions": ("n_positions", 1024),
        "dropout": ("resid_pdrop", 0.1),
        "attention_dropout": ("attn_pdrop", 0.1),
        "norm_eps": ("layer_norm_epsilon", 1e-5),
    },
    fixed={
        "architecture": Architecture.DECODER_ONLY,
        "encoder_layers": 0,
        "norm_placement": NormPlacement.PRE,
        "final_norm": True,
        "positional": Positional.LEARNED,
        "scale_embedding": False,
    },
    activation=("activation_function", "gelu_new"),
)


def model_config(hf: Mapping[str, Any], keys: Collection[str]) -> ModelConfig:
    """Our config for a GPT-2 config.json (defaults as in `transformers.GPT2Config`)."""
    require(hf, "scale_attn_weights", True, [True])
    require(hf, "scale_attn_by_inverse_layer_idx", False, [False])
    require(hf, "add_cross_attention", False, [False])
    fields = CONFIG.read(hf)
    return ModelConfig(**fields, d_ff=hf.get("n_inner") or 4 * fields["d_model"], tying=output_tying(hf))


def hf_config(config: ModelConfig, ids: SpecialIds) -> dict[str, Any]:
    """config.json of a `GPT2LMHeadModel` for `config`."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        **CONFIG.write(config, ids),
        "n_inner": config.d_ff,
        "embd_pdrop": config.dropout,
    }


FAMILY = Family("gpt2", model_config, key_table, hf_config, prefixed=lambda config: True, task="lm")

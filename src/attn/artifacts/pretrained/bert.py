"""BERT checkpoints: `BertModel`, `BertForMaskedLM`, `BertForPreTraining`, `BertForSequenceClassification`.

The heads present in the checkpoint decide the config: `cls.predictions.*` is our MLM head
(`mlm_head`), `pooler.*` our pooler (`pooler`), `classifier.*` our classifier (`num_labels`).
Separate query/key/value matrices are stacked into our fused `qkv`. The next-sentence head of
`BertForPreTraining` (`cls.seq_relationship.*`) has no counterpart in `attn` and is left out.

Export writes the one Hugging Face class whose heads are exactly the model's: `BertForMaskedLM`
(MLM head, no pooler), `BertModel` (pooler only) or `BertForSequenceClassification` (pooler and
classifier); any other combination is a `CheckpointError`.
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
    Derived,
    KeyTable,
    Rule,
    Unused,
    linear,
    rule,
)
from attn.core.config import Architecture, ModelConfig, NormPlacement, Positional, Tying
from attn.core.errors import CheckpointError

MLM = "cls.predictions."
LAYER = "encoder.layer.{layer}."
OURS = "stack.blocks.{layer}."


def _layer_rules() -> list[Rule]:
    attention = (f"{LAYER}attention.self.{part}" for part in ("query", "key", "value"))
    return [
        *linear(f"{OURS}attn.qkv", *attention),
        *linear(f"{OURS}attn.out", f"{LAYER}attention.output.dense"),
        *linear(f"{OURS}attn_residual.norm", f"{LAYER}attention.output.LayerNorm"),
        *linear(f"{OURS}ffn.w1", f"{LAYER}intermediate.dense"),
        *linear(f"{OURS}ffn.w2", f"{LAYER}output.dense"),
        *linear(f"{OURS}ffn_residual.norm", f"{LAYER}output.LayerNorm"),
    ]


def _head_rules(config: ModelConfig) -> list[Rule]:
    rules: list[Rule] = []
    if config.mlm_head:
        rules += [
            *linear("mlm.transform", f"{MLM}transform.dense"),
            *linear("mlm.norm", f"{MLM}transform.LayerNorm"),
            rule("lm_head.bias", f"{MLM}bias"),
            rule("lm_head.bias", f"{MLM}decoder.bias", optional=True),
            rule("lm_head.weight", f"{MLM}decoder.weight", optional=config.tying != Tying.NONE),
        ]
    if config.pooler:
        rules += linear("pooler.dense", "pooler.dense")
    if config.num_labels:
        rules += linear("classifier", "classifier")
    return rules


def key_table(config: ModelConfig) -> KeyTable:
    """The BERT key table for `config` (an encoder-only model)."""
    positions = config.max_positions
    rules = [
        rule("stack.embeddings.tokens.weight", "embeddings.word_embeddings.weight"),
        rule("stack.embeddings.positions.table.weight", "embeddings.position_embeddings.weight"),
        rule("stack.embeddings.segments.weight", "embeddings.token_type_embeddings.weight"),
        *linear("stack.embeddings.norm", "embeddings.LayerNorm"),
        *_layer_rules(),
        *_head_rules(config),
    ]
    positions_buffer = Derived(
        "embeddings.position_ids", lambda: torch.arange(positions)[None], "position indices kept as a buffer"
    )
    unused = [Unused(f"cls.seq_relationship.{p}", "the next-sentence head; attn has none") for p in ("weight", "bias")]
    return KeyTable(
        tuple(rules),
        slots={"layer": config.encoder_layers},
        derived=(positions_buffer,),
        unused=tuple(unused),
        prefix="bert.",
        heads=("cls.", "classifier."),
    )


CONFIG = ConfigTable(
    renamed={
        "d_model": ("hidden_size", 768),
        "heads": ("num_attention_heads", 12),
        "d_ff": ("intermediate_size", 3072),
        "encoder_layers": ("num_hidden_layers", 12),
        "vocab_size": ("vocab_size", 30522),
        "max_positions": ("max_position_embeddings", 512),
        "dropout": ("hidden_dropout_prob", 0.1),
        "attention_dropout": ("attention_probs_dropout_prob", 0.1),
        "norm_eps": ("layer_norm_eps", 1e-12),
        "type_vocab_size": ("type_vocab_size", 2),
    },
    fixed={
        "architecture": Architecture.ENCODER_ONLY,
        "decoder_layers": 0,
        "norm_placement": NormPlacement.POST,
        "positional": Positional.LEARNED,
        "scale_embedding": False,
        "embedding_norm": True,
        "output_bias": True,
    },
    activation=("hidden_act", "gelu"),
)


def model_config(hf: Mapping[str, Any], keys: Collection[str]) -> ModelConfig:
    """Our config for a BERT config.json (defaults as in `transformers.BertConfig`) and its keys."""
    require(hf, "position_embedding_type", "absolute", ["absolute"])
    require(hf, "is_decoder", False, [False])
    labels = hf.get("id2label", {0: 0, 1: 1})
    if not isinstance(labels, dict):
        raise CheckpointError(f"config.json: id2label={labels!r} is not an object of label ids and names; restore the "
                              "model's config.json")
    return ModelConfig(
        **CONFIG.read(hf),
        tying=output_tying(hf),
        mlm_head=any(key.startswith(MLM) for key in keys),
        pooler=any(key.endswith("pooler.dense.weight") for key in keys),
        num_labels=len(labels) if "classifier.weight" in keys else 0,
    )


def _architecture(config: ModelConfig) -> str:
    heads = (config.mlm_head, config.pooler, config.num_labels > 0)
    classes = {
        (True, False, False): "BertForMaskedLM",
        (False, True, False): "BertModel",
        (False, True, True): "BertForSequenceClassification",
    }
    if heads not in classes:
        raise CheckpointError(
            f"no Hugging Face BERT class has exactly these heads: mlm_head={config.mlm_head}, "
            f"pooler={config.pooler}, num_labels={config.num_labels}; export a model with an MLM head "
            "and no pooler, a pooler only, or a pooler and a classifier"
        )
    return classes[heads]


def hf_config(config: ModelConfig, ids: SpecialIds) -> dict[str, Any]:
    """config.json of the BERT class that has the model's heads."""
    labels = {"id2label": {str(i): f"LABEL_{i}" for i in range(config.num_labels)}} if config.num_labels else {}
    return {"model_type": "bert", "architectures": [_architecture(config)], **CONFIG.write(config, ids), **labels}


FAMILY = Family(
    "bert", model_config, key_table, hf_config, prefixed=lambda config: _architecture(config) != "BertModel",
    task="embedding",
)

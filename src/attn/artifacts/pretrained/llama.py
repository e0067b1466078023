"""Llama-style decoder checkpoints: Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, OLMo 2 and Phi-3.

The eight `*ForCausalLM` classes (Gemma 3's text-only one: model_type `gemma3_text`) store one layout:
`model.embed_tokens`, per layer `self_attn.{q,k,v,o}_proj` and `mlp.{gate,up,down}_proj` between RMSNorms,
`model.norm` and `lm_head` (absent when tied). Our `qkv` stacks q, k and v; our `ffn.w1` stacks gate and up.
Phi-3 stores both already fused (`qkv_proj`, `gate_up_proj`) in the same order.

One key table and one config reader serve all of them; what sets a family apart is data on its `Variant`: the
norms (pre-norm, Gemma's pre- and post-norm with x / rms(x) * (1 + w), OLMo 2's normalised outputs), QK-norm, the
biases, Gemma's embedding scale, score scale and soft caps, which layers slide, and the rotary settings.
config.json is read through `transformers`' defaults for omitted fields. Sizes equal to what they default to are
read as 0, as the presets write them (kv_heads equal to heads, head_size equal to d_model / heads).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from attn.artifacts.pretrained.hf_config import (
    ACTIVATION_NAMES,
    ConfigTable,
    Family,
    SpecialIds,
    output_tying,
    require,
)
from attn.artifacts.pretrained.keymap import COPY, Concat, Derived, KeyTable, Rule, rule
from attn.artifacts.pretrained.rope import FlatRope, LayerTypeRope
from attn.core.config import (
    Activation,
    Architecture,
    LayerType,
    ModelConfig,
    Norm,
    NormPlacement,
    Positional,
    QKNorm,
    Tying,
)
from attn.core.errors import CheckpointError
from attn.models.build import rope_frequencies

LAYER = "layers.{layer}."
OURS = "blocks.{layer}."

# Our residual wrappers' norms -> the checkpoint's norm of the same place, for each placement.
NORM_NAMES: dict[NormPlacement, dict[str, str]] = {
    NormPlacement.PRE: {"attn_residual.norm": "input_layernorm", "ffn_residual.norm": "post_attention_layernorm"},
    NormPlacement.PRE_POST: {
        "attn_residual.norm": "input_layernorm",
        "attn_residual.post_norm": "post_attention_layernorm",
        "ffn_residual.norm": "pre_feedforward_layernorm",
        "ffn_residual.post_norm": "post_feedforward_layernorm",
    },
    NormPlacement.OUTPUT: {"attn_residual.norm": "post_attention_layernorm",
                           "ffn_residual.norm": "post_feedforward_layernorm"},
}
QK_NORMS: dict[QKNorm, tuple[str, ...]] = {
    QKNorm.NONE: (), QKNorm.HEAD: ("q_norm", "k_norm"), QKNorm.PROJECTION: ("q_norm", "k_norm"),
}
# Our config fields and the config.json fields they are read from.
RENAMED = {
    "d_model": "hidden_size",
    "heads": "num_attention_heads",
    "d_ff": "intermediate_size",
    "decoder_layers": "num_hidden_layers",
    "vocab_size": "vocab_size",
    "max_positions": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "attention_dropout": "attention_dropout",
}
FIXED = {
    "architecture": Architecture.DECODER_ONLY,
    "encoder_layers": 0,
    "gated_ffn": True,
    "final_norm": True,
    "positional": Positional.ROTARY,
    "output_bias": False,
    "dropout": 0.0,  # none of these models drops residuals or embeddings
}
NAMES = {**ACTIVATION_NAMES, Activation.SILU: "silu", Activation.GELU_TANH: "gelu_pytorch_tanh"}
LLAMA_LAYOUT = {"norm_placement": NormPlacement.PRE, "norm": Norm.RMS, "qk_norm": QKNorm.NONE, "scale_embedding": False}
GEMMA_LAYOUT = {**LLAMA_LAYOUT, "norm_placement": NormPlacement.PRE_POST, "norm": Norm.RMS_UNIT_OFFSET,
                "scale_embedding": True}
# transformers' defaults that all eight share.
COMMON_DEFAULTS = {
    "num_key_value_heads": None, "head_dim": None, "rope_theta": 10000.0, "attention_dropout": 0.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}


@dataclasses.dataclass(frozen=True)
class Flag:
    """A yes/no of the architecture: config.json's `field`, or `fixed` in a family without that field."""

    field: str | None = None
    fixed: bool = False

    def read(self, hf: Mapping[str, Any]) -> bool:
        return bool(hf.get(self.field)) if self.field else self.fixed

    def write(self, value: bool) -> dict[str, Any]:
        return {self.field: value} if self.field else {}


def _layer_kinds(names: Any, layers: int) -> tuple[LayerType, ...]:
    choices = [kind.value for kind in LayerType]
    if not isinstance(names, list) or len(names) != layers or not set(names) <= set(choices):
        raise CheckpointError(f"config.json: layer_types={names!r} must name one of {choices} for each of the "
                              f"{layers} layers; fix layer_types")
    return tuple(LayerType(name) for name in names)


def _windowed(window: Any, kinds: tuple[LayerType, ...], field: str) -> dict[str, Any]:
    """Our `sliding_window` and `layer_types`; empty layer_types when all layers are of one kind."""
    if LayerType.SLIDING not in kinds:
        return {"sliding_window": 0, "layer_types": ()}
    if not window:
        raise CheckpointError(f"config.json: layer_types has sliding layers but {field} gives no window; "
                              "set sliding_window")
    return {"sliding_window": window, "layer_types": () if len(set(kinds)) == 1 else kinds}


def _kind_names(config: ModelConfig) -> list[str]:
    return [kind.value for kind in config.decoder_layer_types]


def _window(config: ModelConfig) -> int | None:
    return config.sliding_window if LayerType.SLIDING in config.decoder_layer_types else None


class NoWindows:
    """Every layer attends to the whole prefix (Llama, OLMo 2)."""

    def read(self, hf: Mapping[str, Any], layers: int) -> dict[str, Any]:
        return {}

    def write(self, config: ModelConfig) -> dict[str, Any]:
        return {}


class EveryLayer:
    """`sliding_window`, when set, is the window of every layer (Mistral, Phi-3)."""

    def read(self, hf: Mapping[str, Any], layers: int) -> dict[str, Any]:
        window = hf.get("sliding_window")
        return _windowed(window, (LayerType.SLIDING if window else LayerType.FULL,) * layers, "sliding_window")

    def write(self, config: ModelConfig) -> dict[str, Any]:
        return {"sliding_window": _window(config)}


@dataclasses.dataclass(frozen=True)
class LayerTypes:
    """`layer_types` names each layer's attention; without it every `period`-th layer is full, the
    others slide (Gemma 2: every second; Gemma 3: config.json's `period_field`, 6 by default)."""

    period: int
    period_field: str | None = None

    def read(self, hf: Mapping[str, Any], layers: int) -> dict[str, Any]:
        if hf.get("layer_types") is not None:
            return _windowed(hf.get("sliding_window"), _layer_kinds(hf["layer_types"], layers), "sliding_window")
        period = hf.get(self.period_field, self.period) if self.period_field else self.period
        kinds = tuple(LayerType.SLIDING if (i + 1) % period else LayerType.FULL for i in range(layers))
        return _windowed(hf.get("sliding_window"), kinds, "sliding_window")

    def write(self, config: ModelConfig) -> dict[str, Any]:
        return {"sliding_window": _window(config), "layer_types": _kind_names(config)}


class QwenWindows:
    """Qwen2 and Qwen3: layers slide only with `use_sliding_window`, those from `max_window_layers`
    on, unless `layer_types` names each layer's attention."""

    def read(self, hf: Mapping[str, Any], layers: int) -> dict[str, Any]:
        window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
        if hf.get("layer_types") is not None:
            kinds = _layer_kinds(hf["layer_types"], layers)
        else:
            first = hf.get("max_window_layers") if window else layers
            kinds = tuple(LayerType.SLIDING if i >= first else LayerType.FULL for i in range(layers))
        return _windowed(window, kinds, "use_sliding_window with sliding_window")

    def write(self, config: ModelConfig) -> dict[str, Any]:
        kinds = config.decoder_layer_types
        first = kinds.index(LayerType.SLIDING) if LayerType.SLIDING in kinds else len(kinds)
        return {"use_sliding_window": first < len(kinds), "sliding_window": _window(config),
                "max_window_layers": first, "layer_types": _kind_names(config)}


class PlainScores:
    """Scores scaled by 1 / sqrt(head_dim), nothing capped."""

    def read(self, hf: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
        return {}

    def write(self, config: ModelConfig) -> dict[str, Any]:
        return {}


class GemmaScores:
    """Gemma's score scale 1 / sqrt(query_pre_attn_scalar), its soft caps on scores and logits."""

    def read(self, hf: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
        scalar = hf.get("query_pre_attn_scalar")
        return {
            "attention_scale_dim": 0 if scalar == head_dim else scalar,
            "attention_softcap": hf.get("attn_logit_softcapping") or 0.0,
            "logit_softcap": hf.get("final_logit_softcapping") or 0.0,
        }

    def write(self, config: ModelConfig) -> dict[str, Any]:
        return {
            "query_pre_attn_scalar": config.attention_scale_dim or config.head_size,
            "attn_logit_softcapping": config.attention_softcap or None,
            "final_logit_softcapping": config.logit_softcap or None,
        }


NO_WINDOWS, PLAIN_SCORES, FLAT_ROPE = NoWindows(), PlainScores(), FlatRope()


@dataclasses.dataclass(frozen=True)
class Variant:
    """One Llama-style family as data (see the module docstring).

    Attributes:
        architecture: the `transformers` class an export names.
        defaults: `transformers`' value of each config.json field read, where the file omits it.
        layout: our fields that every checkpoint of the family has the same value for.
        attention_bias: whether q, k and v (and o, unless `out_bias`) have biases.
        out_bias: whether o has one, where the family fixes it apart from q, k and v.
        attention: the checkpoint's names of what our `qkv` stacks; `ffn`: of what `ffn.w1` stacks.
        windows, scores, rope: how config.json states sliding layers, the score scale and caps, and the rotation.
        refused: (field, the values attn supports) of config.json options attn lacks.
    """

    model_type: str
    architecture: str
    defaults: Mapping[str, Any]
    layout: Mapping[str, Any] = dataclasses.field(default_factory=lambda: LLAMA_LAYOUT)
    activation: str = "hidden_act"
    attention_bias: Flag = Flag("attention_bias")
    out_bias: Flag | None = None
    ffn_bias: Flag = Flag()
    attention: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    ffn: tuple[str, ...] = ("gate_proj", "up_proj")
    windows: NoWindows | EveryLayer | LayerTypes | QwenWindows = NO_WINDOWS
    scores: PlainScores | GemmaScores = PLAIN_SCORES
    rope: FlatRope | LayerTypeRope = FLAT_ROPE
    refused: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @property
    def table(self) -> ConfigTable:
        """The config.json fields that map one to one onto ours, with the family's defaults."""
        defaults = {**COMMON_DEFAULTS, **self.defaults}
        return ConfigTable(
            renamed={ours: (theirs, defaults[theirs]) for ours, theirs in RENAMED.items()},
            fixed={**FIXED, **self.layout},
            activation=(self.activation, defaults[self.activation]),
            names=NAMES,
        )

    def model_config(self, hf: Mapping[str, Any], keys: Collection[str]) -> ModelConfig:
        """Our config for the family's config.json (with `transformers`' defaults for omitted fields)."""
        view = collections.ChainMap(dict(hf), {**COMMON_DEFAULTS, **self.defaults})
        for field, supported in self.refused:
            require(view, field, None, supported)
        fields = self.table.read(view)
        d_model, heads = fields["d_model"], fields["heads"]
        head_dim = view.get("head_dim") or d_model // heads
        kv_heads = view.get("num_key_value_heads") or heads
        return ModelConfig(
            **fields,
            kv_heads=0 if kv_heads == heads else kv_heads,
            head_size=0 if head_dim * heads == d_model else head_dim,
            tying=output_tying(view),
            attention_bias=self.attention_bias.read(view),
            attention_out_bias=None if self.out_bias is None else self.out_bias.read(view),
            ffn_bias=self.ffn_bias.read(view),
            **self.windows.read(view, fields["decoder_layers"]),
            **self.scores.read(view, head_dim),
            **self.rope.read(view, fields["max_positions"]),
        )

    def key_table(self, config: ModelConfig) -> KeyTable:
        """The family's key table for `config`."""
        query, kv = config.heads * config.head_size, config.kv_heads * config.head_size
        norms = NORM_NAMES[self.layout["norm_placement"]].items()
        rules = [
            rule("embeddings.tokens.weight", "embed_tokens.weight"),
            *_projection("attn.qkv", [f"self_attn.{n}" for n in self.attention], config.attention_bias,
                         Concat((query, kv, kv))),
            *_projection("attn.out", ["self_attn.o_proj"], config.attention_out_bias),
            *_projection("ffn.w1", [f"mlp.{n}" for n in self.ffn], config.ffn_bias),
            *_projection("ffn.w2", ["mlp.down_proj"], config.ffn_bias),
            *(rule(f"{OURS}{ours}.weight", f"{LAYER}{theirs}.weight") for ours, theirs in norms),
            *(rule(f"{OURS}attn.{n}.weight", f"{LAYER}self_attn.{n}.weight") for n in QK_NORMS[self.layout["qk_norm"]]),
            rule("final_norm.weight", "norm.weight"),
            rule("lm_head.weight", "lm_head.weight", optional=config.tying != Tying.NONE),
        ]
        inv_freq = Derived(f"{LAYER}self_attn.rotary_emb.inv_freq", lambda: rope_frequencies(config)[0].float(),
                           "the rotary frequencies, kept as a buffer by older checkpoints; attn computes them")
        return KeyTable(tuple(rules), slots={"layer": config.decoder_layers}, derived=(inv_freq,), prefix="model.",
                        heads=("lm_head.",))

    def hf_config(self, config: ModelConfig, ids: SpecialIds) -> dict[str, Any]:
        """config.json of the family's `*ForCausalLM` for `config`, in the form transformers 5 writes."""
        return {
            "model_type": self.model_type,
            "architectures": [self.architecture],
            **self.table.write(config, ids),
            "num_key_value_heads": config.kv_heads,
            "head_dim": config.head_size,
            **self.attention_bias.write(config.attention_bias),
            **self.ffn_bias.write(config.ffn_bias),
            **self.windows.write(config),
            **self.scores.write(config),
            **self.rope.write(config),
        }

    def family(self) -> Family:
        """The loader's entry for this family: causal language models."""
        return Family(self.model_type, self.model_config, self.key_table, self.hf_config,
                      prefixed=lambda config: True, task="lm")


def _projection(ours: str, theirs: list[str], bias: bool, stack: Concat = COPY) -> list[Rule]:
    """Rules for one of our linear maps in every layer, stacked from the checkpoint's `theirs`, and its bias."""
    names = ("weight", "bias") if bias else ("weight",)
    return [rule(f"{OURS}{ours}.{p}", *(f"{LAYER}{t}.{p}" for t in theirs), transform=stack) for p in names]


GEMMA_REFUSED = (("use_bidirectional_attention", (None, False)),)
VARIANTS = (
    Variant("llama", "LlamaForCausalLM", {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    }, ffn_bias=Flag("mlp_bias")),
    Variant("qwen2", "Qwen2ForCausalLM", {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    }, attention_bias=Flag(fixed=True), out_bias=Flag(fixed=False), windows=QwenWindows()),
    Variant("qwen3", "Qwen3ForCausalLM", {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    }, layout={**LLAMA_LAYOUT, "qk_norm": QKNorm.HEAD}, windows=QwenWindows()),
    Variant("mistral", "MistralForCausalLM", {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "sliding_window": 4096,
    }, attention_bias=Flag(), windows=EveryLayer()),
    Variant("gemma2", "Gemma2ForCausalLM", {
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 4096, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "use_bidirectional_attention": None,
    }, layout=GEMMA_LAYOUT, activation="hidden_activation", windows=LayerTypes(period=2), scores=GemmaScores(),
        refused=GEMMA_REFUSED),
    Variant("gemma3_text", "Gemma3ForCausalLM", {
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 4096, "query_pre_attn_scalar": 256, "attn_logit_softcapping": None,
        "final_logit_softcapping": None, "use_bidirectional_attention": False,
    }, layout={**GEMMA_LAYOUT, "qk_norm": QKNorm.HEAD}, activation="hidden_activation",
        windows=LayerTypes(period=6, period_field="sliding_window_pattern"), scores=GemmaScores(),
        rope=LayerTypeRope(), refused=GEMMA_REFUSED),
    Variant("olmo2", "Olmo2ForCausalLM", {
        "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    }, layout={**LLAMA_LAYOUT, "norm_placement": NormPlacement.OUTPUT, "qk_norm": QKNorm.PROJECTION}),
    Variant("phi3", "Phi3ForCausalLM", {
        "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "sliding_window": None,
    }, attention_bias=Flag(), attention=("qkv_proj",), ffn=("gate_up_proj",), windows=EveryLayer(),
        rope=FlatRope(partial=True, supported=("default",))),
)
FAMILIES = tuple(variant.family() for variant in VARIANTS)

"""The model configuration: one frozen, validated dataclass (the named presets are `attn.core.presets`).

Every architectural choice is a field here; `attn.models.build.build_model` reads the config once and picks modules.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from attn.core.errors import ConfigError


class Architecture(str, enum.Enum):
    ENCODER_DECODER = "encoder-decoder"
    ENCODER_ONLY = "encoder-only"
    DECODER_ONLY = "decoder-only"


class Activation(str, enum.Enum):
    RELU = "relu"
    GELU = "gelu"  # exact erf form (BERT)
    GELU_TANH = "gelu-tanh"  # tanh approximation (GPT-2)
    SILU = "silu"  # a.k.a. swish (Marian)


class NormPlacement(str, enum.Enum):
    POST = "post"  # Norm(x + Sublayer(x)), as in the paper
    PRE = "pre"  # x + Sublayer(Norm(x)), as in GPT-2 and Llama
    PRE_POST = "pre-post"  # x + Norm(Sublayer(Norm(x))), as in Gemma 2 and 3
    OUTPUT = "output"  # x + Norm(Sublayer(x)), as in OLMo 2


class Norm(str, enum.Enum):
    LAYER = "layernorm"  # (x - mean) / std * w + b (the paper, BERT, GPT-2)
    RMS = "rmsnorm"  # x / rms(x) * w, no bias (Llama)
    RMS_UNIT_OFFSET = "rmsnorm-unit-offset"  # x / rms(x) * (1 + w), w initialised at 0 (Gemma)


class QKNorm(str, enum.Enum):
    NONE = "none"
    HEAD = "head"  # each head's query and key normalised over its d_k features (Qwen3, Gemma 3)
    PROJECTION = "projection"  # the whole query and key projections normalised (OLMo 2)


class RopeScaling(str, enum.Enum):
    NONE = "none"
    LINEAR = "linear"  # every frequency divided by rope_factor (position interpolation)
    LLAMA3 = "llama3"  # low frequencies divided by rope_factor, high kept, a smooth blend between
    YARN = "yarn"  # NTK-by-parts blend and a temperature on the scores (Peng et al. 2023)


class Positional(str, enum.Enum):
    SINUSOIDAL = "sinusoidal"
    LEARNED = "learned"
    ROTARY = "rotary"
    RELATIVE = "relative"  # T5's bucketed relative position bias
    NONE = "none"


class SinusoidalLayout(str, enum.Enum):
    INTERLEAVED = "interleaved"  # PE[pos, 2i] = sin, PE[pos, 2i+1] = cos (the paper)
    CONCATENATED = "concatenated"  # sin in the first half, cos in the second (Marian)


class Pooling(str, enum.Enum):
    FIRST = "first"  # the first token's vector, through the pooler when pooler=true (BERT)
    MEAN = "mean"  # the mean of the real tokens' vectors (sentence-transformers)


class LayerType(str, enum.Enum):
    FULL = "full_attention"
    SLIDING = "sliding_attention"  # each query sees the last `sliding_window` positions only


class Tying(str, enum.Enum):
    NONE = "none"
    DECODER = "decoder"  # target (or LM) input embedding shared with the output projection
    ALL = "all"  # source, target and output share one matrix (the paper, section 3.4)


E = TypeVar("E", bound=enum.Enum)


def _parse_enum(field: str, kind: type[E], value: Any) -> E:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in kind)
        raise ConfigError(field, f"unknown value {value!r}; choose one of {choices}") from None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every architectural choice of a Transformer model.

    Vocabulary fields: `vocab_size` is the target / LM / encoder vocabulary; `src_vocab_size` the encoder-decoder's
    source vocabulary (derived: vocab_size). `pooling` is the vector an encoder-only model classifies: the first
    token's ("first") or the mean of the real tokens' ("mean", for sentence embedders such as all-MiniLM-L6-v2).

    Attention fields: `kv_heads` key/value heads shared by groups of the `heads` query heads (grouped-query
    attention; derived: as many as query heads); `head_size` the size d_k of a head (derived: d_model / heads);
    `attention_out_bias` whether W^O has a bias (derived: attention_bias); `attention_scale_dim` the d in the scores'
    1/sqrt(d) (0 means d_k; Gemma's query_pre_attn_scalar); `attention_softcap` and `logit_softcap` cap the scores
    and the output logits at c tanh(x / c) (0 means no cap); `layer_types` says which decoder layers attend over a
    sliding window of `sliding_window` positions (empty: all when sliding_window > 0, none otherwise), and those
    layers rotate with `local_rotary_base` (0 means rotary_base) and without rope scaling. A derived field left at
    its default (0 or None) holds the value it derives; `to_dict` writes it as set, `replace` derives it again.

    Example:
        >>> from attn import preset
        >>> small = preset("paper-base").replace(d_model=256, d_ff=1024)
        >>> small.heads, small.head_size  # d_model / heads
        (8, 32)
    """

    architecture: Architecture = Architecture.ENCODER_DECODER
    d_model: int = 512
    heads: int = 8
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    vocab_size: int = 37000
    src_vocab_size: int = 0
    max_positions: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: Activation = Activation.RELU
    gated_ffn: bool = False
    norm_placement: NormPlacement = NormPlacement.POST
    norm: Norm = Norm.LAYER
    final_norm: bool = False
    norm_eps: float = 1e-5
    positional: Positional = Positional.SINUSOIDAL
    sinusoidal_layout: SinusoidalLayout = SinusoidalLayout.INTERLEAVED
    rotary_base: float = 10000.0
    rotary_fraction: float = 1.0
    rope_scaling: RopeScaling = RopeScaling.NONE
    rope_factor: float = 1.0
    rope_original_positions: int = 0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_attention_factor: float = 0.0
    local_rotary_base: float = 0.0
    relative_buckets: int = 32
    relative_max_distance: int = 128
    scale_embedding: bool = True
    tying: Tying = Tying.ALL
    kv_heads: int = 0
    head_size: int = 0
    attention_bias: bool = True
    attention_out_bias: bool | None = None
    qk_norm: QKNorm = QKNorm.NONE
    attention_scale_dim: int = 0
    attention_softcap: float = 0.0
    logit_softcap: float = 0.0
    sliding_window: int = 0
    layer_types: tuple[LayerType, ...] = ()
    ffn_bias: bool = True
    output_bias: bool = False
    type_vocab_size: int = 0
    embedding_norm: bool = False
    mlm_head: bool = True
    pooler: bool = True
    pooling: Pooling = Pooling.FIRST
    num_labels: int = 0

    def __post_init__(self) -> None:
        coerce_fields(self)
        self._validate_sizes()
        self._derive()
        self._validate_rates()
        self._validate_combinations()

    def _derive(self) -> None:
        """Replaces each derived field left at its default with the value it stands for."""
        derived = {
            "src_vocab_size": self.vocab_size,
            "kv_heads": self.heads,
            "head_size": self.d_model // self.heads,  # d_k = d_v = d_model / h (section 3.2.2)
            "attention_out_bias": self.attention_bias,
        }
        unset = frozenset(name for name in derived if getattr(self, name) == _DEFAULTS[name])
        object.__setattr__(self, "_derived", unset)
        for name in unset:
            object.__setattr__(self, name, derived[name])

    @property
    def rotary_dims(self) -> int:
        """The features of a head that rotary positions rotate (the first `rotary_fraction` of d_k)."""
        return int(self.head_size * self.rotary_fraction)

    @property
    def decoder_layer_types(self) -> tuple[LayerType, ...]:
        """Each decoder layer's attention: `layer_types`, or all sliding when only `sliding_window` is set.
        Computed when read, so a config claiming 10**9 layers stays small until loading checks its size."""
        if self.layer_types:
            return self.layer_types
        kind = LayerType.SLIDING if self.sliding_window else LayerType.FULL
        return (kind,) * self.decoder_layers

    def _validate_sizes(self) -> None:
        for name in ("d_model", "heads", "d_ff", "vocab_size", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be a positive integer, got {getattr(self, name)}")
        for name in (
            "encoder_layers", "decoder_layers", "src_vocab_size", "type_vocab_size", "num_labels", "kv_heads",
            "head_size", "attention_scale_dim", "sliding_window", "rope_original_positions",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if not self.head_size and self.d_model % self.heads:
            raise ConfigError(
                "d_model",
                f"d_model={self.d_model} is not divisible by heads={self.heads}; "
                f"pick heads among the divisors of d_model (e.g. {_divisor_hint(self.d_model, self.heads)})",
            )
        if self.relative_buckets < 2 or self.relative_max_distance < 2:
            raise ConfigError("relative_buckets", "relative_buckets and relative_max_distance must be >= 2")
        if self.relative_max_distance <= self.relative_buckets // 2:
            raise ConfigError("relative_max_distance",
                              f"must exceed relative_buckets // 2 = {self.relative_buckets // 2}, the distances a "
                              f"decoder's buckets hold exactly (the logarithmic buckets span the distances between), "
                              f"got {self.relative_max_distance}")

    def _validate_rates(self) -> None:
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(name, f"must be in [0, 1), got {value}; use 0.0 to disable dropout")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError("norm_eps", f"must be a small positive number such as 1e-5, got {self.norm_eps}")
        if not self.rotary_base > 1:
            raise ConfigError("rotary_base", f"must be > 1 (10000 is usual), got {self.rotary_base}")
        if not (self.local_rotary_base == 0 or self.local_rotary_base > 1):
            raise ConfigError("local_rotary_base", f"must be 0 (same as rotary_base) or > 1, got {self.local_rotary_base}")
        if not 0 < self.rotary_fraction <= 1:
            raise ConfigError("rotary_fraction", f"must be in (0, 1], got {self.rotary_fraction}")
        for name in ("attention_softcap", "logit_softcap"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0 (0 means no cap), got {getattr(self, name)}")
        self._validate_rope_scaling()

    def _validate_rope_scaling(self) -> None:
        if self.rope_scaling == RopeScaling.NONE:
            return
        if not self.rope_factor > 0:
            raise ConfigError("rope_factor", f"must be > 0, got {self.rope_factor}")
        if self.rope_scaling == RopeScaling.LINEAR:
            return
        if not self.rope_original_positions:
            raise ConfigError(
                "rope_original_positions",
                f"{self.rope_scaling.value} scaling needs the context length the model was trained at "
                "(rope_original_positions, Hugging Face's original_max_position_embeddings)",
            )
        if self.rope_scaling == RopeScaling.LLAMA3 and not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise ConfigError(
                "rope_high_freq_factor",
                f"must exceed rope_low_freq_factor={self.rope_low_freq_factor}, got {self.rope_high_freq_factor}",
            )

    def _validate_combinations(self) -> None:
        arch = self.architecture
        if self.heads % self.kv_heads:
            raise ConfigError("kv_heads", f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}: "
                              "each key/value head serves an equal group of query heads")
        needs_encoder = arch in (Architecture.ENCODER_DECODER, Architecture.ENCODER_ONLY)
        needs_decoder = arch in (Architecture.ENCODER_DECODER, Architecture.DECODER_ONLY)
        if needs_encoder != (self.encoder_layers > 0):
            fix = "set encoder_layers >= 1" if needs_encoder else "set encoder_layers = 0"
            raise ConfigError("encoder_layers", f"{arch.value} model: {fix}")
        if needs_decoder != (self.decoder_layers > 0):
            fix = "set decoder_layers >= 1" if needs_decoder else "set decoder_layers = 0"
            raise ConfigError("decoder_layers", f"{arch.value} model: {fix}")
        if "src_vocab_size" not in self._derived and arch != Architecture.ENCODER_DECODER:
            raise ConfigError("src_vocab_size", "only an encoder-decoder has a source vocabulary; set it to 0")
        if self.tying == Tying.ALL and arch == Architecture.ENCODER_DECODER and self.src_vocab_size != self.vocab_size:
            raise ConfigError(
                "tying",
                f"tying='all' shares one matrix, but src_vocab_size={self.src_vocab_size} != "
                f"vocab_size={self.vocab_size}; use a joint vocabulary or tying='decoder'",
            )
        if self.positional == Positional.ROTARY and self.rotary_dims % 2:
            raise ConfigError(
                "positional",
                f"rotary positions rotate pairs of features, but {self.rotary_dims} features of each head rotate "
                f"(the head size {self.head_size} times rotary_fraction={self.rotary_fraction}), an odd number; "
                "choose d_model and heads (or head_size) that make it even",
            )
        self._validate_layer_types()
        if arch != Architecture.ENCODER_ONLY and (self.type_vocab_size or self.num_labels):
            raise ConfigError(
                "type_vocab_size" if self.type_vocab_size else "num_labels",
                "segment embeddings and classification heads belong to encoder-only models; set it to 0",
            )
        if self.pooling == Pooling.MEAN and self.pooler:
            raise ConfigError(
                "pooling", "pooling='mean' averages the hidden states and reads no pooler; set pooler=false"
            )

    def _validate_layer_types(self) -> None:
        if self.architecture != Architecture.DECODER_ONLY and (self.sliding_window or self.layer_types):
            raise ConfigError("sliding_window", "sliding-window layers belong to decoder-only models; set it to 0")
        if self.layer_types and len(self.layer_types) != self.decoder_layers:
            raise ConfigError(
                "layer_types",
                f"names {len(self.layer_types)} layers, but the model has decoder_layers={self.decoder_layers}",
            )
        if LayerType.SLIDING in self.layer_types and not self.sliding_window:
            raise ConfigError("sliding_window", "layer_types has sliding layers: set sliding_window >= 1")
        if self.sliding_window and self.positional == Positional.RELATIVE:
            raise ConfigError(
                "sliding_window", "sliding windows take rotary or absolute positions, not relative; set it to 0"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their string values) of the fields as set: derived ones at their default."""
        return plain_fields(self) | {name: _plain(_DEFAULTS[name]) for name in self._derived}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from `to_dict` output; unknown keys are an error. A dict with a `normalization`
        key (a checkpoint that names the norm placement `norm` and the norm kind `normalization`) reads
        those keys as `norm_placement` and `norm`."""
        if isinstance(data, Mapping) and "normalization" in data:
            renamed = {"norm": "norm_placement", "normalization": "norm"}
            data = {renamed.get(key, key): value for key, value in data.items()}
        return from_dict(cls, data)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again); derived fields derive again from the changed ones."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigError(unknown[0], f"unknown field; valid fields: {', '.join(_field_names(type(self)))}")
        return dataclasses.replace(self, **{name: _DEFAULTS[name] for name in self._derived} | changes)

    def tiny(self) -> ModelConfig:
        """The same choices at test size: 2 layers per stack, d_model 32, 4 heads, vocab 97.

        Grouped-query attention stays grouped, and a stack of sliding and full layers keeps one layer of each kind.
        """
        return self.replace(
            d_model=32, heads=4, d_ff=64, vocab_size=97, max_positions=64, relative_max_distance=32,
            encoder_layers=min(self.encoder_layers, 2), decoder_layers=min(self.decoder_layers, 2),
            num_labels=3 if self.architecture == Architecture.ENCODER_ONLY else 0,
            src_vocab_size=0 if "src_vocab_size" in self._derived else 89,
            kv_heads=2 if self.kv_heads < self.heads else 0,
            head_size=0 if "head_size" in self._derived else 16,
            attention_scale_dim=16 if self.attention_scale_dim else 0,
            sliding_window=min(self.sliding_window, 8),
            layer_types=_first_of_each_kind(self.layer_types, min(self.decoder_layers, 2)),
            rope_original_positions=min(self.rope_original_positions, 32),
        )


def _first_of_each_kind(layer_types: tuple[LayerType, ...], layers: int) -> tuple[LayerType, ...]:
    """`layers` layer types that keep both kinds of a mixed stack (Gemma 3's five sliding layers, then a full one)."""
    if not layer_types:
        return ()
    kinds = tuple(dict.fromkeys(layer_types))  # each kind once, in order of appearance
    return (kinds * layers)[:layers]


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


def _divisor_hint(d_model: int, heads: int) -> int:
    """The divisor of d_model nearest heads, looked for among the 2,000 counts around it (d_model may be huge)."""
    near = sorted(range(max(1, heads - 1000), heads + 1001), key=lambda h: abs(h - heads))
    return next((h for h in near if h <= d_model and d_model % h == 0), 1)


def plain_fields(obj: Any) -> dict[str, Any]:
    """A config dataclass's fields as a JSON-ready dict (enums as their string values)."""
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def coerce_fields(obj: Any) -> None:
    """Checks each field of a frozen config dataclass against its annotation, in place: enums parse from their
    string values and ints widen to floats; anything else of the wrong type is a `ConfigError` naming the field."""
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = _coerce(field.name, hints[field.name], getattr(obj, field.name))
        object.__setattr__(obj, field.name, value)


def _coerce(name: str, kind: Any, value: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _parse_enum(name, kind, value)
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    if value is None and type(None) in options:
        return value
    if float in options and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value}")
    for option in options:
        if option is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if option is bool and isinstance(value, bool):
            return value
        if option in (int, str, float) and isinstance(value, option) and not isinstance(value, bool):
            return value
        if dataclasses.is_dataclass(option) and isinstance(value, option):
            return value
        if typing.get_origin(option) is tuple and isinstance(value, (list, tuple)):
            item, *rest = typing.get_args(option)
            if rest == [Ellipsis] and isinstance(item, type) and issubclass(item, enum.Enum):
                return tuple(_parse_enum(name, item, v) for v in value)
            return tuple(value)
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(name, f"expected {names}, got {type(value).__name__} {value!r}")


C = TypeVar("C")


def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
    """Builds any of our config dataclasses from a mapping, rejecting unknown keys by name."""
    if not isinstance(data, Mapping):
        raise ConfigError(cls.__name__, f"expected a table of fields, got {type(data).__name__}")
    known = _field_names(cls)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(unknown[0], f"unknown key in {cls.__name__}; valid keys: {', '.join(known)}")
    return cls(**data)

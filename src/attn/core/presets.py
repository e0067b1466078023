"""The named presets: `ModelConfig`s of the paper's models and of the reference checkpoints.

Each preset cites its source (the paper's Table 3, or the Hugging Face `config.json` of the reference checkpoint);
`preset(name)` returns one, and every preset has a `-tiny` variant (`ModelConfig.tiny()`: the same choices, test size).
"""

from __future__ import annotations

from attn.core.config import (
    Activation,
    Architecture,
    LayerType,
    ModelConfig,
    Norm,
    NormPlacement,
    Positional,
    QKNorm,
    RopeScaling,
    SinusoidalLayout,
    Tying,
)
from attn.core.errors import ConfigError

_PRESETS: dict[str, ModelConfig] = {
    # Vaswani et al. 2017, Table 3 "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1; shared source-target BPE
    # vocabulary of about 37000 tokens (section 5.1), all three embedding matrices tied (section 3.4).
    "paper-base": ModelConfig(),
    # Table 3 "big": d_model=1024, d_ff=4096, h=16, P_drop=0.3 (EN-DE).
    "paper-big": ModelConfig(d_model=1024, heads=16, d_ff=4096, dropout=0.3),
    # bert-base-uncased config.json.
    "bert-base": ModelConfig(
        architecture=Architecture.ENCODER_ONLY,
        d_model=768,
        heads=12,
        d_ff=3072,
        encoder_layers=12,
        decoder_layers=0,
        vocab_size=30522,
        max_positions=512,
        attention_dropout=0.1,
        activation=Activation.GELU,
        norm_eps=1e-12,
        positional=Positional.LEARNED,
        scale_embedding=False,
        tying=Tying.DECODER,
        type_vocab_size=2,
        embedding_norm=True,
        output_bias=True,
    ),
    # gpt2 (124M) config.json: n_embd=768, n_head=12, n_layer=12, n_positions=1024.
    "gpt2": ModelConfig(
        architecture=Architecture.DECODER_ONLY,
        d_model=768,
        heads=12,
        d_ff=3072,
        encoder_layers=0,
        decoder_layers=12,
        vocab_size=50257,
        max_positions=1024,
        attention_dropout=0.1,
        activation=Activation.GELU_TANH,
        norm_placement=NormPlacement.PRE,
        final_norm=True,
        positional=Positional.LEARNED,
        scale_embedding=False,
        tying=Tying.DECODER,
    ),
    # Helsinki-NLP/opus-mt-en-de config.json (MarianMTModel): swish, sinusoidal positions in
    # two halves, scaled and tied embeddings, a final-logits bias.
    "marian-base": ModelConfig(
        vocab_size=58101,
        max_positions=512,
        activation=Activation.SILU,
        sinusoidal_layout=SinusoidalLayout.CONCATENATED,
        output_bias=True,
    ),
}
# sentence-transformers/all-MiniLM-L6-v2 config.json: a 6-layer, 384-wide BERT without the MLM head.
_PRESETS["minilm-l6"] = _PRESETS["bert-base"].replace(
    d_model=384, heads=12, d_ff=1536, encoder_layers=6, attention_dropout=0.1, mlm_head=False
)
# Character-level decoder sized for a CPU (the Shakespeare quickstart).
_PRESETS["char-gpt"] = _PRESETS["gpt2"].replace(
    d_model=256, heads=4, d_ff=1024, decoder_layers=4, vocab_size=96, max_positions=256, dropout=0.1,
    attention_dropout=0.0,
)

# The Llama family's common choices: a pre-norm decoder with RMSNorm, SwiGLU, rotary positions and no biases or
# dropout (meta-llama/Llama-3.2-1B config.json); each preset below changes what its checkpoint's config.json changes.
_LLAMA = ModelConfig(
    architecture=Architecture.DECODER_ONLY,
    encoder_layers=0,
    dropout=0.0,
    activation=Activation.SILU,
    gated_ffn=True,
    norm_placement=NormPlacement.PRE,
    norm=Norm.RMS,
    final_norm=True,
    positional=Positional.ROTARY,
    scale_embedding=False,
    tying=Tying.DECODER,
    attention_bias=False,
    ffn_bias=False,
)
# Gemma 2 and 3: pre- and post-norms of the form x / rms(x) * (1 + w), tanh-approximated GeGLU,
# embeddings scaled by sqrt(d_model) (google/gemma-2-2b config.json).
_GEMMA = _LLAMA.replace(
    activation=Activation.GELU_TANH, norm_placement=NormPlacement.PRE_POST, norm=Norm.RMS_UNIT_OFFSET,
    scale_embedding=True,
)
_PRESETS.update({
    # meta-llama/Llama-3.2-1B config.json: rope_theta 500000 with llama3 scaling (factor 32, low/high_freq_factor
    # 1/4, original_max_position_embeddings 8192), tied.
    "llama-3.2-1b": _LLAMA.replace(
        d_model=2048, heads=32, kv_heads=8, d_ff=8192, decoder_layers=16, vocab_size=128256, max_positions=131072,
        norm_eps=1e-5, rotary_base=500000.0, rope_scaling=RopeScaling.LLAMA3, rope_factor=32.0,
        rope_original_positions=8192, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
    ),
    # Qwen/Qwen2.5-0.5B config.json: use_sliding_window false, tied; Qwen2 biases q, k and v but not o.
    "qwen2.5-0.5b": _LLAMA.replace(
        d_model=896, heads=14, kv_heads=2, d_ff=4864, decoder_layers=24, vocab_size=151936, max_positions=32768,
        norm_eps=1e-6, rotary_base=1000000.0, attention_bias=True, attention_out_bias=False,
    ),
    # Qwen/Qwen3-0.6B config.json: head_dim 128 (not hidden / heads), tied; QK-norm per head.
    "qwen3-0.6b": _LLAMA.replace(
        d_model=1024, heads=16, kv_heads=8, head_size=128, d_ff=3072, decoder_layers=28, vocab_size=151936,
        max_positions=40960, norm_eps=1e-6, rotary_base=1000000.0, qk_norm=QKNorm.HEAD,
    ),
    # HuggingFaceTB/SmolLM2-135M config.json (LlamaForCausalLM): rope_theta 100000, tied.
    "smollm2-135m": _LLAMA.replace(
        d_model=576, heads=9, kv_heads=3, d_ff=1536, decoder_layers=30, vocab_size=49152, max_positions=8192,
        norm_eps=1e-5, rotary_base=100000.0,
    ),
    # HuggingFaceTB/SmolLM2-360M config.json: wider and deeper, otherwise as SmolLM2-135M.
    "smollm2-360m": _LLAMA.replace(
        d_model=960, heads=15, kv_heads=5, d_ff=2560, decoder_layers=32, vocab_size=49152, max_positions=8192,
        norm_eps=1e-5, rotary_base=100000.0,
    ),
    # google/gemma-2-2b config.json: head_dim 256, query_pre_attn_scalar 256 (= head_dim), attn_logit_softcapping
    # 50, final_logit_softcapping 30, sliding_window 4096 on every other layer from the first, tied.
    "gemma-2-2b": _GEMMA.replace(
        d_model=2304, heads=8, kv_heads=4, head_size=256, d_ff=9216, decoder_layers=26, vocab_size=256000,
        max_positions=8192, norm_eps=1e-6, attention_softcap=50.0, logit_softcap=30.0, sliding_window=4096,
        layer_types=(LayerType.SLIDING, LayerType.FULL) * 13,
    ),
    # google/gemma-3-270m config.json (Gemma3ForCausalLM): head_dim 256, query_pre_attn_scalar 256, QK-norm,
    # sliding_window 512 on five layers of every six, rope_theta 1000000 on the full layers and
    # rope_local_base_freq 10000 on the sliding ones, no soft caps, tied.
    "gemma-3-270m": _GEMMA.replace(
        d_model=640, heads=4, kv_heads=1, head_size=256, d_ff=2048, decoder_layers=18, vocab_size=262144,
        max_positions=32768, norm_eps=1e-6, qk_norm=QKNorm.HEAD, rotary_base=1000000.0, local_rotary_base=10000.0,
        sliding_window=512, layer_types=(*(LayerType.SLIDING,) * 5, LayerType.FULL) * 3,
    ),
    # mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096 on every layer, untied.
    "mistral-7b": _LLAMA.replace(
        d_model=4096, heads=32, kv_heads=8, d_ff=14336, decoder_layers=32, vocab_size=32000, max_positions=32768,
        norm_eps=1e-5, sliding_window=4096, tying=Tying.NONE,
    ),
    # allenai/OLMo-2-0425-1B config.json: untied; OLMo 2 normalises each sub-layer's output and the whole query and
    # key projections.
    "olmo-2-1b": _LLAMA.replace(
        d_model=2048, heads=16, d_ff=8192, decoder_layers=16, vocab_size=100352, max_positions=4096,
        norm_eps=1e-6, rotary_base=500000.0, norm_placement=NormPlacement.OUTPUT, qk_norm=QKNorm.PROJECTION,
        tying=Tying.NONE,
    ),
    # microsoft/Phi-3-mini-4k-instruct config.json: no rope scaling, sliding_window 2047, untied.
    "phi-3-mini": _LLAMA.replace(
        d_model=3072, heads=32, d_ff=8192, decoder_layers=32, vocab_size=32064, max_positions=4096, norm_eps=1e-5,
        sliding_window=2047, tying=Tying.NONE,
    ),
})
_PRESETS.update({f"{name}-tiny": cfg.tiny() for name, cfg in list(_PRESETS.items())})


def preset_names() -> list[str]:
    return list(_PRESETS)


def preset(name: str) -> ModelConfig:
    """The named preset. Exact names only; an unknown name lists the valid ones.

    Example:
        >>> from attn import preset
        >>> config = preset("paper-base")
        >>> config.d_model, config.heads, config.encoder_layers
        (512, 8, 6)
    """
    try:
        return _PRESETS[name]
    except KeyError:
        raise ConfigError("preset", f"unknown preset {name!r}; valid presets: {', '.join(_PRESETS)}") from None

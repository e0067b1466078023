"""ModelConfig validation, presets and the dict round trip."""

import pytest

from attn.core.config import Architecture, ModelConfig, Norm, NormPlacement, Positional
from attn.core.errors import ConfigError
from attn.core.presets import preset, preset_names


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_round_trips_through_dict(name):
    cfg = preset(name)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        preset("paper-small")
    assert "paper-base" in str(err.value) and "gpt2" in str(err.value)


def test_near_miss_preset_names_are_not_matched():
    for name in ("GPT2", "gpt-2", "paper_base"):
        with pytest.raises(ConfigError):
            preset(name)


@pytest.mark.parametrize(
    "fields,field",
    [
        ({"d_model": 100, "heads": 3}, "d_model"),
        ({"dropout": -0.1}, "dropout"),
        ({"dropout": 1.0}, "dropout"),
        ({"positional": "rotary", "d_model": 24, "heads": 8}, "positional"),
        ({"positional": "alibi"}, "positional"),
        ({"activation": "tanh"}, "activation"),
        ({"d_model": "512"}, "d_model"),
        ({"final_norm": 1}, "final_norm"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"heads": 0}, "heads"),
        ({"encoder_layers": 0}, "encoder_layers"),
        ({"architecture": "decoder-only"}, "encoder_layers"),
        ({"architecture": "decoder-only", "encoder_layers": 0, "decoder_layers": 2, "type_vocab_size": 2},
         "type_vocab_size"),
        ({"src_vocab_size": 1000}, "tying"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"relative_buckets": 32, "relative_max_distance": 16}, "relative_max_distance"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_invalid_fields_name_the_field(fields, field):
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict(fields)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}:")


def test_error_suggests_a_fix():
    with pytest.raises(ConfigError, match="divisors of d_model"):
        ModelConfig(d_model=100, heads=3)
    with pytest.raises(ConfigError, match="joint vocabulary or tying='decoder'"):
        ModelConfig(src_vocab_size=1000)


def test_enum_values_parse_from_strings_and_ints_widen():
    cfg = ModelConfig.from_dict({"positional": "learned", "dropout": 0, "architecture": "encoder-decoder"})
    assert cfg.positional is Positional.LEARNED and cfg.dropout == 0.0 and isinstance(cfg.dropout, float)
    assert cfg.to_dict()["positional"] == "learned"


def test_paper_presets_follow_table_3():
    base, big = preset("paper-base"), preset("paper-big")
    assert (base.d_model, base.d_ff, base.heads, base.encoder_layers, base.dropout) == (512, 2048, 8, 6, 0.1)
    assert (big.d_model, big.d_ff, big.heads, big.encoder_layers, big.dropout) == (1024, 4096, 16, 6, 0.3)
    assert base.head_size == 64 and big.head_size == 64


def test_tiny_keeps_the_choices():
    gpt2 = preset("gpt2")
    tiny = preset("gpt2-tiny")
    assert tiny.architecture == Architecture.DECODER_ONLY and tiny.norm_placement == gpt2.norm_placement
    assert tiny.activation == gpt2.activation and tiny.d_model == 32


def test_derived_fields_hold_their_values():
    base, qwen = preset("paper-base"), preset("qwen2.5-0.5b")
    assert (base.src_vocab_size, base.kv_heads, base.head_size, base.attention_out_bias) == (37000, 8, 64, True)
    assert (qwen.kv_heads, qwen.head_size, qwen.attention_bias, qwen.attention_out_bias) == (2, 64, True, False)


def test_replace_derives_again_from_the_changed_fields():
    base = preset("paper-base")
    assert base.replace(d_model=256).head_size == 32  # 256 / 8
    assert base.replace(heads=4).kv_heads == 4 and base.replace(heads=4).head_size == 128
    assert base.replace(vocab_size=1000).src_vocab_size == 1000
    assert base.replace(attention_bias=False).attention_out_bias is False
    assert preset("bert-base").replace(d_model=384).head_size == 32 == preset("minilm-l6").head_size


def test_replace_keeps_the_fields_that_were_set():
    qwen3, qwen2 = preset("qwen3-0.6b"), preset("qwen2.5-0.5b")
    assert qwen3.replace(d_model=512).head_size == 128
    assert qwen2.replace(heads=28).kv_heads == 2
    assert qwen2.replace(attention_bias=False).attention_out_bias is False


def test_to_dict_writes_derived_fields_as_set():
    fields = preset("paper-base").to_dict()
    derived = ("src_vocab_size", "kv_heads", "head_size", "attention_out_bias")
    assert [fields[name] for name in derived] == [0, 0, 0, None]
    assert preset("qwen3-0.6b").to_dict()["head_size"] == 128
    assert ModelConfig.from_dict(preset("paper-base").to_dict()).replace(d_model=256).head_size == 32


def test_from_dict_reads_a_checkpoint_with_the_keys_norm_and_normalization():
    stored = {**preset("gpt2").to_dict(), "norm": "pre", "normalization": "rmsnorm"}
    del stored["norm_placement"]
    config = ModelConfig.from_dict(stored)
    assert (config.norm_placement, config.norm) == (NormPlacement.PRE, Norm.RMS)
    assert config == preset("gpt2").replace(norm=Norm.RMS)
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict({**stored, "colour": "blue"})
    assert err.value.field == "colour"

"""Strictness of the converters: every damaged checkpoint is a CheckpointError that names the problem.

A saved tiny `transformers` model of each family loses a key, gains one, or has one reshaped;
the error must name that key. Unsupported model types and options, missing files and exports
to a family that cannot express the model are refused too.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    Phi3Config,
    Phi3ForCausalLM,
)

from attn.artifacts.pretrained import FAMILIES, export_pretrained, load_pretrained
from attn.artifacts.pretrained.keymap import COPY, ROW_VECTOR, TRANSPOSE, Concat
from attn.core.errors import CheckpointError
from attn.models import build_model
from attn.core.presets import preset

TINY_MODELS = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=64)),
    "bert": lambda: BertModel(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=64)),
    "marian": lambda: MarianMTModel(MarianConfig(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2,
                                                 encoder_attention_heads=4, decoder_attention_heads=4,
                                                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                                                 pad_token_id=96, decoder_start_token_id=96)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)),
    "phi3": lambda: Phi3ForCausalLM(Phi3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                               eos_token_id=1)),
}
# family -> (a key to drop, a key no model has, (a key to reshape, its wrong shape))
DAMAGE = {
    "gpt2": ("transformer.h.1.mlp.c_fc.bias", "transformer.h.2.ln_1.weight",
             ("transformer.h.0.attn.c_attn.weight", (32, 95))),
    "bert": ("encoder.layer.1.attention.self.key.weight", "encoder.layer.0.attention.self.rotary.weight",
             ("embeddings.token_type_embeddings.weight", (3, 32))),
    "marian": ("model.decoder.layers.0.encoder_attn.v_proj.bias", "model.encoder.layernorm_embedding.weight",
               ("final_logits_bias", (1, 96))),
    "llama": ("model.layers.1.self_attn.k_proj.weight", "model.layers.0.self_attn.q_norm.weight",
              ("model.layers.0.self_attn.v_proj.weight", (32, 32))),
    "phi3": ("model.layers.0.mlp.gate_up_proj.weight", "model.layers.1.pre_feedforward_layernorm.weight",
             ("model.layers.1.self_attn.qkv_proj.weight", (96, 32))),
}


@pytest.fixture(params=list(TINY_MODELS))
def family_folder(request, saved):
    return request.param, saved(TINY_MODELS[request.param]())


def edit_weights(folder, edit):
    path = folder / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path, metadata={"format": "pt"})


def edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_the_undamaged_checkpoint_loads(family_folder):
    family, folder = family_folder
    assert load_pretrained(folder)[2].family == family


def test_a_missing_key_is_named(family_folder):
    family, folder = family_folder
    key = DAMAGE[family][0]
    edit_weights(folder, lambda state: state.pop(key))
    with pytest.raises(CheckpointError, match=f"missing key '{key}'"):
        load_pretrained(folder)


def test_an_unknown_key_is_named(family_folder):
    family, folder = family_folder
    key = DAMAGE[family][1]
    edit_weights(folder, lambda state: state.update({key: torch.zeros(32)}))
    with pytest.raises(CheckpointError, match=f"unknown key '{key}'"):
        load_pretrained(folder)


def test_a_misshaped_key_is_named(family_folder):
    family, folder = family_folder
    key, shape = DAMAGE[family][2]
    edit_weights(folder, lambda state: state.update({key: torch.zeros(shape)}))
    with pytest.raises(CheckpointError, match=rf"key '{key}' has shape \({shape[0]}, {shape[1]}\)"):
        load_pretrained(folder)


def test_unsupported_model_type_lists_the_supported_ones(family_folder):
    _, folder = family_folder
    edit_config(folder, model_type="t5")
    with pytest.raises(CheckpointError, match="model_type 't5' is not supported; attn converts gpt2, bert, marian"):
        load_pretrained(folder)


def test_unsupported_options_are_refused(saved):
    folder = saved(TINY_MODELS["gpt2"]())
    edit_config(folder, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(CheckpointError, match="scale_attn_by_inverse_layer_idx=True is not supported"):
        load_pretrained(folder)
    edit_config(folder, scale_attn_by_inverse_layer_idx=False, activation_function="quick_gelu")
    with pytest.raises(CheckpointError, match="activation_function='quick_gelu' is not supported"):
        load_pretrained(folder)


def test_missing_and_unreadable_files(saved, tmp_path):
    with pytest.raises(CheckpointError, match="config.json: no such file"):
        load_pretrained(tmp_path)
    folder = saved(TINY_MODELS["bert"]())
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_pretrained(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights found; expected model.safetensors"):
        load_pretrained(folder)


def test_export_refuses_a_family_that_cannot_express_the_model(tmp_path):
    config = preset("paper-base-tiny")
    model = build_model(config)
    with pytest.raises(CheckpointError, match="unknown family 't5'"):
        export_pretrained(model, config, tmp_path, "t5")
    with pytest.raises(CheckpointError, match="sinusoidal_layout='interleaved' cannot be expressed as a marian"):
        export_pretrained(model, config, tmp_path, "marian")
    with pytest.raises(CheckpointError, match="architecture='encoder-decoder' cannot be expressed as a gpt2"):
        export_pretrained(model, config, tmp_path, "gpt2")


@pytest.mark.parametrize("name, family, message", [
    ("qwen3-0.6b-tiny", "llama", "qk_norm='head' cannot be expressed as a llama checkpoint"),
    ("qwen2.5-0.5b-tiny", "llama", "attention_out_bias=False cannot be expressed as a llama checkpoint"),
    ("mistral-7b-tiny", "llama", "sliding_window=8 cannot be expressed as a llama checkpoint"),
    ("gemma-2-2b-tiny", "mistral", "norm_placement='pre-post' cannot be expressed as a mistral checkpoint"),
    ("gemma-2-2b-tiny", "gemma3_text", "qk_norm='none' cannot be expressed as a gemma3_text checkpoint"),
    ("gemma-3-270m-tiny", "gemma2", "local_rotary_base=10000.0 cannot be expressed as a gemma2 checkpoint"),
    ("olmo-2-1b-tiny", "llama", "norm_placement='output' cannot be expressed as a llama checkpoint"),
    ("phi-3-mini-tiny", "qwen2", "attention_bias=False cannot be expressed as a qwen2 checkpoint"),
    ("llama-3.2-1b-tiny", "phi3", (r"cannot be expressed as a phi3 checkpoint \(config.json: "
                                   "rope_parameters.rope_type='llama3' is not supported")),
])
def test_export_refuses_what_the_llama_family_cannot_express(name, family, message, tmp_path):
    config = preset(name)
    with pytest.raises(CheckpointError, match=message):
        export_pretrained(build_model(config), config, tmp_path, family)


LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 97}


@pytest.mark.parametrize("family, fields, message", [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_parameters.rope_type='dynamic' is not supported by attn"),
    ("llama", {"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_scaling.rope_type='longrope' is not"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}},
     "rope_scaling.rope_type='longrope' is not supported by attn"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "truncate": False}},
     "rope_parameters.truncate=False is not supported by attn"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}},
     "rope_parameters has no 'low_freq_factor'"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported by attn"),
    ("qwen2", {"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not supported"),
    ("gemma3_text", {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "rope_parameters.sliding_attention.rope_type='linear' is not supported"),
    ("qwen2", {"layer_types": ["full_attention", "sliding_attention"]},
     "layer_types has sliding layers but use_sliding_window with sliding_window gives no window"),
    ("gemma2", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types=.* must name one of"),
])
def test_llama_family_options_attn_lacks_are_named(family, fields, message):
    with pytest.raises(CheckpointError, match=message):
        FAMILIES[family].model_config({**LLAMA, "model_type": family, **fields}, ())


def test_export_refuses_a_config_the_model_was_not_built_from(tmp_path):
    base = preset("bert-base-tiny").replace(num_labels=0, mlm_head=False)
    with pytest.raises(CheckpointError, match="the model has no 'mlm.transform.weight'"):
        export_pretrained(build_model(base), base.replace(mlm_head=True, pooler=False), tmp_path, "bert")


@pytest.mark.parametrize("transform, parts", [(COPY, 1), (Concat(), 3), (Concat((4, 1, 1)), 3), (TRANSPOSE, 1)])
def test_transforms_invert_each_other(transform, parts):
    ours = torch.randn(6, 4)
    theirs = transform.to_theirs(ours, parts)
    assert len(theirs) == parts
    assert torch.equal(transform.to_ours(theirs), ours)


def test_row_vector_transform():
    bias = torch.randn(5)
    assert ROW_VECTOR.to_theirs(bias, 1)[0].shape == (1, 5)
    assert torch.equal(ROW_VECTOR.to_ours(ROW_VECTOR.to_theirs(bias, 1)), bias)

"""Rope scaling against `transformers`' own functions (`ROPE_INIT_FUNCTIONS`) at 1e-6.

`attn.core.positional`'s linear, llama3 and YaRN rules and YaRN's attention factor, and `rope_frequencies`
of a whole config read from config.json (partial rotation included), on the settings of real
checkpoints: Llama 3.1 and 3.2, Qwen2.5's long-context YaRN, a YaRN with mscale (DeepSeek's form).
"""

import pytest
import torch
from reference_imports import require

transformers = require("transformers")
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from attn.artifacts.pretrained import FAMILIES
from attn.models.build import rope_frequencies
from attn.core.positional import (
    linear_scaling,
    llama3_scaling,
    rotary_frequencies,
    yarn_attention_factor,
    yarn_scaling,
)
from attn.core.presets import preset

LLAMA_3 = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def theirs(head_dim, rope):
    """transformers' inverse frequencies and cos/sin scale for a Llama of this head size and rope parameters."""
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=131072, rope_parameters=dict(rope))
    compute = ROPE_INIT_FUNCTIONS.get(rope["rope_type"], LlamaRotaryEmbedding.compute_default_rope_parameters)
    inv_freq, scale = compute(config, device="cpu")
    return inv_freq.double(), scale


def close(ours, expected):
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("head_dim, base, factor", [(64, 10000.0, 4.0), (128, 1e6, 8.0)])
def test_linear_scaling(head_dim, base, factor):
    expected, scale = theirs(head_dim, {"rope_type": "linear", "rope_theta": base, "factor": factor})
    close(linear_scaling(rotary_frequencies(head_dim, base), factor), expected)
    assert scale == 1.0


@pytest.mark.parametrize("head_dim, factor", [(64, 32.0), (128, 8.0)])  # Llama 3.2 1B, Llama 3.1 8B
def test_llama3_scaling(head_dim, factor):
    expected, _ = theirs(head_dim, {**LLAMA_3, "factor": factor})
    unscaled = rotary_frequencies(head_dim, 500000.0)
    ours = llama3_scaling(unscaled, factor, 8192, 1.0, 4.0)
    close(ours, expected)
    assert (ours == unscaled).any() and (ours < unscaled).any()  # high frequencies kept, low ones divided


@pytest.mark.parametrize("head_dim, base, factor, original, betas", [
    (128, 1e6, 4.0, 32768, (32.0, 1.0)),  # Qwen2.5's long-context setting
    (64, 10000.0, 16.0, 4096, (32.0, 1.0)),
    (64, 10000.0, 8.0, 2048, (16.0, 2.0)),
])
def test_yarn_scaling_and_attention_factor(head_dim, base, factor, original, betas):
    rope = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": betas[0], "beta_slow": betas[1]}
    expected, scale = theirs(head_dim, rope)
    close(yarn_scaling(rotary_frequencies(head_dim, base), base, factor, original, *betas), expected)
    assert yarn_attention_factor(factor) == pytest.approx(scale, abs=1e-6)
    assert scale > 1


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    {**LLAMA_3, "factor": 32.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4096,
     "attention_factor": 1.25},
])
def test_rope_frequencies_of_a_config_read_from_config_json(rope):
    hf = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
          "max_position_embeddings": 131072, "rope_parameters": rope}
    inv_freq, scale = rope_frequencies(FAMILIES["llama"].model_config(hf, ()))
    expected, expected_scale = theirs(64, rope)
    close(inv_freq, expected)
    assert scale == pytest.approx(expected_scale, abs=1e-6)


def test_partial_rotation_scales_the_frequencies_of_the_rotated_features():
    """Phi-3's partial_rotary_factor: the rule applies to the first half of each head's features."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4096}
    config = preset("llama-3.2-1b").replace(rope_scaling="yarn", rope_factor=4.0, rope_original_positions=4096,
                                            rotary_base=10000.0, rotary_fraction=0.5)
    inv_freq, scale = rope_frequencies(config)
    expected, expected_scale = theirs(64, {**rope, "partial_rotary_factor": 0.5})
    assert inv_freq.shape == (16,)
    close(inv_freq, expected)
    assert scale == pytest.approx(expected_scale, abs=1e-6)


def test_the_llama_3_2_preset_rotates_as_its_config_json_does():
    close(rope_frequencies(preset("llama-3.2-1b"))[0], theirs(64, {**LLAMA_3, "factor": 32.0})[0])

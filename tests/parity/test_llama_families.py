"""The Llama-style families against `transformers`: a tiny random model of each, saved and loaded with `load_model`.

Each family's case turns on what sets it apart: grouped-query attention (2 key/value heads of 4, Gemma 3
one), a head size other than d_model / heads, biases, QK-norm, Gemma's (1 + w) norms and soft caps,
OLMo 2's output norms, Phi-3's fused matrices and partial rotation, rope scaling (llama3, YaRN, linear)
and sliding windows of 5 or 6 positions that the 14-token inputs overrun. Logits of a left-padded batch,
greedy continuations, the KV cache against the full forward pass, and export back to `transformers`
(in Python and through `attn convert`) are compared, all in float32 at 1e-5.
"""

import dataclasses
import json

import pytest
import torch
from hf_reference import hf_continuations, hf_logits
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from attn import load_model
from attn.app.cli import main
from attn.artifacts.pretrained import FAMILIES, export_pretrained
from attn.core.config import Tying
from attn.decoding import GenerationConfig, generate

SIZES = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


@dataclasses.dataclass(frozen=True)
class Case:
    config: type
    fields: dict
    attention: str = "sdpa"  # transformers' attention; Gemma 2's soft cap needs the eager one


CASES = {
    "llama": Case(LlamaConfig, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True,
                                "rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 16}}),
    "qwen2": Case(Qwen2Config, {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1,
                                "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                                    "original_max_position_embeddings": 16}}),
    "qwen3": Case(Qwen3Config, {"head_dim": 24, "tie_word_embeddings": True}),
    "mistral": Case(MistralConfig, {"sliding_window": 5, "head_dim": 8,
                                    "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}),
    # Gemma untied: a random model with scaled, tied embeddings only repeats its last token.
    "gemma2": Case(Gemma2Config, {"head_dim": 16, "query_pre_attn_scalar": 20, "sliding_window": 5,
                                  "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0,
                                  "tie_word_embeddings": False}, "eager"),
    "gemma3_text": Case(Gemma3TextConfig, {
        "head_dim": 16, "num_key_value_heads": 1, "sliding_window": 5, "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e5, "factor": 2.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}}),
    "olmo2": Case(Olmo2Config, {"num_key_value_heads": 4, "rope_theta": 5e5}),
    "phi3": Case(Phi3Config, {"partial_rotary_factor": 0.5, "sliding_window": 6}),
}
families = pytest.mark.parametrize("family", list(CASES))


def hf_model(family, randomised):
    case = CASES[family]
    config = case.config(**{**SIZES, **case.fields})
    return randomised(AutoModelForCausalLM.from_config(config, attn_implementation=case.attention), seed=1)


@pytest.fixture
def hf_dir(family, randomised, saved):
    """(the tiny random transformers model of `family`, the folder it is saved in)."""
    hf = hf_model(family, randomised)
    return hf, saved(hf)


def padded_batch(tokens):
    """Three rows of 14 tokens: unpadded, left-padded by 3, left-padded by 8."""
    ids = tokens(3, 14, seed=2)
    mask = torch.ones(3, 14, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :8] = False
    return ids, mask


@families
def test_load_model_reads_the_family(family, hf_dir):
    _, folder = hf_dir
    bundle = load_model(folder, "cpu", require_tokenizer=False)
    assert (bundle.task, bundle.imported.family) == ("lm", family)
    assert (bundle.imported.ids.bos, bundle.eos_id, bundle.pad_id) == (1, 2, 0)


@families
def test_logits_match_transformers_on_a_left_padded_batch(family, hf_dir, tokens):
    hf, folder = hf_dir
    model = load_model(folder, "cpu", require_tokenizer=False).model
    ids, mask = padded_batch(tokens)
    expected = hf_logits(hf, ids, mask)
    with torch.no_grad():
        ours = model(ids, mask)
    assert expected[mask].abs().mean() > 0.05  # far above the tolerance, so a misplaced weight shows
    torch.testing.assert_close(ours[mask], expected[mask], atol=1e-5, rtol=0)


def test_a_list_of_end_ids_gives_its_first(randomised, saved):
    hf = hf_model("llama", randomised)
    hf.config.eos_token_id = [2, 3]  # Llama 3 Instruct lists three
    bundle = load_model(saved(hf), "cpu", require_tokenizer=False)
    assert (bundle.eos_id, bundle.imported.ids.eos) == (2, 2)


PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 23, 11], [12, 7, 30], [33, 34, 35, 36, 37, 38]]


@families
def test_greedy_continuations_match_transformers(family, hf_dir):
    hf, folder = hf_dir
    model = load_model(folder, "cpu", require_tokenizer=False).model
    free = generate(model, PROMPTS, GenerationConfig(max_new_tokens=12))
    eos = next(t for i, t in enumerate(free[0]) if i >= 5 and t not in free[0][:i])  # new in row 0 at step >= 5
    ours = generate(model, PROMPTS, GenerationConfig(max_new_tokens=12), eos_id=eos)
    assert ours == hf_continuations(hf, PROMPTS, eos, max_new_tokens=12)[0]
    assert 5 <= len(ours[0]) < 12 and len(set(ours[0])) > 1  # EOS ended row 0 early, after varied tokens


@families
def test_kv_cache_sized_by_kv_heads_gives_the_full_forward_logits(family, hf_dir, tokens):
    _, folder = hf_dir
    bundle = load_model(folder, "cpu", require_tokenizer=False)
    model, config = bundle.model, bundle.model_config
    ids, mask = padded_batch(tokens)
    full = model(ids, mask).detach()
    with torch.no_grad():
        cache = model.new_cache(3, 14)
        pieces = [model.decode_step(ids[:, :6], cache, mask[:, :6])]
        pieces += [model.decode_step(ids[:, t : t + 1], cache, mask[:, t : t + 1]) for t in range(6, 14)]
    kv_heads = CASES[family].fields.get("num_key_value_heads", SIZES["num_key_value_heads"])
    assert cache.keys.shape == (2, 3, kv_heads, 14, config.head_size)  # (layers, B, h_kv, T, d_k)
    torch.testing.assert_close(torch.cat(pieces, dim=1)[mask], full[mask], atol=1e-5, rtol=1e-5)


def reloaded(folder, family):
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation=CASES[family].attention).eval()


@families
def test_export_reloads_in_transformers_with_identical_tensors(family, hf_dir, tmp_path, tokens):
    hf, folder = hf_dir
    bundle = load_model(folder, "cpu", require_tokenizer=False)
    out = export_pretrained(bundle.model, bundle.model_config, tmp_path / "exported", family, ids=bundle.imported.ids)
    again = reloaded(out, family)
    expected = hf.state_dict()
    assert sorted(again.state_dict()) == sorted(expected)
    for key, tensor in again.state_dict().items():
        assert torch.equal(tensor, expected[key]), key
    tied = bundle.model_config.tying != Tying.NONE
    assert ("lm_head.weight" in load_file(out / "model.safetensors")) != tied
    assert (again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()) == tied
    ids, mask = padded_batch(tokens)
    torch.testing.assert_close(hf_logits(again, ids, mask), hf_logits(hf, ids, mask), atol=0, rtol=0)


@families
def test_attn_convert_both_ways_keeps_the_logits(family, hf_dir, tmp_path, tokens):
    hf, folder = hf_dir
    assert main(["convert", "--to", "attn", str(folder), str(tmp_path / "ours")]) == 0
    assert main(["convert", "--to", family, str(tmp_path / "ours"), str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == family
    ids, mask = padded_batch(tokens)
    torch.testing.assert_close(hf_logits(reloaded(tmp_path / "back", family), ids, mask)[mask],
                               hf_logits(hf, ids, mask)[mask], atol=0, rtol=0)


# config.json as transformers 4 wrote it: rope_theta at the top, the scaling in rope_scaling under "type",
# Gemma 3's rope_local_base_freq and sliding_window_pattern, no layer_types.
OLDER = {
    "llama": {"rope_theta": 500.0, "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "qwen2": {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1, "rope_theta": 1000.0,
              "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    "mistral": {"sliding_window": 5, "rope_theta": 1e6},
    "gemma2": {"head_dim": 16, "sliding_window": 5},
    "gemma3_text": {"head_dim": 16, "sliding_window": 5, "sliding_window_pattern": 2, "rope_theta": 1e5,
                    "rope_local_base_freq": 1e3, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "phi3": {"rope_theta": 1e4, "partial_rotary_factor": 0.5, "sliding_window": 6},
}


@pytest.mark.parametrize("family", OLDER)
def test_older_config_json_spellings_read_as_transformers_reads_them(family, tmp_path):
    older = {**SIZES, "model_type": family, **OLDER[family]}
    AutoConfig.for_model(**older).save_pretrained(tmp_path)  # what transformers makes of them, in its own spelling
    current = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in current and "rope_scaling" not in current
    read = FAMILIES[family].model_config
    assert read(older, ()) == read(current, ())

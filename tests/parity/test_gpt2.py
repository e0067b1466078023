"""GPT-2: a tiny random `transformers` GPT-2 through `load_pretrained`, against `transformers` itself.

Logits on a padded batch (left and right padding), the bare `GPT2Model` layout, an old-style
`pytorch_model.bin` with the buffers old checkpoints carry, export back to `transformers`, and
greedy generation and beam search with left-padded prompts.
"""

import dataclasses
import json

import pytest
import torch
from hf_reference import hf_continuations, hf_logits
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model, GPT2Tokenizer

from attn.artifacts.pretrained import load_pretrained
from attn.decoding import GenerationConfig, generate
from attn.decoding.beam_search import beam_search, huggingface_config
from attn.core.errors import CheckpointError
from attn.core.presets import preset

HF_CONFIG = dict(n_layer=2, n_embd=32, n_head=4, n_inner=64, vocab_size=97, n_positions=64, bos_token_id=0,
                 eos_token_id=0)


@pytest.fixture
def hf_lm(randomised):
    return randomised(GPT2LMHeadModel(GPT2Config(**HF_CONFIG)), seed=1)  # a seed whose greedy output varies


def padded_batch(tokens):
    """Three rows of 10: unpadded, left-padded by 3, right-padded by 4."""
    ids = tokens(3, 10)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, 6:] = False
    return ids, mask


def test_config_is_the_gpt2_preset_at_tiny_size(hf_lm, saved):
    _, _, info = load_pretrained(saved(hf_lm))
    expected = preset("gpt2").replace(d_model=32, heads=4, d_ff=64, decoder_layers=2, vocab_size=97, max_positions=64)
    assert info.family == "gpt2"
    assert info.config == expected
    assert (info.ids.bos, info.ids.eos, info.unused) == (0, 0, {})


@pytest.mark.parametrize("attention", ["fast", "reference"])
def test_logits_match_transformers_on_a_padded_batch(hf_lm, saved, tokens, attention):
    model, _, _ = load_pretrained(saved(hf_lm), attention=attention)
    ids, mask = padded_batch(tokens)
    expected = hf_logits(hf_lm, ids, mask)
    with torch.no_grad():
        ours = model(ids, mask)
    assert expected[mask].abs().mean() > 0.05  # far above the tolerance, so a misplaced weight shows
    torch.testing.assert_close(ours[mask], expected[mask], atol=1e-5, rtol=0)


def test_bare_gpt2model_checkpoint_without_prefix(randomised, saved, tokens):
    hf = randomised(GPT2Model(GPT2Config(**HF_CONFIG)))
    folder = saved(hf)
    assert not any(key.startswith("transformer.") for key in load_file(folder / "model.safetensors"))
    model, _, _ = load_pretrained(folder)
    ids, mask = padded_batch(tokens)
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask.long(), position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        expected = hidden.last_hidden_state @ hf.wte.weight.T  # the tied LM head
        ours = model(ids, mask)
    torch.testing.assert_close(ours[mask], expected[mask], atol=1e-5, rtol=0)


def old_style_checkpoint(folder, mask_buffer):
    """Rewrites a saved GPT2LMHeadModel as old checkpoints were: .bin, mask buffers, tied head copy."""
    state = load_file(folder / "model.safetensors")
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    for layer in range(HF_CONFIG["n_layer"]):
        state[f"transformer.h.{layer}.attn.bias"] = mask_buffer.clone()
        state[f"transformer.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")


def test_old_pytorch_bin_with_buffers_loads_and_checks_them(hf_lm, saved, tokens):
    causal = torch.ones(64, 64, dtype=torch.uint8).tril()[None, None]
    good, bad = saved(hf_lm, "good"), saved(hf_lm, "bad")
    old_style_checkpoint(good, causal)
    old_style_checkpoint(bad, torch.ones_like(causal))
    model, _, _ = load_pretrained(good)
    ids, mask = padded_batch(tokens)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask)[mask], hf_logits(hf_lm, ids, mask)[mask], atol=1e-5, rtol=0)
    with pytest.raises(CheckpointError, match=r"'transformer\.h\.0\.attn\.bias' differs"):
        load_pretrained(bad)


def test_untied_head_must_agree_when_the_config_ties_it(hf_lm, saved):
    folder = saved(hf_lm)
    state = load_file(folder / "model.safetensors")
    state["lm_head.weight"] = state["transformer.wte.weight"] + 1.0
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="'lm_head.weight' differs from 'transformer.wte.weight'"):
        load_pretrained(folder)


def test_export_reloads_in_transformers_with_identical_tensors(hf_lm, saved, tokens, assert_exports_identically):
    model, _, info = load_pretrained(saved(hf_lm))
    folder = assert_exports_identically(model, info, hf_lm, GPT2LMHeadModel)
    reloaded = GPT2LMHeadModel.from_pretrained(folder).eval()
    ids, mask = padded_batch(tokens)
    torch.testing.assert_close(hf_logits(reloaded, ids, mask), hf_logits(hf_lm, ids, mask), atol=0, rtol=0)


def write_gpt2_tokenizer_files(folder):
    """A small byte-level BPE in GPT-2's file format: the 256 byte symbols, four merges, <|endoftext|>."""
    symbols = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + [chr(c) for c in range(174, 256)]
    symbols += [chr(256 + i) for i in range(256 - len(symbols))]  # GPT-2 maps the other bytes above 255
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "t")]
    vocab = {s: i for i, s in enumerate([*symbols, *("".join(m) for m in merges), "<|endoftext|>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def test_vocab_and_merges_load_the_gpt2_tokenizer(hf_lm, saved):
    folder = saved(hf_lm)
    write_gpt2_tokenizer_files(folder)
    _, tokenizer, _ = load_pretrained(folder)
    texts = ["the cat at the hat", " The thé<|endoftext|>", "naïve ☃ emoji 🙂"]
    expected = GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))(texts)["input_ids"]
    assert tokenizer.kind == "gpt2"
    assert tokenizer.encode_batch(texts) == expected
    assert [tokenizer.decode(ids, skip_special=False) for ids in expected] == texts


PROMPTS = [[5, 17, 3, 88, 41, 9, 60], [12, 7], [33, 34, 35, 36]]


def test_greedy_generation_matches_transformers_with_left_padding(hf_lm, saved):
    model, _, _ = load_pretrained(saved(hf_lm))
    free = generate(model, PROMPTS, GenerationConfig(max_new_tokens=20))
    eos = next(t for i, t in enumerate(free[0]) if i >= 5 and t not in free[0][:i])  # new in row 0 at step >= 5
    ours = generate(model, PROMPTS, GenerationConfig(max_new_tokens=20), eos_id=eos)
    assert ours == hf_continuations(hf_lm, PROMPTS, eos)[0]
    assert 5 <= len(ours[0]) < 20 and len(set(ours[0])) > 1  # EOS ended row 0 early, after varied tokens


def test_beam_search_matches_transformers_with_left_padding(hf_lm, saved):
    model, _, _ = load_pretrained(saved(hf_lm))
    # The n-gram ban keeps a random model from repeating one token, so every step's choice counts.
    config = dataclasses.replace(huggingface_config(4, 20, num_return_sequences=4), no_repeat_ngram=2)
    found = beam_search(model, PROMPTS, config, eos_id=4)
    expected, scores = hf_continuations(hf_lm, PROMPTS, 4, num_beams=4, num_return_sequences=4,
                                        no_repeat_ngram_size=2)
    assert [h.tokens for row in found for h in row] == expected
    torch.testing.assert_close(torch.tensor([h.score for row in found for h in row]), scores, atol=1e-5, rtol=1e-5)
    assert min(len(h.tokens) for row in found for h in row) < 20  # some hypothesis ended with EOS

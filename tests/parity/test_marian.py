"""Marian: tiny random `transformers` MarianMTModels through `load_pretrained`, against `transformers`.

Teacher-forced logits on padded sources and targets (shared and separate vocabularies), the
position tables of old checkpoints, export back to `transformers`, and greedy decoding and beam
search against `generate` under the same settings.
"""

import dataclasses

import pytest
import torch
from safetensors.torch import load_file
from transformers import MarianConfig, MarianMTModel

from attn.artifacts.pretrained import load_pretrained
from attn.core.config import Tying
from attn.decoding import GenerationConfig, generate_seq2seq
from attn.decoding.beam_search import beam_search_seq2seq, huggingface_config
from attn.core.errors import CheckpointError
from attn.core.presets import preset

PAD, EOS = 96, 0
HF_CONFIG = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 activation_function="swish", scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS,
                 decoder_start_token_id=PAD, forced_eos_token_id=EOS)


@pytest.fixture
def hf_mt(randomised):
    return randomised(MarianMTModel(MarianConfig(**HF_CONFIG)), seed=7)  # greedy rows end at EOS and at the limit


def teacher_forced(hf, model, tokens, source_vocab=97):
    """Our and HF's logits at the real target positions of a padded batch."""
    src, tgt = tokens(3, 9, high=source_vocab - 1), tokens(3, 7, high=PAD, seed=1)
    src_mask, tgt_mask = torch.ones(3, 9, dtype=torch.bool), torch.ones(3, 7, dtype=torch.bool)
    src_mask[0, 5:] = False
    tgt_mask[2, 4:] = False
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt,
                      decoder_attention_mask=tgt_mask.long()).logits
        ours = model(src, tgt, src_mask, tgt_mask)
    return ours[tgt_mask], expected[tgt_mask]


def test_config_is_the_marian_preset_at_tiny_size(hf_mt, saved):
    _, tokenizer, info = load_pretrained(saved(hf_mt))
    expected = preset("marian-base").replace(
        d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, vocab_size=97, max_positions=64
    )
    assert (info.family, info.config, tokenizer) == ("marian", expected, None)
    assert (info.ids.decoder_start, info.ids.pad, info.ids.eos) == (PAD, PAD, EOS)


def test_logits_match_transformers_on_padded_sources_and_targets(hf_mt, saved, tokens):
    model, _, _ = load_pretrained(saved(hf_mt))
    ours, expected = teacher_forced(hf_mt, model, tokens)
    assert expected.abs().mean() > 0.05  # far above the tolerance, so a misplaced weight shows
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_separate_vocabularies_load_untied_embeddings(randomised, saved, tokens, assert_exports_identically):
    config = MarianConfig(**{**HF_CONFIG, "vocab_size": 101}, share_encoder_decoder_embeddings=False,
                          decoder_vocab_size=97)
    hf = randomised(MarianMTModel(config))
    model, _, info = load_pretrained(saved(hf))
    assert (info.config.tying, info.config.src_vocab_size, info.config.vocab_size) == (Tying.DECODER, 101, 97)
    torch.testing.assert_close(*teacher_forced(hf, model, tokens, source_vocab=101), atol=1e-5, rtol=0)
    assert_exports_identically(model, info, hf, MarianMTModel)


def old_style_checkpoint(folder, reference, shift):
    """Rewrites a saved model as older `transformers` did: .bin with position tables and tied copies."""
    state = load_file(folder / "model.safetensors")
    full = reference.state_dict()
    for key in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        state[key] = full[key].clone()
    state["model.decoder.embed_positions.weight"][3, 5] += shift
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        state[key] = state["model.shared.weight"].clone()
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")


def test_old_checkpoint_position_tables_are_verified(hf_mt, saved, tokens):
    good, bad = saved(hf_mt, "good"), saved(hf_mt, "bad")
    old_style_checkpoint(good, hf_mt, shift=0.0)
    old_style_checkpoint(bad, hf_mt, shift=1e-3)
    model, _, _ = load_pretrained(good)
    torch.testing.assert_close(*teacher_forced(hf_mt, model, tokens), atol=1e-5, rtol=0)
    with pytest.raises(CheckpointError, match=r"'model\.decoder\.embed_positions\.weight' differs"):
        load_pretrained(bad)


def test_export_reloads_in_transformers_with_identical_tensors(hf_mt, saved, assert_exports_identically):
    model, _, info = load_pretrained(saved(hf_mt))
    folder = assert_exports_identically(model, info, hf_mt, MarianMTModel)
    reloaded = MarianMTModel.from_pretrained(folder)
    assert (reloaded.config.decoder_start_token_id, reloaded.config.pad_token_id) == (PAD, PAD)


SOURCES = [[5, 17, 3, 88, 41, 9, 60, EOS], [12, 7, EOS], [33, 34, 35, 36, 37, EOS]]


def hf_generate(hf, **settings):
    """HF `generate` on the right-padded SOURCES: each returned row's new tokens up to EOS, and its scores."""
    width = max(map(len, SOURCES))
    ids = torch.tensor([s + [PAD] * (width - len(s)) for s in SOURCES])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in SOURCES])
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                          no_repeat_ngram_size=2, output_scores=True, return_dict_in_generate=True, **settings)
    rows = [row[1:].tolist() for row in out.sequences]  # drop the start token
    return [row[: row.index(EOS)] if EOS in row else row for row in rows], getattr(out, "sequences_scores", None)


# The n-gram ban (both sides) keeps a random model from repeating one token, so every step's choice counts.
def test_greedy_decoding_matches_transformers_generate(hf_mt, saved):
    model, _, info = load_pretrained(saved(hf_mt))
    config = GenerationConfig(max_new_tokens=20, force_eos=True, no_repeat_ngram=2)
    ours = generate_seq2seq(model, SOURCES, info.ids.decoder_start, info.ids.eos, info.ids.pad, config)
    assert ours == hf_generate(hf_mt, num_beams=1)[0]
    assert min(map(len, ours)) < 19 and len(set(map(len, ours))) > 1  # rows stopped at EOS at different steps


@pytest.mark.parametrize("length_penalty, early_stopping", [(1.0, False), (0.6, True), (2.0, "never"), (0.0, False)])
def test_beam_search_matches_transformers_generate(hf_mt, saved, length_penalty, early_stopping):
    model, _, info = load_pretrained(saved(hf_mt))
    settings = dict(num_beams=4, length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=4)
    config = dataclasses.replace(huggingface_config(max_new_tokens=20, forced_eos=True, **settings), no_repeat_ngram=2)
    found = beam_search_seq2seq(model, SOURCES, info.ids.decoder_start, info.ids.eos, info.ids.pad, config)
    expected, scores = hf_generate(hf_mt, **settings)
    assert [h.tokens for row in found for h in row] == expected
    torch.testing.assert_close(torch.tensor([h.score for row in found for h in row]), scores, atol=1e-5, rtol=1e-5)

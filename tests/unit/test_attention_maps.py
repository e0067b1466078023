"""Captured attention maps: probabilities per row, zero on masked keys, and exactly the weights
that produced the layer's output."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attn.core.attention import Heads, MultiHead, merge_heads, shared_kv
from attn.core.config import Positional
from attn.decoding.attention_maps import (
    AttentionTrail,
    attention_maps,
    attention_module,
    capture_attention,
)
from attn.core.errors import AttnError
from attn.models import build_model
from attn.core.presets import preset


def _model(name: str, **fields):
    torch.manual_seed(0)
    return build_model(preset(name).replace(dropout=0.0, **fields)).eval()


def _assert_reproduces_output(module, capture):
    recomputed = module.out(merge_heads(capture.weights @ capture.values))
    assert_close(recomputed, capture.output, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positional", [Positional.LEARNED, Positional.ROTARY, Positional.RELATIVE])
def test_decoder_self_attention_is_causal_and_reproduces_the_layer(positional):
    model = _model("gpt2-tiny", positional=positional)
    tokens = torch.randint(0, 97, (2, 9))
    module = attention_module(model, "decoder", 1)
    with torch.no_grad():
        capture = capture_attention(module, lambda: model(tokens))
    _assert_reproduces_output(module, capture)
    weights = attention_maps(model, tokens[0].tolist(), layer=1, kind="decoder")
    assert weights.shape == (4, 9, 9)
    assert_close(weights, capture.weights[0])
    assert_close(weights.sum(-1), torch.ones(4, 9))
    assert torch.all(weights.triu(1) == 0)  # future keys are masked


def test_cross_attention_gives_padding_zero_weight():
    model = _model("paper-base-tiny")
    src = torch.randint(1, 97, (2, 6))
    src_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    tgt = torch.randint(0, 97, (2, 5))
    module = attention_module(model, "cross", 0)
    with torch.no_grad():
        capture = capture_attention(module, lambda: model(src, tgt, src_mask))
    _assert_reproduces_output(module, capture)
    assert torch.all(capture.weights[1, :, :, 4:] == 0)
    assert_close(capture.weights.sum(-1), torch.ones(2, 4, 5))
    single = attention_maps(model, src[0].tolist(), layer=0, kind="cross", target=tgt[0].tolist())
    assert_close(single, capture.weights[0], atol=1e-5, rtol=0)


def test_encoder_self_attention_of_an_encoder_only_model():
    model = _model("bert-base-tiny")
    tokens = torch.randint(0, 97, (2, 7))
    mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4])
    module = attention_module(model, "encoder", 0)
    with torch.no_grad():
        capture = capture_attention(module, lambda: model(tokens, mask))
    _assert_reproduces_output(module, capture)
    assert torch.all(capture.weights[1, :, :, 3:] == 0)
    assert attention_maps(model, tokens[0].tolist(), layer=0, kind="encoder").shape == (4, 7, 7)


def test_forward_is_unchanged_and_no_capture_is_left_behind():
    model = _model("paper-base-tiny")
    src, tgt = torch.randint(1, 97, (1, 5)), torch.randint(0, 97, (1, 4))
    with torch.no_grad():
        before = model(src, tgt)
        attention_maps(model, src[0].tolist(), layer=1, kind="decoder", target=tgt[0].tolist())
        after = model(src, tgt)
    assert_close(after, before, atol=0, rtol=0)
    assert all(m._captures is None for m in model.modules() if isinstance(m, MultiHead))


def test_bad_requests_say_what_exists():
    decoder, seq2seq = _model("gpt2-tiny"), _model("paper-base-tiny")
    with pytest.raises(AttnError, match="no 'cross' attention; choose one of decoder"):
        attention_maps(decoder, [1, 2], layer=0, kind="cross")
    with pytest.raises(AttnError, match=r"layers 0\.\.1"):
        attention_maps(decoder, [1, 2], layer=2, kind="decoder")
    with pytest.raises(AttnError, match="pass target="):
        attention_maps(seq2seq, [1, 2], layer=0, kind="cross")


def test_capture_of_the_classifier_s_last_layer_is_the_forward_map():
    torch.manual_seed(0)
    model = build_model(preset("bert-base-tiny").replace(num_labels=3)).eval()
    tokens = torch.randint(1, 97, (2, 8))
    tokens[1, 5:] = 0
    module = attention_module(model, "self", -1)
    with torch.no_grad():
        classified = capture_attention(module, lambda: model.classify(tokens, tokens != 0))
        whole = capture_attention(module, lambda: model(tokens, tokens != 0))
    _assert_reproduces_output(module, classified)
    torch.testing.assert_close(classified.weights, whole.weights, atol=0, rtol=0)


def test_the_capture_records_the_cached_decoding_step_too():
    model = _model("gpt2-tiny")
    tokens = torch.randint(0, 97, (1, 6))
    module = attention_module(model, "self", 0)
    with torch.no_grad():
        whole = capture_attention(module, lambda: model(tokens))
        cache = model.new_cache(1, 6)
        model.decode_step(tokens[:, :5], cache)
        step = capture_attention(module, lambda: model.decode_step(tokens[:, 5:], cache))
    assert step.weights.shape == (1, 4, 1, 6)
    assert_close(step.weights[0, :, 0], whole.weights[0, :, 5], atol=1e-5, rtol=0)


def test_each_query_head_s_group_is_the_key_value_head_it_reads():
    layout = Heads(heads=9, kv_heads=3, head_dim=4)
    assert layout.groups == (0, 0, 0, 1, 1, 1, 2, 2, 2)
    kv = torch.arange(3.0).view(1, 3, 1, 1)  # key/value head g holds g
    assert shared_kv(kv, 9).flatten().tolist() == list(map(float, layout.groups))
    assert Heads(4, 4, 8).groups == (0, 1, 2, 3) and Heads(4, 1, 8).groups == (0, 0, 0, 0)


GQA = {"heads": 6, "kv_heads": 2, "d_model": 48, "positional": Positional.ROTARY, "norm": "rmsnorm",
       "gated_ffn": True, "activation": "silu"}


@pytest.mark.parametrize("fields", [{}, GQA, {**GQA, "sliding_window": 4}], ids=["gpt2", "gqa", "gqa-window"])
def test_a_trail_gives_each_new_token_s_row_of_the_whole_sequence_s_map(fields):
    model = _model("gpt2-tiny", **fields)
    layout = attention_module(model, "self", 0).layout
    assert layout.groups == ((0, 0, 0, 1, 1, 1) if fields else (0, 1, 2, 3))
    sequence = torch.randint(0, 97, (12,)).tolist()
    trail = AttentionTrail(model, sequence[:7], layer=-1, room=5)
    rows = [trail.weights]
    for token in sequence[7:]:
        trail.push(token)
        rows.append(trail.weights)
    whole = attention_maps(model, sequence, layer=-1, kind="self")  # (h, 12, 12)
    for n, row in enumerate(rows, start=7):
        assert row.shape == (whole.size(0), n)
        assert_close(row, whole[:, n - 1, :n], atol=1e-5, rtol=0)
    with pytest.raises(AttnError):  # room for 5 tokens only
        trail.push(1)

"""One shared suite over every preset's tiny variant with every positional scheme it allows: build,
forward, cached decoding against the full forward pass, save/load, gradient flow, one training step."""

import pytest
import torch
from safetensors.torch import load_model, save_model

from attn.core.config import Architecture, Positional
from attn.models import build_model
from attn.core.presets import preset, preset_names

TINY = [name for name in preset_names() if name.endswith("-tiny")]
# Sliding windows take rotary or absolute positions, not T5's relative bias (ModelConfig refuses it).
CASES = [(name, positional) for name in TINY for positional in Positional
         if not (preset(name).sliding_window and positional == Positional.RELATIVE)]
IDS = [f"{name}-{positional.value}" for name, positional in CASES]
cases = pytest.mark.parametrize(("name", "positional"), CASES, ids=IDS)


def tiny(name, positional, **fields):
    return preset(name).replace(positional=positional, **fields)


def inputs(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, cfg.vocab_size, (2, 9), generator=g)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, 6:] = False
    src = torch.randint(1, cfg.src_vocab_size, (2, 7), generator=g)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[0, 5:] = False
    return tokens, mask, src, src_mask


def outputs(model, cfg, seed=0):
    tokens, mask, src, src_mask = inputs(cfg, seed)
    if cfg.architecture == Architecture.ENCODER_DECODER:
        return [model(src, tokens, src_mask, mask)]
    if cfg.architecture == Architecture.DECODER_ONLY:
        return [model(tokens, mask)]
    heads = [model(tokens, mask), model.classify(tokens, mask), model.sentence_embedding(tokens, mask)]
    return heads + ([model.mlm_logits(tokens, mask)] if cfg.mlm_head else [])


def test_every_full_preset_has_a_tiny_variant():
    full = [name for name in preset_names() if not name.endswith("-tiny")]
    assert sorted(f"{name}-tiny" for name in full) == sorted(TINY)


@cases
def test_forward_gives_finite_outputs_of_the_right_shape(name, positional):
    cfg = tiny(name, positional)
    model = build_model(cfg).eval()
    with torch.no_grad():
        first = outputs(model, cfg)[0]
    expected_width = cfg.d_model if cfg.architecture == Architecture.ENCODER_ONLY else cfg.vocab_size
    assert first.shape == (2, 9, expected_width)
    assert torch.isfinite(first).all()


DECODERS = [(name, positional) for name, positional in CASES if preset(name).architecture != Architecture.ENCODER_ONLY]


@pytest.mark.parametrize(("name", "positional"), DECODERS, ids=[f"{n}-{p.value}" for n, p in DECODERS])
def test_cached_decoding_equals_the_full_forward_pass(name, positional):
    """A prefill of 4 tokens, then one token at a time: the logits of the uncached forward pass (run with
    autograd on, so its output projection is `F.linear` on the weight, not the copy decoding uses)."""
    cfg = tiny(name, positional, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    tokens, _, src, src_mask = inputs(cfg)
    seq2seq = cfg.architecture == Architecture.ENCODER_DECODER
    full = (model(src, tokens, src_mask) if seq2seq else model(tokens)).detach()
    with torch.no_grad():
        if seq2seq:
            cache = model.new_cache(model.encode(src, src_mask), src_mask, tokens.size(1))
        else:
            cache = model.new_cache(tokens.size(0), tokens.size(1))
        pieces = [model.decode_step(tokens[:, :4], cache)]
        pieces += [model.decode_step(tokens[:, t : t + 1], cache) for t in range(4, tokens.size(1))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


@cases
def test_save_load_round_trip_gives_identical_outputs(name, positional, tmp_path):
    cfg = tiny(name, positional)
    torch.manual_seed(1)
    model = build_model(cfg).eval()
    save_model(model, tmp_path / "model.safetensors")
    torch.manual_seed(2)
    reloaded = build_model(cfg).eval()
    load_model(reloaded, tmp_path / "model.safetensors")
    state = build_model(cfg)
    state.load_state_dict(model.state_dict())
    state.eval()
    with torch.no_grad():
        for a, b, c in zip(outputs(model, cfg), outputs(reloaded, cfg), outputs(state, cfg)):
            assert torch.equal(a, b) and torch.equal(a, c)


def training_loss(model, cfg):
    tokens, mask, src, src_mask = inputs(cfg, seed=3)
    ce = torch.nn.functional.cross_entropy
    if cfg.architecture == Architecture.ENCODER_DECODER:
        logits = model(src, tokens[:, :-1], src_mask, mask[:, :-1])
        return ce(logits.flatten(0, 1), tokens[:, 1:].flatten())
    if cfg.architecture == Architecture.DECODER_ONLY:
        return ce(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss = ce(model.classify(tokens, mask), torch.tensor([0, 1]))
    if cfg.mlm_head:
        loss = loss + ce(model.mlm_logits(tokens, mask).flatten(0, 1), tokens.flatten())
    return loss


@cases
def test_every_parameter_receives_a_nonzero_gradient(name, positional):
    cfg = tiny(name, positional, dropout=0.1)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    training_loss(model, cfg).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{pname} got no gradient"


@cases
def test_one_adam_step_lowers_the_loss_on_its_batch(name, positional):
    cfg = tiny(name, positional, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = training_loss(model, cfg)
    before.backward()
    opt.step()
    with torch.no_grad():
        assert training_loss(model, cfg) < before

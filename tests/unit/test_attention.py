"""Equation (1) against an explicit loop, the fast path against the reference, and the mask rules."""

import math

import pytest
import torch
import torch.nn.functional as F

from attn.core.attention import (
    Heads,
    SelfAttention,
    attention_weights,
    fast_attention,
    scaled_dot_product_attention,
)
from attn.core.config import Activation
from attn.core.layers import FeedForward
from attn.core.masks import CAUSAL, causal_mask, key_mask, padding_mask
from attn.models import build_model
from attn.core.presets import preset


def loop_attention(q, k, v, mask):
    """softmax(q.k / sqrt(d_k)) v written as loops over batch, head, query and key."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    out = torch.zeros(b, h, tq, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(tq):
                scores = []
                for j in range(tk):
                    allowed = bool(mask[bi if mask.shape[0] > 1 else 0, 0, i if mask.shape[2] > 1 else 0, j])
                    s = sum(float(q[bi, hi, i, c]) * float(k[bi, hi, j, c]) for c in range(d)) / math.sqrt(d)
                    scores.append(s if allowed else -math.inf)
                top = max(scores)
                if top == -math.inf:
                    continue  # a fully masked row attends nothing: zero output
                exps = [math.exp(s - top) for s in scores]
                total = sum(exps)
                for j in range(tk):
                    out[bi, hi, i] += exps[j] / total * v[bi, hi, j].double()
    return out


def random_qkv(b=2, h=3, tq=5, tk=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, tq, d, generator=g), torch.randn(b, h, tk, d, generator=g),
            torch.randn(b, h, tk, d, generator=g))


def test_reference_equals_loop_with_padding_mask():
    q, k, v = random_qkv()
    tokens = torch.tensor([[5, 6, 7, 8, 0, 0], [1, 2, 3, 4, 5, 6]])
    mask = key_mask(padding_mask(tokens, 0))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask).double(), loop_attention(q, k, v, mask),
                               atol=1e-5, rtol=0)


def test_reference_equals_loop_with_causal_mask():
    q, k, v = random_qkv(tq=6, tk=6)
    mask = causal_mask(6)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask).double(), loop_attention(q, k, v, mask),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["padding", "causal", "both", "none"])
def test_fast_path_equals_reference(kind):
    q, k, v = random_qkv(b=3, h=4, tq=7, tk=7, d=8, seed=1)
    tokens = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    pad = key_mask(padding_mask(tokens, 0))
    mask = {"padding": pad, "causal": causal_mask(7), "both": pad & causal_mask(7), "none": None}[kind]
    torch.testing.assert_close(fast_attention(q, k, v, mask), scaled_dot_product_attention(q, k, v, mask),
                               atol=1e-5, rtol=0)


def test_fast_path_equals_reference_with_bias():
    q, k, v = random_qkv(tq=5, tk=5, seed=2)
    bias = torch.randn(1, 3, 5, 5)
    mask = causal_mask(5)
    torch.testing.assert_close(fast_attention(q, k, v, mask, bias), scaled_dot_product_attention(q, k, v, mask, bias),
                               atol=1e-5, rtol=0)


def test_under_bf16_autocast_on_a_cpu_the_fused_kernel_runs_in_fp32():
    """The output and the gradients are the fp32 reference's, rounded once to bf16 (PyTorch's bf16 CPU kernel
    rounds inside: 82 % of its outputs match that rounding here)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 33, 64, generator=g).bfloat16() for _ in range(3))
    q = q * 3  # peaked weights: rounding them to bf16 would show
    mask, grad_out = causal_mask(33), torch.randn(2, 4, 33, 64, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fast_attention(*leaves, mask)
    out.backward(grad_out.bfloat16())
    wide = [t.float().requires_grad_() for t in (q, k, v)]
    reference = scaled_dot_product_attention(*wide, mask)
    reference.backward(grad_out.bfloat16().float())
    assert out.dtype == torch.bfloat16
    for ours, theirs in [(out, reference), *((a.grad, b.grad) for a, b in zip(leaves, wide, strict=True))]:
        assert (ours == theirs.bfloat16()).float().mean() > 0.97


def test_masked_keys_get_exactly_zero_weight():
    q, k, _ = random_qkv()
    tokens = torch.tensor([[5, 6, 0, 0, 0, 0], [1, 2, 3, 4, 5, 0]])
    weights = attention_weights(q, k, key_mask(padding_mask(tokens, 0)))
    assert torch.equal(weights[0, :, :, 2:], torch.zeros_like(weights[0, :, :, 2:]))
    assert torch.equal(weights[1, :, :, 5], torch.zeros_like(weights[1, :, :, 5]))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


def test_fully_masked_row_gives_zero_weights_and_output_not_nan():
    q, k, v = random_qkv(b=1, tq=3, tk=3)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])[None, None]
    weights = attention_weights(q, k, mask)
    assert torch.equal(weights[0, :, 1], torch.zeros(3, 3))
    for attend in (scaled_dot_product_attention, fast_attention):
        out = attend(q, k, v, mask)
        assert not out.isnan().any()
        assert torch.equal(out[0, :, 1], torch.zeros(3, 4))


def test_scaling_by_sqrt_dk():
    # With one key pair the weight of key 0 is sigmoid((s0 - s1) / sqrt(d_k)).
    q = torch.tensor([[[[1.0, 1.0, 1.0, 1.0]]]])
    k = torch.tensor([[[[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]])
    weights = attention_weights(q, k)
    assert weights[0, 0, 0, 0].item() == pytest.approx(1 / (1 + math.exp(-2 / 2)), abs=1e-5)


def test_causal_sentinel_equals_the_materialised_causal_mask():

    q, k, v = random_qkv(b=2, h=3, tq=6, tk=6, d=8, seed=3)
    expected = scaled_dot_product_attention(q, k, v, causal_mask(6))
    torch.testing.assert_close(fast_attention(q, k, v, CAUSAL), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, CAUSAL), expected, atol=0, rtol=0)
    bias = torch.randn(1, 3, 6, 6)
    torch.testing.assert_close(fast_attention(q, k, v, CAUSAL, bias),
                               scaled_dot_product_attention(q, k, v, causal_mask(6), bias), atol=1e-5, rtol=0)


# -- fully masked query rows: exactly zero, whatever the SDPA kernel returns for them -----------


def nan_kernel(real):
    """SDPA as a kernel that leaves the softmax of only -inf (NaN) in fully masked rows would give it."""

    def attend(q, k, v, attn_mask=None, **options):
        out = real(q, k, v, attn_mask=attn_mask, **options)
        if attn_mask is None:
            return out
        allowed = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
        return out.masked_fill(~allowed.any(-1, keepdim=True), float("nan"))

    return attend


def left_padded_self_attention_mask():
    tokens = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 7, 8, 9]])  # row 0: two pads on the left
    return key_mask(padding_mask(tokens, 0)) & causal_mask(5), (0, [0, 1])


MASK_KINDS = {
    # (q length, k length, mask, (batch row, fully masked query rows))
    "padding": lambda: (4, 4, key_mask(padding_mask(torch.tensor([[3, 4, 0, 0], [0, 0, 0, 0]]), 0)), (1, [0, 1, 2, 3])),
    "causal+padding": lambda: (5, 5, *left_padded_self_attention_mask()),
    "cross-attention": lambda: (3, 4, key_mask(padding_mask(torch.tensor([[3, 4, 5, 0], [0, 0, 0, 0]]), 0)),
                                (1, [0, 1, 2])),
}


@pytest.mark.parametrize("with_bias", [False, True], ids=["mask", "mask+bias"])
@pytest.mark.parametrize("kind", list(MASK_KINDS))
@pytest.mark.parametrize("attend", [fast_attention, scaled_dot_product_attention], ids=["fast", "reference"])
def test_fully_masked_rows_are_exactly_zero_whatever_the_kernel(monkeypatch, attend, kind, with_bias):
    tq, tk, mask, (row, empty) = MASK_KINDS[kind]()
    q, k, v = random_qkv(b=2, h=3, tq=tq, tk=tk, d=4, seed=3)
    bias = torch.randn(1, 3, tq, tk, generator=torch.Generator().manual_seed(4)) if with_bias else None
    expected = scaled_dot_product_attention(q, k, v, mask, bias)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        nan_kernel(torch.nn.functional.scaled_dot_product_attention))
    out = attend(q, k, v, mask, bias)
    assert not out.isnan().any()
    assert torch.equal(out[row, :, empty], torch.zeros(3, len(empty), 4))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    # The loop leaves fully masked rows at 0 too: the zeros are the definition, not a kernel's choice.
    if bias is None:
        torch.testing.assert_close(out.double(), loop_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_left_padded_prefill_keeps_nan_out_of_the_cache_whatever_the_kernel(monkeypatch):
    """The pad rows of a left-padded prompt attend nothing; a NaN there would become the keys and
    values cached for the pad positions, and 0 * NaN would then reach every real row."""
    from attn.models import build_model
    from attn.core.presets import preset

    torch.manual_seed(0)
    model = build_model(preset("char-gpt-tiny").replace(vocab_size=20, dropout=0.0)).eval()
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        nan_kernel(torch.nn.functional.scaled_dot_product_attention))
    prompts = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 7, 8, 9]])
    with torch.inference_mode():
        cache = model.new_cache(2, 8)
        logits = model.decode_step(prompts, cache, prompts > 0)
        step = model.decode_step(torch.tensor([[4], [4]]), cache)
        alone = model.new_cache(1, 8)
        expected = model.decode_step(prompts[:1, 2:], alone)[:, -1]
        expected_step = model.decode_step(torch.tensor([[4]]), alone)
    assert not cache.keys.isnan().any() and not cache.values.isnan().any()
    assert not logits[:, 2:].isnan().any() and not step.isnan().any()
    torch.testing.assert_close(logits[0, -1], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step[0], expected_step[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padding"])
def test_masked_training_step_equals_the_reference_attention(padded):
    """The fast path leaves out an all-True mask and the zeroing of rows that are not empty: the logits and
    gradients stay those of the written-out attention with its masks materialised."""
    config = preset("paper-base").tiny().replace(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, config.vocab_size, (3, 7), generator=g)
    tgt = torch.randint(4, config.vocab_size, (3, 6), generator=g)
    src_mask, tgt_mask = torch.ones_like(src, dtype=torch.bool), torch.ones_like(tgt, dtype=torch.bool)
    if padded:
        src_mask[1, 5:], tgt_mask[2, 4:] = False, False
    results = []
    for attention in ("fast", "reference"):
        torch.manual_seed(1)
        model = build_model(config, attention).train()
        logits = model(src, tgt, src_mask, tgt_mask)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
        results.append((logits.detach(), [p.grad for p in model.parameters()]))
    (fast, fast_grads), (reference, reference_grads) = results
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)
    for got, expected in zip(fast_grads, reference_grads):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_attention_dropout_drops_the_weights_as_f_dropout_does():
    q, k, v = random_qkv(tq=7, tk=7, seed=3)
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    torch.manual_seed(7)
    expected = F.dropout(attention_weights(q, k, mask), 0.3) @ v
    for attend in (fast_attention, scaled_dot_product_attention):
        torch.manual_seed(7)
        torch.testing.assert_close(attend(q, k, v, mask, dropout=0.3), expected, atol=1e-5, rtol=1e-5)


def test_dropout_is_torch_s_in_training_and_off_in_eval_mode():
    torch.manual_seed(0)
    ffn = FeedForward(8, 16, Activation.RELU, bias=True, dropout=0.4)
    x = torch.randn(2, 5, 8)
    torch.manual_seed(3)
    dropped = ffn(x)
    torch.manual_seed(3)
    torch.testing.assert_close(dropped, ffn.w2(F.dropout(F.relu(ffn.w1(x)), 0.4)), atol=1e-5, rtol=1e-5)
    assert torch.equal(ffn.eval()(x), ffn.w2(F.relu(ffn.w1(x))))
    layer = SelfAttention(8, Heads(2, 2, 4), bias=(True, True), dropout=0.5, attend=fast_attention)
    assert not torch.equal(layer(x, None, lambda t: t), layer(x, None, lambda t: t))
    layer.eval()
    assert torch.equal(layer(x, None, lambda t: t), layer(x, None, lambda t: t))

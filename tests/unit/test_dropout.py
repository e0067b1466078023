"""The CPU dropout mask by numbers: its keep rate lane by lane, the exact scale, the gradient, its seeds."""

import threading

import pytest
import torch
import torch.nn.functional as F

from attn.attention import attention_weights, fast_attention, scaled_dot_product_attention
from attn.dropout import LEVELS, Dropout, drop_levels, dropout, keep_mask, thread_generator

N = 1 << 20


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_each_lane_of_a_draw_keeps_at_the_rate_asked(p):
    torch.manual_seed(0)
    keep = keep_mask((N // 4, 4), p).double()  # column j: lane j of every 64-bit draw
    rate = 1 - drop_levels(p) / LEVELS
    sigma = (rate * (1 - rate) / (N // 4)) ** 0.5
    assert torch.all((keep.mean(dim=0) - rate).abs() < 5 * sigma), keep.mean(dim=0)
    assert abs(keep.mean().item() - (1 - p)) < 5 * sigma


def test_the_probability_used_is_p_to_a_sixteenth_bit():
    for p in [0.0, 0.05, 0.1, 1 / 3, 0.5, 0.999, 1.0]:
        assert abs(drop_levels(p) / LEVELS - p) <= 0.5 / LEVELS


def test_kept_elements_are_scaled_by_the_inverse_keep_rate_and_the_rest_are_zero():
    torch.manual_seed(1)
    x = torch.randn(300, 301)
    out = dropout(x, 0.1)
    kept = out != 0
    scale = LEVELS / (LEVELS - drop_levels(0.1))
    torch.testing.assert_close(out[kept], x[kept] * scale, rtol=0, atol=0)
    assert 0.88 < kept.double().mean().item() < 0.92


def test_the_expectation_is_kept():
    torch.manual_seed(2)
    means = torch.stack([dropout(torch.ones(N), 0.25).mean() for _ in range(4)])
    assert abs(means.mean().item() - 1.0) < 3e-3


def test_the_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(64, 50, requires_grad=True)
    out = dropout(x, 0.4)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, out.detach() / x.detach(), rtol=1e-6, atol=0)


def test_same_seed_same_mask_and_a_new_mask_each_call():
    torch.manual_seed(4)
    first, second = keep_mask((1000,), 0.5), keep_mask((1000,), 0.5)
    torch.manual_seed(4)
    assert torch.equal(keep_mask((1000,), 0.5), first)
    assert not torch.equal(first, second)


def test_a_thread_generator_draws_alone_and_leaves_the_default_stream_untouched():
    torch.manual_seed(5)
    state = torch.get_rng_state()
    masks = {}

    def work(seed: int) -> None:
        with thread_generator(torch.Generator().manual_seed(seed)):
            masks[seed] = keep_mask((4096,), 0.3)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (10, 11)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.equal(torch.get_rng_state(), state)
    for seed in (10, 11):
        assert torch.equal(masks[seed], keep_mask((4096,), 0.3, torch.Generator().manual_seed(seed)))
    assert not torch.equal(masks[10], masks[11])


def test_off_in_eval_mode_at_zero_and_all_dropped_at_one():
    x = torch.randn(10, 10)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    module = Dropout(0.5).eval()
    assert module(x) is x
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        Dropout(1.5)


def test_a_module_in_training_mode_drops_like_nn_dropout_in_rate():
    torch.manual_seed(6)
    ours = Dropout(0.2).train()(torch.ones(N))
    theirs = F.dropout(torch.ones(N), 0.2)
    assert abs((ours == 0).double().mean().item() - (theirs == 0).double().mean().item()) < 3e-3


def test_cpu_attention_drops_its_weights_with_this_mask():
    q, k, v = (torch.randn(2, 3, 7, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    torch.manual_seed(7)
    keep = keep_mask((2, 3, 7, 7), 0.3)
    scale = LEVELS / (LEVELS - drop_levels(0.3))
    expected = (attention_weights(q, k, mask) * keep * scale) @ v
    for attend in (fast_attention, scaled_dot_product_attention):
        torch.manual_seed(7)
        torch.testing.assert_close(attend(q, k, v, mask, dropout=0.3), expected, rtol=1e-5, atol=1e-5)

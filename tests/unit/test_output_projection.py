"""The output projection: one module for `forward` and cached decoding; its transposed copy for few rows
without autograd follows every change of the weight; autograd always goes through the weight itself.

The reference for every logit is the forward pass with autograd on, which multiplies by the weight with
`F.linear`; cached decoding runs without autograd: a prefill of several rows multiplies with the weight on
the left, a one-row step by the transposed copy.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attn.config import preset
from attn.layers import DECODE_ROWS, OutputProjection
from attn.models import Decoder, build_model

TOKENS = torch.tensor([[5, 6, 7, 8, 9]])


def _lm(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return build_model(preset("gpt2-tiny").replace(dropout=0.0, attention_dropout=0.0)).eval()


def _decoded(model: Decoder) -> torch.Tensor:
    """Logits (1, 5, V) of TOKENS from a fresh cache without autograd: a prefill of 4 rows, then one row."""
    with torch.inference_mode():
        cache = model.new_cache(*TOKENS.shape)
        return torch.cat([model.decode_step(TOKENS[:, :4], cache), model.decode_step(TOKENS[:, 4:], cache)], 1)


def _reference(model: Decoder) -> torch.Tensor:
    with torch.enable_grad():
        return model(TOKENS).detach()


def _reference_projection(projection: OutputProjection, x: torch.Tensor) -> torch.Tensor:
    return x @ projection.weight.detach().t() + (0 if projection.bias is None else projection.bias.detach())


def _loss(model: Decoder) -> torch.Tensor:
    return model(TOKENS).logsumexp(-1).mean()


def _step(optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> Callable[[Decoder], None]:
    def change(model: Decoder) -> None:
        opt = optimizer(list(model.parameters()))
        _loss(model).backward()
        opt.step()
        opt.zero_grad()

    return change


def _through_the_embedding_only(model: Decoder) -> None:
    """The tied weight learns through the embedding alone; a fused step leaves its version as it was."""
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    model.embeddings.tokens(TOKENS).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()


def _decoding_between_backward_and_step(model: Decoder) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    _loss(model).backward()
    assert_close(_decoded(model), _reference(model), atol=1e-5, rtol=0)
    opt.step()
    opt.zero_grad()


def _load_other_weights(model: Decoder) -> None:
    model.load_state_dict(_lm(seed=1).state_dict())


def _in_place(model: Decoder) -> None:
    with torch.no_grad():
        model.lm_head.weight.mul_(2)


def _new_parameter(model: Decoder) -> None:
    model.lm_head.weight = nn.Parameter(torch.randn_like(model.lm_head.weight))


def _bfloat16_round_trip(model: Decoder) -> None:
    model.to(torch.bfloat16).to(torch.float32)


CHANGES = {
    "fused Adam step": _step(lambda p: torch.optim.Adam(p, lr=0.1, fused=True)),
    "foreach AdamW step": _step(lambda p: torch.optim.AdamW(p, lr=0.1, foreach=True)),
    "SGD step": _step(lambda p: torch.optim.SGD(p, lr=1.0, foreach=False)),
    "fused step through the tied embedding": _through_the_embedding_only,
    "decode between backward and fused step": _decoding_between_backward_and_step,
    "load_state_dict": _load_other_weights,
    "in-place change": _in_place,
    "new parameter": _new_parameter,
    "to bf16 and back": _bfloat16_round_trip,
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_decoding_uses_the_weight_as_it_is_after_a_change(change):
    model = _lm()
    before = _decoded(model)
    assert_close(before, _reference(model), atol=1e-5, rtol=0)
    change(model)
    after = _decoded(model)
    assert (after - before).abs().max() > 1e-3  # the change reached the logits
    assert_close(after, _reference(model), atol=1e-5, rtol=0)


def test_to_float64_decodes_in_float64():
    model = _lm().to(torch.float64)
    assert _decoded(model).dtype == torch.float64
    assert_close(_decoded(model), _reference(model), atol=1e-5, rtol=0)


def test_the_copy_is_made_once_per_model_and_kept_across_caches():
    model = _lm()
    _decoded(model)
    copy = model.lm_head._transposed.matrix
    assert copy.shape == (model.lm_head.in_features, model.lm_head.out_features) and copy.is_contiguous()
    _decoded(model)
    assert model.lm_head._transposed.matrix is copy
    x = torch.randn(1, model.lm_head.in_features)
    with torch.no_grad():  # the copy was made under inference mode; plain no-grad calls use it too
        assert_close(model.lm_head(x), _reference_projection(model.lm_head, x), atol=1e-5, rtol=0)
    assert model.lm_head._transposed.matrix is copy


def test_with_autograd_the_gradient_reaches_the_weight_and_no_copy_is_made():
    torch.manual_seed(0)
    projection = OutputProjection(4, 6, bias=True)
    x = torch.randn(3, 4, requires_grad=True)
    projection(x).sum().backward()
    assert_close(projection.weight.grad, x.detach().sum(0).expand(6, 4), atol=1e-6, rtol=0)  # d/dW of sum(xW^T)
    assert_close(projection.bias.grad, torch.full((6,), 3.0), atol=0, rtol=0)
    assert_close(x.grad, projection.weight.detach().sum(0).expand(3, 4), atol=1e-6, rtol=0)
    assert projection._transposed is None


@pytest.mark.parametrize("rows", [1, 2, DECODE_ROWS, DECODE_ROWS + 1])
def test_any_number_of_rows_gives_the_defined_logits(rows):
    torch.manual_seed(0)
    projection = OutputProjection(8, 50, bias=True)
    x = torch.randn(rows, 1, 8)
    expected = _reference_projection(projection, x)
    with torch.no_grad():
        assert_close(projection(x), expected, atol=1e-5, rtol=0)
    assert (projection._transposed is not None) == (rows == 1)  # the copy only for one row

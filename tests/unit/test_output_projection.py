"""The vocabulary projection: a decode step's few rows take the weight-on-the-left layout on the CPU, with
the numbers of `F.linear` in every case, and the parameters and state-dict keys of `nn.Linear`."""

import pytest
import torch
import torch.nn.functional as F

from attn.layers import DECODE_ROWS, OutputProjection
from attn.models import build_model
from attn.presets import preset


@pytest.mark.parametrize("shape", [(1, 1, 32), (4, 1, 32), (2, 3, 32), (DECODE_ROWS + 1, 32)])
@pytest.mark.parametrize("bias", [False, True])
def test_every_layout_gives_f_linear(shape, bias):
    torch.manual_seed(0)
    projection = OutputProjection(32, 97, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, projection.weight, projection.bias)
    with torch.no_grad():
        decoded = projection(x)
    assert decoded.shape == expected.shape and decoded.is_contiguous()
    torch.testing.assert_close(decoded, expected, atol=1e-5, rtol=1e-5)
    trained = projection(x)  # with autograd: F.linear itself, and the gradient reaches the weight
    trained.sum().backward()
    torch.testing.assert_close(trained, expected, atol=0, rtol=0)
    assert projection.weight.grad is not None


def test_the_weight_on_the_left_is_taken_for_a_few_rows_only(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "linear", lambda *args: calls.append(args[0].shape) or torch.zeros(1))
    projection = OutputProjection(8, 11, bias=False)
    with torch.no_grad():
        projection(torch.randn(3, 1, 8))  # a decode step of three rows
        projection(torch.randn(1, 8))  # one row
        projection(torch.randn(2, DECODE_ROWS, 8))  # a sequence
    assert calls == [torch.Size([1, 8]), torch.Size([2, DECODE_ROWS, 8])]


def test_a_tied_projection_shares_the_embedding_and_keeps_linear_state_dict_keys():
    model = build_model(preset("gpt2-tiny"))
    assert isinstance(model.lm_head, OutputProjection)
    assert model.lm_head.weight is model.embeddings.tokens.weight
    assert {k for k in model.state_dict() if k.startswith("lm_head")} <= {"lm_head.weight", "lm_head.bias"}

"""RMSNorm (Llama's x / rms(x) * w and Gemma's x / rms(x) * (1 + w), whole or per head) and the gated FFN
against their formulas written out element by element."""

import math

import pytest
import torch

from attn.core.config import Activation
from attn.core.layers import GatedFeedForward, RMSNorm


def rms_by_hand(x, weight, eps, offset):
    """y_i = x_i / sqrt(sum_j x_j^2 / n + eps) * (offset + w_i), one vector at a time."""
    out = torch.empty_like(x)
    for index in range(x.shape[0]):
        row = x[index].tolist()
        rms = math.sqrt(sum(v * v for v in row) / len(row) + eps)
        out[index] = torch.tensor([v / rms * (offset + w) for v, w in zip(row, weight.tolist())])
    return out


@pytest.mark.parametrize("offset", [0.0, 1.0])  # Llama, Gemma
def test_rms_norm_is_its_formula(offset):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(6, eps=1e-5, offset=offset)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6, generator=g))
    x = torch.randn(5, 6, generator=g) * 3
    torch.testing.assert_close(norm(x), rms_by_hand(x, norm.weight, 1e-5, offset), atol=1e-6, rtol=1e-6)


def test_gemma_norm_starts_as_the_identity_scale():
    """Gemma's weight is stored as w in (1 + w) and starts at 0: a fresh norm only divides by the rms."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    fresh = RMSNorm(8, eps=1e-6, offset=1.0)
    assert torch.equal(fresh.weight, torch.zeros(8))
    torch.testing.assert_close(fresh(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())


def test_rms_norm_over_groups_normalises_each_head_alone():
    """QK-norm per head: a (B, T, h * d) projection is normalised over each head's d features."""
    g = torch.Generator().manual_seed(2)
    norm = RMSNorm(4, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(4, generator=g))
    x = torch.randn(2, 3, 12, generator=g)  # three heads of 4
    heads = x.reshape(-1, 4)
    expected = rms_by_hand(heads, norm.weight.detach(), 1e-6, 0.0).reshape(2, 3, 12)
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("activation", [Activation.SILU, Activation.GELU_TANH])  # SwiGLU, GeGLU
def test_gated_ffn_is_its_formula(activation):
    """FFN(x) = W_2 (act(W_gate x + b_gate) * (W_up x + b_up)) + b_2, with w1 = [W_gate; W_up]."""
    g = torch.Generator().manual_seed(3)
    ffn = GatedFeedForward(4, 3, activation, bias=True, dropout=0.0)
    with torch.no_grad():
        for p in ffn.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    w1, b1 = ffn.w1.weight.detach(), ffn.w1.bias.detach()
    gate, up, gate_bias, up_bias = w1[:3], w1[3:], b1[:3], b1[3:]
    act = {Activation.SILU: lambda v: v / (1 + math.exp(-v)),
           Activation.GELU_TANH: lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))}
    x = torch.randn(2, 4, generator=g)
    expected = torch.empty(2, 4)
    for row in range(2):
        hidden = [act[activation](float(gate[j] @ x[row] + gate_bias[j])) * float(up[j] @ x[row] + up_bias[j])
                  for j in range(3)]
        expected[row] = ffn.w2.weight.detach() @ torch.tensor(hidden) + ffn.w2.bias.detach()
    torch.testing.assert_close(ffn(x), expected, atol=1e-5, rtol=1e-5)

"""The model's linear layer: F.linear's numbers whichever kernel runs, oneDNN for float32 CPU inference only,
and the parameters and state-dict keys of `nn.Linear`."""

import copy

import pytest
import torch
import torch.nn.functional as F

from attn.core import linear
from attn.decoding import GenerationConfig, generate
from attn.core.linear import Linear
from attn.models import build_model
from attn.core.presets import preset


@pytest.mark.parametrize("shape", [(1, 1, 32), (4, 1, 32), (2, 3, 32), (300, 32), (0, 32)])
@pytest.mark.parametrize("bias", [False, True])
def test_inference_gives_f_linear_and_training_is_f_linear(shape, bias):
    torch.manual_seed(0)
    layer = Linear(32, 97, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, layer.weight, layer.bias)
    with torch.no_grad():
        inferred = layer(x)
    assert inferred.shape == expected.shape
    torch.testing.assert_close(inferred, expected, atol=1e-5, rtol=1e-5)
    trained = layer(x)  # with autograd: F.linear itself, and the gradient reaches the weight
    trained.sum().backward()
    torch.testing.assert_close(trained, expected, atol=0, rtol=0)
    assert layer.weight.grad is not None


def test_a_strided_input_gives_f_linear():
    layer = Linear(16, 8)
    x = torch.randn(3, 5, 16)[:, -1:]  # the last position of each row: a decode step's view
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not linear.ONEDNN, reason="this PyTorch was built without oneDNN")
def test_onednn_serves_float32_cpu_inference_only(monkeypatch):
    calls = []
    original = linear.uses_onednn
    monkeypatch.setattr(linear, "uses_onednn", lambda x, w: calls.append(original(x, w)) or original(x, w))
    layer = Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.no_grad():
        layer(x)  # float32 inference: oneDNN
        layer.to(torch.bfloat16)(x.bfloat16())  # another dtype: F.linear
        layer.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.bfloat16  # autocast keeps its dtype: F.linear
    layer(x)  # autograd: F.linear
    assert calls == [True, False, False, False]


def test_a_tied_projection_shares_the_embedding_and_keeps_linear_state_dict_keys():
    model = build_model(preset("gpt2-tiny"))
    assert isinstance(model.lm_head, Linear)
    assert model.lm_head.weight is model.embeddings.tokens.weight
    assert {k for k in model.state_dict() if k.startswith("lm_head")} <= {"lm_head.weight", "lm_head.bias"}


@pytest.mark.skipif(not linear.ONEDNN, reason="this PyTorch was built without oneDNN")
def test_inside_packed_weights_the_weight_is_packed_from_its_second_use_and_dropped_at_the_end():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(32, 40), Linear(40, 8))
    x = torch.randn(8, 32)
    expected = model(x).detach()
    with torch.no_grad(), linear.packed_weights(model):
        torch.testing.assert_close(model(x[:1]), expected[:1], atol=1e-5, rtol=1e-5)  # one row: the plain weight
        assert model[0]._packed is None
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)  # first use with rows: still plain
        assert model[0]._packed is None
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
        packed = model[0]._packed
        assert packed is not None and packed.is_mkldnn
        with linear.packed_weights(model):  # a nested scope shares the outer one's packed weights
            model(x)
            assert model[0]._packed is packed
        assert model[0]._packed is packed
        copied = copy.deepcopy(model)  # the packed weights stay behind
        assert copied[0]._packed is None and not copied[0].packing
    assert model[0]._packed is None and not model[0].packing


@pytest.mark.skipif(not linear.ONEDNN, reason="this PyTorch was built without oneDNN")
def test_outside_the_scope_a_weight_changed_without_a_trace_is_used_as_it_is():
    torch.manual_seed(0)
    layer = Linear(32, 40)
    x = torch.randn(8, 32)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.5, fused=True)  # leaves the version counters alone
    for _ in range(2):
        with torch.no_grad(), linear.packed_weights(layer):
            layer(x)
            layer(x)
        layer(x).square().sum().backward()
        version = layer.weight._version
        optimizer.step()
        assert layer.weight._version == version  # why the packed weights are a scope, not a cache
        with torch.no_grad():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beams", [1, 3])
def test_decoding_runs_inside_packed_weights_and_leaves_no_layer_packed(beams):
    torch.manual_seed(0)
    model = build_model(preset("gpt2-tiny")).eval()
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda m, _: seen.append(m.packing)) for layer in layers]
    generate(model, [[5, 6, 7], [8, 9]], GenerationConfig(max_new_tokens=3, beam_size=beams))
    for hook in hooks:
        hook.remove()
    assert seen and all(seen)
    assert not any(layer.packing or layer._packed is not None for layer in layers)  # the copies are freed

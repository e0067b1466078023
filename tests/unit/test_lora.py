"""LoRA and QLoRA (attn.core.lora): the update against the formula written out, per fused part; the base at
initialisation; merging; which parameters train; gradients over a quantized base against the dequantized float base."""

import copy

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from tiny_gguf import write_gguf

from attn.artifacts import load_model
from attn.core.errors import CheckpointError, ConfigError
from attn.core.lora import (
    LoRAConfig,
    LoRALinear,
    add_lora,
    has_lora,
    load_lora_state_dict,
    lora_state_dict,
    merge_lora,
)
from attn.core.presets import preset
from attn.core.quantized import Int4Linear, Int8Embedding, Int8Linear, quantize
from attn.models.build import build_model

ALL_LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


LLAMA = preset("smollm2-135m-tiny").replace(dropout=0.0, attention_dropout=0.0)


def llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(LLAMA).eval()


def randomize_b(model: torch.nn.Module, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith(".B"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def tokens(model: torch.nn.Module, batch: int = 2, length: int = 9) -> torch.Tensor:
    return torch.randint(0, LLAMA.vocab_size, (batch, length), generator=torch.Generator().manual_seed(3))


def test_update_is_the_formula_on_each_parts_rows():
    model = llama()
    attention = model.blocks[0].attn
    weight, sizes = attention.qkv.weight.detach().clone(), attention.sizes
    add_lora(model, LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")))
    randomize_b(model)
    layer = attention.qkv
    x = torch.randn(3, 5, weight.size(1))
    expected = list((x @ weight.T).split(sizes, dim=-1))  # q, k, v
    for part, name in ((0, "q_proj"), (2, "v_proj")):
        a, b = layer.lora[name].A.detach(), layer.lora[name].B.detach()
        assert a.shape == (4, weight.size(1)) and b.shape == (sizes[part], 4)
        expected[part] = expected[part] + (8.0 / 4) * (x @ a.T) @ b.T
    torch.testing.assert_close(layer(x), torch.cat(expected, dim=-1), atol=1e-5, rtol=1e-5)


def test_a_target_on_a_fused_layer_changes_only_its_rows():
    model = llama()
    x = torch.randn(2, 4, LLAMA.d_model)
    before = model.blocks[0].ffn.w1(x).detach()
    add_lora(model, LoRAConfig(targets=("up_proj",)))
    randomize_b(model)
    after = model.blocks[0].ffn.w1(x).detach()
    d_ff = LLAMA.d_ff
    assert torch.equal(after[..., :d_ff], before[..., :d_ff])  # the gate rows
    assert not torch.allclose(after[..., d_ff:], before[..., d_ff:])


def test_a_starts_as_peft_and_b_at_zero_so_the_model_starts_as_the_base():
    model = llama()
    x = tokens(model)
    base = model(x).detach()
    add_lora(model, LoRAConfig(rank=8, targets=ALL_LLAMA))
    assert torch.equal(model(x), base)
    a = model.blocks[0].attn.qkv.lora["q_proj"].A
    bound = 1 / LLAMA.d_model**0.5  # kaiming_uniform_(a=sqrt(5)) on (r, in): U(-1/sqrt(in), 1/sqrt(in))
    assert a.abs().max() <= bound and a.abs().max() > 0.8 * bound
    assert all(torch.equal(p, torch.zeros_like(p)) for n, p in model.named_parameters() if n.endswith(".B"))


def test_merge_gives_the_same_logits_and_plain_layers():
    model = llama()
    add_lora(model, LoRAConfig(rank=4, targets=ALL_LLAMA))
    randomize_b(model)
    x = tokens(model)
    adapted = model(x).detach()
    merge_lora(model)
    assert not has_lora(model)
    torch.testing.assert_close(model(x), adapted, atol=1e-5, rtol=1e-5)


def test_only_adapters_train():
    model = llama()
    add_lora(model, LoRAConfig(targets=("q_proj", "down_proj")))
    randomize_b(model)
    logits = model(tokens(model))
    logits.logsumexp(-1).mean().backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None}
    assert trained == {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == set(lora_state_dict(model)) and len(trained) == 2 * 2 * LLAMA.decoder_layers


def test_gpt2_targets_take_peft_names():
    torch.manual_seed(0)
    model = build_model(preset("gpt2-tiny"))
    add_lora(model, LoRAConfig(rank=2, targets=("c_attn", "c_proj", "c_fc")))
    keys = {key.removeprefix("blocks.0.") for key in lora_state_dict(model) if key.startswith("blocks.0.")}
    assert keys == {f"{layer}.lora.{name}.{m}" for layer, name in
                    (("attn.qkv", "c_attn"), ("attn.out", "c_proj"), ("ffn.w1", "c_fc"), ("ffn.w2", "c_proj"))
                    for m in "AB"}
    assert model.blocks[0].attn.qkv.lora["c_attn"].B.shape == (3 * preset("gpt2-tiny").d_model, 2)


@pytest.mark.parametrize(("fields", "field"), [
    ({"rank": 0}, "rank"),
    ({"alpha": 0}, "alpha"),
    ({"dropout": 1.0}, "dropout"),
    ({"targets": ()}, "targets"),
    ({"targets": ("query",)}, "targets"),
    ({"targets": ("c_attn", "q_proj")}, "targets"),
    ({"targets": ("q_proj", "q_proj")}, "targets"),
    ({"rank": "8"}, "rank"),
])
def test_bad_configs_name_the_field(fields, field):
    with pytest.raises(ConfigError) as err:
        LoRAConfig(**fields)
    assert err.value.field == field


def test_targets_the_model_lacks_are_refused():
    with pytest.raises(ConfigError, match="gate_proj"):
        add_lora(build_model(preset("gpt2-tiny")), LoRAConfig(targets=("gate_proj",)))
    model = add_lora(llama(), LoRAConfig())
    with pytest.raises(ConfigError, match="merge_lora"):
        add_lora(model, LoRAConfig())


def test_adapters_round_trip_and_mismatches_are_refused():
    model = add_lora(llama(), LoRAConfig(rank=4))
    randomize_b(model)
    state = {key: value.clone() for key, value in lora_state_dict(model).items()}
    other = add_lora(llama(), LoRAConfig(rank=4))
    load_lora_state_dict(other, state)
    x = tokens(model)
    assert torch.equal(other(x), model(x))
    with pytest.raises(CheckpointError, match="missing"):
        load_lora_state_dict(add_lora(llama(), LoRAConfig(rank=4, targets=("q_proj", "v_proj", "o_proj"))), state)
    with pytest.raises(CheckpointError, match="shape"):
        load_lora_state_dict(add_lora(llama(), LoRAConfig(rank=2)), state)


def dequantized_twin(quantized: torch.nn.Module, float_model: torch.nn.Module) -> torch.nn.Module:
    """`float_model` holding the weights `quantized` stands for: the float base a QLoRA model approximates."""
    twin = copy.deepcopy(float_model)
    layers = dict(twin.named_modules())
    with torch.no_grad():
        for name, module in quantized.named_modules():
            if isinstance(module, (Int8Linear, Int4Linear)):
                layers[name].weight.copy_(module.dequantized())
            elif isinstance(module, Int8Embedding):
                layers[name].weight.copy_(module.weight.float() * module.scale[:, None])
    return twin


def assert_same_adapter_gradients(quantized: torch.nn.Module, twin: torch.nn.Module, vocab: int) -> None:
    grads = []
    for net in (quantized, twin):
        torch.manual_seed(5)
        add_lora(net, LoRAConfig(rank=4, targets=ALL_LLAMA))
        randomize_b(net)
        x = torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(3))
        # 80 rows: past the int4 kernel's rows, onto the float32 weight
        F.cross_entropy(net(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten()).backward()
        grads.append({name: p.grad for name, p in net.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_qlora_gradients_equal_lora_over_the_dequantized_weights(scheme):
    model = llama()
    quantized = quantize(copy.deepcopy(model), scheme)
    assert any(isinstance(m, Int4Linear if scheme == "int4" else Int8Linear) for m in quantized.modules())
    assert_same_adapter_gradients(quantized, dequantized_twin(quantized, model), LLAMA.vocab_size)


@pytest.mark.parametrize(("kind", "layer"), [("Q4_0", Int4Linear), ("Q8_0", Int8Linear)])
def test_qlora_over_a_gguf_files_kept_blocks(tmp_path, kind, layer):
    write_gguf(tmp_path / "m.gguf", quant=GGMLQuantizationType[kind])
    kept = load_model(tmp_path / "m.gguf", "cpu").model
    assert isinstance(kept.blocks[0].attn.qkv, layer)
    floats = load_model(tmp_path / "m.gguf", "cpu", dequantize=True).model
    assert_same_adapter_gradients(kept, dequantized_twin(kept, floats), kept.embeddings.tokens.weight.size(0))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_layers_input_gradient_is_the_dequantized_weights(scheme):
    torch.manual_seed(0)
    layer = quantize(torch.nn.Sequential(torch.nn.Linear(64, 48)), scheme)[0]
    x = torch.randn(3, 64, requires_grad=True)
    grad = torch.randn(3, 48)
    layer(x).backward(grad)
    torch.testing.assert_close(x.grad, grad @ layer.dequantized(), atol=1e-5, rtol=1e-5)


def test_qlora_steps_reduce_the_loss():
    model = add_lora(quantize(llama(), "int4"), LoRAConfig(rank=4, alpha=8.0, targets=ALL_LLAMA))
    assert all(isinstance(m.base, (Int4Linear, Int8Linear)) for m in model.modules() if isinstance(m, LoRALinear))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x = tokens(model, batch=4, length=16)
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


def test_merging_a_quantized_base_gives_float_layers_of_the_same_logits():
    model = add_lora(quantize(llama(), "int8"), LoRAConfig(rank=4, targets=("q_proj", "o_proj")))
    randomize_b(model)
    x = tokens(model, length=20)  # more rows than the int8 kernel's: the float32 product, as merged
    adapted = model(x).detach()
    merge_lora(model)
    assert not any(isinstance(m.attn.qkv, Int8Linear) for m in model.blocks)
    torch.testing.assert_close(model(x), adapted, atol=1e-5, rtol=1e-5)

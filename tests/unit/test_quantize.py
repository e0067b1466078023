"""int8 and int4 weights: the row quantization's numbers, the layers against their float formula, the model
transform (tied matrices stored once, soft-capped projections left in float), and checkpoints that stay
quantized."""

import os
import subprocess
import sys

import pytest
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor

from attn.core import quantized as quantize_module
from attn.app.cli import main
from attn.artifacts import load_model, save_model
from attn.artifacts.checkpoint import MODEL_FILE, QUANTIZATION_KEY, write_checkpoint
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError, ConfigError
from attn.core.layers import SoftCappedProjection
from attn.core.linear import Linear
from attn.models import build_model
from attn.core.presets import preset
from attn.core.quantized import (
    DynamicInt8Linear,
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    quantization_of,
    quantize,
    quantize_groups,
    quantize_rows,
)
from attn.training.runconfig import RunConfig

TEXT = "the quick brown fox jumps over the lazy dog. " * 4


def test_rows_are_scaled_by_their_largest_magnitude_over_127():
    w = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.54, 1.27, -0.01]])
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (3, 1)
    torch.testing.assert_close(scale.squeeze(1), torch.tensor([1 / 127, 1.0, 0.02]))
    assert q.tolist() == [[64, -127, 32], [0, 0, 0], [127, 64, 0]]  # round(63.5) = 64 (half to even: 64)


def test_the_rounding_error_is_at_most_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(64, 96) * torch.rand(64, 1) * 3
    q, scale = quantize_rows(w)
    assert bool(((q.float() * scale - w).abs() <= scale / 2 + 1e-7).all())


def _int8_layer(kind: type[Int8Linear], bias: bool) -> tuple[Linear, Int8Linear, Tensor, Tensor | None]:
    """A float layer, its int8 twin of class `kind`, and the dequantized weight and the bias."""
    torch.manual_seed(0)
    layer = Linear(48, 40, bias=bias)
    q, scale = quantize_rows(layer.weight.detach())
    b = layer.bias.detach() if bias else None
    return layer, kind(q, scale.squeeze(1), b), q.double() * scale.double(), b


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_multiplies_a_few_rows_in_bfloat16(bias):
    """Up to KERNEL_ROWS rows go through the kernel in bfloat16: inputs and scales rounded to it, the sums in
    float32, the output rounded to bfloat16 (half a unit in its last place: 2^-9 of the value), the bias added in
    float32."""
    _, int8, weight, b = _int8_layer(Int8Linear, bias)
    x = torch.randn(3, 1, 48)
    scale = int8.scale.bfloat16().double()
    expected = F.linear(x.bfloat16().double(), int8.weight.double() * scale[:, None]).float()
    unbiased = 0 if b is None else b
    torch.testing.assert_close(int8(x) - unbiased, expected, rtol=2**-8, atol=1e-5)
    torch.testing.assert_close(int8(x[:, -1:]) - unbiased, expected[:, -1:], rtol=2**-8, atol=1e-5)  # a strided view
    assert (expected - F.linear(x, weight.float())).abs().max() < 0.02 * expected.abs().max()  # what bfloat16 costs


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_multiplies_more_rows_by_the_dequantized_weight(bias):
    _, int8, weight, b = _int8_layer(Int8Linear, bias)
    x = torch.randn(3, 5, 48)
    torch.testing.assert_close(int8(x), F.linear(x, weight.float(), b), atol=1e-5, rtol=1e-5)


def test_many_rows_meet_the_weight_a_slice_at_a_time(monkeypatch):
    """More rows than the kernel takes: the weight is dequantized 7 rows at a time (40 = 5 x 7 + 5), same result."""
    monkeypatch.setattr(quantize_module, "DEQUANTIZED_WEIGHTS", 48 * 7)
    _, int8, weight, b = _int8_layer(Int8Linear, True)
    x = torch.randn(2, 9, 48)
    torch.testing.assert_close(int8(x), F.linear(x, weight.float(), b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("exact_int8_sums", [True, False])  # False: the float32 path of CPUs without VNNI
@pytest.mark.parametrize("shape", [(1, 48), (3, 5, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_dynamic_int8_linear_multiplies_the_quantized_rows_of_input_and_weight(bias, shape, exact_int8_sums,
                                                                                monkeypatch):
    if exact_int8_sums and not quantize_module.int8_products_are_exact():
        pytest.skip("torch._int_mm does not sum int8 products exactly on this CPU (no VNNI)")
    monkeypatch.setattr(quantize_module, "int8_products_are_exact", lambda: exact_int8_sums)
    layer, int8, weight, b = _int8_layer(DynamicInt8Linear, bias)
    x = torch.randn(*shape)
    xq, x_scale = quantize_rows(x)
    expected = F.linear(xq.double() * x_scale.double(), weight, None if b is None else b.double())
    torch.testing.assert_close(int8(x).double(), expected, atol=1e-5, rtol=1e-5)
    assert (int8(x) - layer(x)).abs().max() < 0.03 * layer(x).abs().max()  # within int8's few per cent


def test_the_int8_product_check_agrees_with_the_sums_of_onednn_capped_at_avx2():
    """Capped at AVX2, oneDNN sums int8 products in saturating int16 on some CPUs (AVX-512 ones among them) and
    exactly on others: the check answers as large random int8 products measured against int64 sums do."""
    code = ("import torch; from attn.core.quantized import int8_products_are_exact as e; g = torch.Generator().manual_seed(0); "
            "a = torch.randint(-128, 128, (16, 256), dtype=torch.int8, generator=g); "
            "b = torch.randint(-128, 128, (256, 16), dtype=torch.int8, generator=g); "
            "print(e(), bool(torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())))")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    check, measured = out.stdout.split()
    assert check == measured


def test_int8_embedding_rows_are_the_dequantized_rows():
    torch.manual_seed(0)
    q, scale = quantize_rows(torch.randn(11, 8))
    tokens = torch.tensor([[3, 0, 10], [3, 3, 1]])
    torch.testing.assert_close(Int8Embedding(q, scale.squeeze(1))(tokens), (q.float() * scale)[tokens])


def test_quantize_replaces_every_linear_and_shares_a_tied_matrix():
    torch.manual_seed(0)
    model = build_model(preset("gpt2-tiny")).eval()
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        expected = model(tokens)
        quantize(model)
        got = model(tokens)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert isinstance(model.embeddings.tokens, Int8Embedding) and quantization_of(model) == "int8"
    assert model.lm_head.weight is model.embeddings.tokens.weight  # one int8 matrix, as tied
    assert not any(p.requires_grad for p in model.parameters())
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()  # within int8's few per cent
    assert model.new_cache(1, 4).keys.dtype == torch.float32  # int8 weights compute in float32


def test_a_soft_capped_projection_stays_float():
    model = quantize(build_model(preset("gemma-2-2b").replace(d_model=32, heads=2, kv_heads=1, head_size=16, d_ff=64,
                                                                 decoder_layers=2, layer_types=("sliding_attention", "full_attention"),
                                                                 vocab_size=50)))
    assert isinstance(model.lm_head, SoftCappedProjection)
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 50)


def test_quantize_refuses_an_unknown_scheme():
    with pytest.raises(ConfigError, match="unknown quantization 'int3'"):
        quantize(build_model(preset("gpt2-tiny")), "int3")


@pytest.fixture
def lm_checkpoint(tmp_path):
    tokenizer = Tokenizer.train_chars([TEXT])
    config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    return write_checkpoint(tmp_path / "lm", build_model(config), config, RunConfig().to_dict(), tokenizer=tokenizer,
                            task_info={"task": "lm"})


def test_a_quantized_checkpoint_loads_quantized_with_the_same_numbers(lm_checkpoint, tmp_path):
    bundle = load_model(lm_checkpoint, "cpu", quantize="int8")
    folder = save_model(bundle, tmp_path / "int8")
    with safetensors.safe_open(str(folder / MODEL_FILE), "pt") as weights:
        assert weights.metadata()[QUANTIZATION_KEY] == "int8"
    reloaded = load_model(folder, "cpu")
    assert quantization_of(reloaded.model) == "int8"
    tokens = torch.tensor([bundle.tokenizer.encode("the lazy")])
    with torch.no_grad():
        assert torch.equal(reloaded.model(tokens), bundle.model(tokens))
    assert quantization_of(load_model(folder, "cpu", quantize="int8").model) == "int8"  # already int8: kept


def test_a_dynamic_int8_checkpoint_loads_back_dynamic(lm_checkpoint, tmp_path):
    bundle = load_model(lm_checkpoint, "cpu", quantize="int8-dynamic")
    assert quantization_of(bundle.model) == "int8-dynamic"
    assert isinstance(bundle.model.lm_head, DynamicInt8Linear)
    reloaded = load_model(save_model(bundle, tmp_path / "dynamic"), "cpu")
    assert quantization_of(reloaded.model) == "int8-dynamic"
    tokens = torch.tensor([bundle.tokenizer.encode("the lazy")])
    with torch.no_grad():
        assert torch.equal(reloaded.model(tokens), bundle.model(tokens))


def test_an_unknown_quantization_in_the_file_is_named(lm_checkpoint):
    file = lm_checkpoint / MODEL_FILE
    with safetensors.safe_open(str(file), "pt") as weights:
        tensors = {key: weights.get_tensor(key) for key in weights.keys()}
    safetensors.torch.save_file(tensors, str(file), metadata={QUANTIZATION_KEY: "int3"})
    with pytest.raises(CheckpointError, match="unknown quantization 'int3'"):
        load_model(lm_checkpoint, "cpu")


def test_the_cli_generates_and_converts_with_int8_weights(lm_checkpoint, tmp_path, capsys):
    assert main(["generate", "--model", str(lm_checkpoint), "--device", "cpu", "--quantize", "int8",
                 "--max-new-tokens", "5", "--prompt", "the"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["convert", "--to", "attn", "--quantize", "int8", str(lm_checkpoint), str(tmp_path / "q")]) == 0
    assert quantization_of(load_model(tmp_path / "q", "cpu").model) == "int8"
    assert main(["convert", "--to", "gpt2", "--quantize", "int8", str(lm_checkpoint), str(tmp_path / "hf")]) == 2
    assert "gpt2 directories hold float weights" in capsys.readouterr().err


def test_int4_groups_of_32_have_a_scale_and_a_minimum():
    w = torch.cat([torch.arange(32.0) * 0.5 - 3, torch.full((32,), 0.25)]).view(1, 64)
    codes, scales = quantize_groups(w)
    assert codes.shape == (1, 32) and codes.dtype == torch.uint8 and scales.shape == (1, 2, 2)
    torch.testing.assert_close(scales[0], torch.tensor([[15.5 / 15, -3.0], [1.0, 0.25]]))
    unpacked = torch.stack([codes & 15, codes >> 4], -1).view(1, 64)
    assert unpacked[0, :32].tolist() == torch.round(torch.arange(32.0) * 0.5 / (15.5 / 15)).int().tolist()
    assert unpacked[0, 32:].tolist() == [0] * 32  # a constant group: scale 1, codes 0


@pytest.mark.parametrize("shape", [(2, 1, 96), (2, 7, 96), (8, 8, 96)])  # one row, a batch, INT4_KERNEL_ROWS
@pytest.mark.parametrize("bias", [False, True])
def test_int4_linear_multiplies_a_few_rows_in_bfloat16(bias, shape):
    """The kernel multiplies in bfloat16: the inputs, scales and zeros rounded to it, the sums in float32, the
    output rounded to bfloat16 (half a unit in its last place: 2^-9 of the value), the bias added in float32."""
    torch.manual_seed(0)
    w, b = torch.randn(48, 96), torch.randn(48) if bias else None
    codes, scales = quantize_groups(w)
    q = torch.stack([codes & 15, codes >> 4], -1).view(48, 96).float().view(48, 3, 32)
    dequantized = (q * scales[..., :1] + scales[..., 1:]).view(48, 96)
    assert (dequantized - w).abs().max() <= scales[..., 0].max() / 2 + 1e-6
    layer = Int4Linear(codes, scales, b)
    assert torch.equal(layer.codes(), q.view(48, 96).to(torch.uint8))
    scale = scales[..., 0].bfloat16().float()
    zero = (scales[..., 1] + 8 * scales[..., 0]).bfloat16().float()
    in_bf16 = ((q - 8) * scale[..., None] + zero[..., None]).view(48, 96)
    x = torch.randn(*shape)
    product = F.linear(x.bfloat16().float(), in_bf16)
    got = layer(x) - (0 if b is None else b)
    torch.testing.assert_close(got, product, rtol=2**-8, atol=1e-5)
    assert (product - F.linear(x, dequantized)).abs().max() < 0.05 * product.abs().max()  # what bfloat16 costs


@pytest.mark.parametrize("rows", [48, 96, 1040])  # a tail of 16 rows after whole blocks of the kernel's layout
def test_int4_linear_multiplies_many_rows_by_its_float32_weight_a_slice_at_a_time(rows, monkeypatch):
    """More than INT4_KERNEL_ROWS rows (a prompt): the codes read back from the kernel's layout, a slice of rows at a
    time, (q - 8) scale + zero with the layer's bfloat16 scales and zeros, multiplied in float32."""
    if quantize_module.int4_readable_block() is None:
        pytest.skip("this CPU's int4 layout is not read back (no AVX2): every row count goes through the kernel")
    monkeypatch.setattr(quantize_module, "DEQUANTIZED_WEIGHTS", 96 * 64)  # 64 rows at a time
    torch.manual_seed(0)
    w, b = torch.randn(rows, 96), torch.randn(rows)
    codes, scales = quantize_groups(w)
    layer = Int4Linear(codes, scales, b)
    q = torch.stack([codes & 15, codes >> 4], -1).view(rows, 96)
    assert torch.equal(layer.codes(), q) and torch.equal(layer.codes(slice(0, 64)), q[:64])
    scale = scales[..., 0].bfloat16().double()
    zero = (scales[..., 1] + 8 * scales[..., 0]).bfloat16().double()
    weight = ((q.double().view(rows, 3, 32) - 8) * scale[..., None] + zero[..., None]).view(rows, 96)
    x = torch.randn(3, 40, 96)  # 120 rows
    torch.testing.assert_close(layer(x), F.linear(x.double(), weight, b.double()).float(), rtol=1e-5, atol=1e-5)


def test_int4_keeps_a_tied_projection_and_odd_sized_layers_in_int8():
    torch.manual_seed(0)
    model = build_model(preset("gpt2-tiny").replace(d_ff=40)).eval()  # w1's output and w2's input, 40: not multiples of 16 and 32
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        expected = model(tokens)
        quantize(model, "int4")
        got = model(tokens)
    assert quantization_of(model) == "int4"
    assert isinstance(model.blocks[0].attn.qkv, Int4Linear) and isinstance(model.blocks[0].ffn.w2, Int8Linear)
    assert model.lm_head.weight is model.embeddings.tokens.weight
    assert (got - expected).abs().max() < 0.2 * expected.abs().max()  # 4 bits: a coarser grid than int8


def test_int4_rows_packed_a_slice_at_a_time_are_the_kernels_packing_of_the_whole(monkeypatch):
    monkeypatch.setattr(quantize_module, "PACK_ROWS", 64)  # 176 rows: slices of 64, 64 and 48
    torch.manual_seed(0)
    codes = torch.randint(0, 16, (176, 64), dtype=torch.uint8)
    layer = Int4Linear(codes[:, 0::2] | (codes[:, 1::2] << 4), torch.rand(176, 2, 2), None)
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 2)
    assert torch.equal(layer.weight, whole)
    assert torch.equal(layer.codes(), codes)


def test_an_int4_checkpoint_loads_with_its_codes_packed_again(lm_checkpoint, tmp_path):
    bundle = load_model(lm_checkpoint, "cpu", quantize="int4")
    reloaded = load_model(save_model(bundle, tmp_path / "int4"), "cpu")
    assert quantization_of(reloaded.model) == "int4"
    codes, scales = quantize_groups(load_model(lm_checkpoint, "cpu").model.blocks[0].attn.qkv.weight.detach())
    stored = reloaded.model.state_dict()  # the portable codes, not the kernel's layout of this CPU
    assert torch.equal(stored["blocks.0.attn.qkv.weight"], codes)
    torch.testing.assert_close(stored["blocks.0.attn.qkv.scales"], scales, rtol=2**-8, atol=0)  # bfloat16 scales
    tokens = torch.tensor([bundle.tokenizer.encode("the lazy")])
    with torch.no_grad():
        assert torch.equal(reloaded.model(tokens), bundle.model(tokens))

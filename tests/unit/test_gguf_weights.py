"""A GGUF file's weights kept quantized: each block type held as the layer its table names, with the numbers its
blocks stand for, read one tensor at a time and never as a float copy of a 4-bit matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import dequantize
from libgguf import quantize_rows
from tiny_gguf import HEADS, KV_HEADS, TOKENS, hf_weights, permute, write_gguf

from attn import GenerationConfig, generate, load_model, save_model
from attn.artifacts.pretrained.gguf import read_gguf
from attn.artifacts.pretrained import gguf_weights
from attn.artifacts.pretrained.gguf_weights import GgufTensor
from attn.core.quantized import Int4Linear, Int8Embedding, Int8Linear, quantization_of

# K-quants take rows of 256: a model just wide enough for them (heads of 64).
WIDE = {"hidden": 256, "ffn": 512, "head_dim": 64}
WIDE_METADATA = {"llama.embedding_length": 256, "llama.feed_forward_length": 512, "llama.attention.key_length": 64,
                 "llama.rope.dimension_count": 64}
FOUR_BIT = [Q.Q4_0, Q.Q4_1, Q.Q4_K]
OTHER = [Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q3_K, Q.IQ4_NL]
FLOATS = [Q.F16, Q.BF16, Q.F32]


def write_wide(path: Path, quant, tied: bool = True) -> dict[str, np.ndarray]:
    return write_gguf(path, weights=hf_weights(tied=tied, **WIDE), quant=quant, changes=WIDE_METADATA)


@pytest.mark.parametrize("kind", FOUR_BIT)
def test_four_bit_blocks_are_groups_of_32_that_dequantize_exactly_as_gguf_does(tmp_path: Path, kind: Q) -> None:
    written = write_wide(tmp_path / "m.gguf", kind)
    weights = read_gguf(tmp_path / "m.gguf").weights
    for name, heads in (("self_attn.q_proj", HEADS), ("self_attn.k_proj", KV_HEADS), ("mlp.down_proj", None)):
        values = written[f"model.layers.0.{name}.weight"]
        stored = values if heads is None else permute(values, heads)  # as llama.cpp's converter writes q and k
        codes, scales = weights[f"model.layers.0.{name}.weight"].groups()
        assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
        assert scales.shape == (codes.shape[0], codes.shape[1] // 32, 2)
        groups = (codes.view(codes.shape[0], -1, 32).float() * scales[..., :1] + scales[..., 1:]).view(codes.shape)
        ours = groups.numpy() if heads is None else permute(groups.numpy(), heads)
        assert np.array_equal(ours, dequantize(quantize_rows(stored, kind), kind)), name


def test_a_permuted_tensor_comes_back_in_hugging_faces_order_in_every_form(tmp_path: Path) -> None:
    written = write_wide(tmp_path / "m.gguf", Q.Q4_0)
    tensor = read_gguf(tmp_path / "m.gguf").weights["model.layers.1.self_attn.q_proj.weight"]
    codes, scales = tensor.groups()
    from_groups = (codes.view(codes.shape[0], -1, 32).float() * scales[..., :1] + scales[..., 1:]).view(codes.shape)
    assert torch.equal(from_groups, tensor.floats())
    original = written["model.layers.1.self_attn.q_proj.weight"]
    assert (tensor.floats().numpy() - original).std() < 0.1 * original.std()  # Hugging Face's rows, not permuted


def q4_k_m(name: str) -> Q:
    """The mix of llama.cpp's Q4_K_M: 6-bit values and down projections, 8-bit embedding, 4-bit the rest."""
    if "attn_v" in name or "ffn_down" in name:
        return Q.Q6_K
    return Q.Q8_0 if name == "token_embd.weight" else Q.Q4_K


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
@pytest.mark.parametrize("kind", [*FOUR_BIT, *OTHER, *FLOATS, q4_k_m], ids=lambda k: getattr(k, "name", "Q4_K_M"))
def test_each_block_type_is_held_as_its_layer_with_the_numbers_of_its_blocks(
    tmp_path: Path, kind, sliced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4-bit blocks: int4 codes exact, scales and zeros rounded to bfloat16 (2^-9 of each); other blocks: int8 rows
    within half a step of the dequantized row; floats: float32 as read. A fused projection of mixed parts is int8.
    Sliced: each matrix is read a few rows (whole heads of the reordered q and k) at a time, as large ones are."""
    if sliced:
        monkeypatch.setattr(gguf_weights, "DEQUANTIZED_WEIGHTS", 256 * 12)
    write_wide(tmp_path / "m.gguf", kind, tied=False)
    kept = load_model(tmp_path / "m.gguf", "cpu").model
    floats = dict(load_model(tmp_path / "m.gguf", "cpu", dequantize=True).model.named_modules())
    layers = {name: m for name, m in kept.named_modules() if isinstance(m, (Int4Linear, Int8Linear, torch.nn.Linear))}
    assert len(layers) == 2 * 4 + 1
    for name, layer in layers.items():
        float_weight = floats[name].weight
        if isinstance(layer, Int4Linear):
            torch.testing.assert_close(layer.dequantized(), float_weight, rtol=0, atol=float(float_weight.detach().abs().max()) * 2**-7)
        elif isinstance(layer, Int8Linear):
            assert ((layer.dequantized() - float_weight).abs() <= layer.scale[:, None] / 2 + 1e-7).all(), name
        else:
            assert torch.equal(layer.weight, float_weight), name
    parts = [kind(n) for n in ("blk.0.attn_q.weight", "blk.0.attn_v.weight")] if callable(kind) else [kind]
    qkv = layers["blocks.0.attn.qkv"]
    if all(p in FOUR_BIT for p in parts):
        assert isinstance(qkv, Int4Linear)
    elif all(p in FLOATS for p in parts):
        assert not isinstance(qkv, (Int4Linear, Int8Linear))
    else:
        assert isinstance(qkv, Int8Linear)
    tokens = torch.tensor([[5, 70, 12, 200, 9]])
    with torch.no_grad():
        p, q = floats[""](tokens).log_softmax(-1), kept(tokens).log_softmax(-1)
    assert float((p.exp() * (p - q)).sum(-1).mean()) < 0.02  # mean KL of the next-token distributions


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # q/k/v biases, q/k norms
def test_every_architecture_is_held_quantized_with_its_biases_and_norms(tmp_path: Path, arch: str) -> None:
    write_gguf(tmp_path / "m.gguf", arch, quant=Q.Q4_0)
    kept = load_model(tmp_path / "m.gguf", "cpu").model
    floats = load_model(tmp_path / "m.gguf", "cpu", dequantize=True).model
    assert isinstance(kept.blocks[0].attn.qkv, Int4Linear)
    assert (kept.blocks[0].attn.qkv.bias is not None) == (arch == "qwen2")
    for name, tensor in floats.named_parameters():
        if tensor.ndim == 1:  # norms and biases: float32, as read
            assert torch.equal(kept.get_parameter(name) if name in dict(kept.named_parameters()) else
                               kept.get_buffer(name), tensor), name
    tokens = torch.tensor([[5, 70, 12, 200, 9]])
    with torch.no_grad():
        p, q = floats(tokens).log_softmax(-1), kept(tokens).log_softmax(-1)
    assert float((p.exp() * (p - q)).sum(-1).mean()) < 0.02


def test_a_tied_quantized_embedding_and_output_share_one_int8_matrix(tmp_path: Path) -> None:
    write_wide(tmp_path / "m.gguf", q4_k_m)
    model = load_model(tmp_path / "m.gguf", "cpu").model
    assert isinstance(model.embeddings.tokens, Int8Embedding) and isinstance(model.lm_head, Int8Linear)
    assert model.lm_head.weight is model.embeddings.tokens.weight
    assert quantization_of(model) == "int4"


def test_no_four_bit_matrix_is_ever_dequantized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_wide(tmp_path / "m.gguf", Q.Q4_K)
    read: list[tuple[int, ...]] = []
    floats = GgufTensor.floats

    def spy(tensor: GgufTensor, rows: slice = slice(None)) -> torch.Tensor:
        read.append(tensor.shape)
        return floats(tensor, rows)

    monkeypatch.setattr(GgufTensor, "floats", spy)
    load_model(tmp_path / "m.gguf", "cpu")
    assert read and all(len(shape) == 1 or shape == (len(TOKENS), 256) for shape in read)  # norms, the embedding


def test_a_kept_quantized_model_saves_and_loads_back_the_same(tmp_path: Path) -> None:
    write_wide(tmp_path / "m.gguf", q4_k_m)
    bundle = load_model(tmp_path / "m.gguf", "cpu")
    again = load_model(save_model(bundle, tmp_path / "saved"), "cpu")
    tokens = torch.tensor([[5, 70, 12]])
    with torch.no_grad():
        assert torch.equal(bundle.model(tokens), again.model(tokens))


@pytest.mark.parametrize("kind", [Q.Q4_K, q4_k_m], ids=["Q4_K", "Q4_K_M"])
def test_a_kept_model_decodes_with_its_cache_as_its_full_forward_does(tmp_path: Path, kind) -> None:
    write_wide(tmp_path / "m.gguf", kind, tied=kind is not q4_k_m)
    model = load_model(tmp_path / "m.gguf", "cpu").model
    prompt = [5, 70, 12]
    new = generate(model, [prompt], GenerationConfig(max_new_tokens=6))[0]
    with torch.no_grad():
        for i, token in enumerate(new):  # the cached step's choice is the full forward's best, to bfloat16 rounding
            logits = model(torch.tensor([prompt + new[:i]]))[0, -1]
            assert logits[token] >= logits.max() - 2**-7 * logits.abs().max(), i


def test_quantize_and_a_gpu_take_the_dequantized_weights(tmp_path: Path) -> None:
    write_wide(tmp_path / "m.gguf", Q.Q4_K)
    assert quantization_of(load_model(tmp_path / "m.gguf", "cpu", quantize="int8").model) == "int8"
    assert quantization_of(load_model(tmp_path / "m.gguf", "cpu", dequantize=True).model) is None

"""Each block type's decoder in `gguf_weights` gives, value for value, what `gguf.quants.dequantize` gives for the
same blocks (written by libgguf's quantizer), for a slice of rows anywhere in a matrix, reordered heads among them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf import dequantize
from libgguf import quantize_rows

from attn.artifacts.pretrained.gguf_file import GgufTensorInfo
from attn.artifacts.pretrained.gguf_weights import GgufTensor

WIDTH, ROWS = 512, 13  # two super-blocks of 256 a row; an odd number of rows
SLICES = [slice(None), slice(0, 1), slice(3, 10), slice(12, 13)]
FOUR_BIT = [Q.Q4_0, Q.Q4_1, Q.Q4_K]
EIGHT_BIT_ROWS = [Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0]


def stored(path: Path, kind: Q, rows: int = ROWS, heads: int | None = None) -> tuple[GgufTensor, np.ndarray]:
    """A matrix of `rows` x WIDTH written as `kind` blocks alone in a file (after 8 bytes of something else), and
    what gguf dequantizes them to."""
    weights = np.random.default_rng(int(kind)).standard_normal((rows, WIDTH)).astype(np.float32)
    weights[1] *= 1e-3  # rows of very different sizes: small scales and minimums
    weights[2, :40] = 0  # and a run of zeros
    blocks = quantize_rows(weights, kind)
    path.write_bytes(b"\0" * 8 + blocks.tobytes())
    info = GgufTensorInfo("w", kind, (WIDTH, rows), rows * WIDTH, blocks.nbytes, 8)
    return GgufTensor(path, info, heads=heads), dequantize(blocks, kind)


@pytest.mark.parametrize("kind", EIGHT_BIT_ROWS, ids=lambda k: k.name)
def test_floats_are_ggufs_dequantized_values_to_the_bit(tmp_path: Path, kind: Q) -> None:
    tensor, expected = stored(tmp_path / "w.bin", kind)
    for rows in SLICES:
        got = tensor.floats(rows)
        assert got.dtype == torch.float32 and got.shape == expected[rows].shape
        assert np.array_equal(got.numpy(), expected[rows]), (kind.name, rows)


@pytest.mark.parametrize("kind", FOUR_BIT, ids=lambda k: k.name)
def test_four_bit_groups_are_codes_and_scales_that_give_ggufs_values_to_the_bit(tmp_path: Path, kind: Q) -> None:
    tensor, expected = stored(tmp_path / "w.bin", kind)
    for rows in SLICES:
        codes, scales = tensor.groups(rows)
        assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
        values = codes.view(codes.size(0), -1, 32).float() * scales[..., :1] + scales[..., 1:]
        assert np.array_equal(values.flatten(1).numpy(), expected[rows]), (kind.name, rows)
        assert np.array_equal(tensor.floats(rows).numpy(), expected[rows]), (kind.name, rows)


@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q6_K], ids=lambda k: k.name)
def test_reordered_heads_come_back_in_hugging_faces_order(tmp_path: Path, kind: Q) -> None:
    """llama.cpp keeps row r * d/2 + j of a head as row 2j + r: slices of whole heads are put back."""
    tensor, expected = stored(tmp_path / "w.bin", kind, rows=16, heads=4)
    unpermuted = expected.reshape(4, 2, 2, WIDTH).transpose(0, 2, 1, 3).reshape(16, WIDTH)
    for rows in (slice(None), slice(4, 12)):
        assert np.array_equal(tensor.floats(rows).numpy(), unpermuted[rows])


def test_every_type_with_a_decoder_is_one_the_tests_cover() -> None:
    from attn.artifacts.pretrained.gguf_weights import _FLOATS, _GROUPS

    assert set(_FLOATS) == set(EIGHT_BIT_ROWS + FOUR_BIT) and set(_GROUPS) == set(FOUR_BIT)
    assert all(WIDTH % GGML_QUANT_SIZES[kind][0] == 0 for kind in EIGHT_BIT_ROWS + FOUR_BIT)

"""Mask builders against their definitions."""

import torch

from attn.core.masks import (
    causal_mask,
    key_mask,
    padded_keys,
    padding_mask,
    positions_from_mask,
)


def test_causal_mask_definition():
    mask = causal_mask(4, 6)[0, 0]
    for i in range(4):
        for j in range(6):
            assert bool(mask[i, j]) == (j <= i + 2)


def test_padding_and_key_mask():
    tokens = torch.tensor([[3, 4, 0], [0, 5, 6]])
    pad = padding_mask(tokens, 0)
    assert pad.tolist() == [[True, True, False], [False, True, True]]
    assert key_mask(pad).shape == (2, 1, 1, 3)


def test_a_token_mask_without_padding_is_no_key_mask():
    assert padded_keys(None) is None
    assert padded_keys(torch.ones(2, 3, dtype=torch.bool)) is None
    pad = torch.tensor([[True, True, True], [True, True, False]])
    assert padded_keys(pad).tolist() == [[[[True, True, True]]], [[[True, True, False]]]]
    off_cpu = torch.ones(2, 3, dtype=torch.bool, device="meta")  # never read on the host (a GPU would wait)
    assert padded_keys(off_cpu).shape == (2, 1, 1, 3)


def test_positions_count_real_tokens_only():
    mask = torch.tensor([[False, False, True, True, True], [True, True, True, True, False],
                         [True, False, False, True, True]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3], [0, 0, 0, 1, 2]]

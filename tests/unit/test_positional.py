"""Positional encodings against the formulas of section 3.5, RoFormer and T5."""

import math

import pytest
import torch

from attn.core.config import SinusoidalLayout
from attn.core.positional import (
    RelativePositionBias,
    RotaryPositions,
    relative_bucket,
    rotary_frequencies,
    sinusoidal_table,
)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (99, 15)])
def test_sinusoidal_interleaved_entries(pos, i):
    d = 32
    table = sinusoidal_table(100, d, SinusoidalLayout.INTERLEAVED)
    angle = pos / 10000 ** (2 * i / d)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("pos,i", [(0, 0), (3, 1), (42, 7), (99, 15)])
def test_sinusoidal_concatenated_entries(pos, i):
    d = 32
    table = sinusoidal_table(100, d, SinusoidalLayout.CONCATENATED)
    angle = pos / 10000 ** (2 * i / d)
    assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-5)
    assert table[pos, d // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_rotary_rotates_feature_pairs_by_position_angle():
    """Far positions too: their angles are computed in float64 (in float32, the cosine of 131,071 x 0.01 is off by 2.4e-5)."""
    rope = RotaryPositions(rotary_frequencies(4, 10000.0))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4).expand(1, 1, 4, 4)
    rotated = rope.rotation(torch.tensor([[0, 1, 5, 131_071]]))(x)
    for t, pos in enumerate([0, 1, 5, 131_071]):
        for j, freq in enumerate([1.0, 10000 ** (-2 / 4)]):
            a, b = x[0, 0, t, j].item(), x[0, 0, t, j + 2].item()
            c, s = math.cos(pos * freq), math.sin(pos * freq)
            assert rotated[0, 0, t, j].item() == pytest.approx(a * c - b * s, abs=1e-5)
            assert rotated[0, 0, t, j + 2].item() == pytest.approx(b * c + a * s, abs=1e-5)


def test_rotary_scores_depend_only_on_relative_position():
    rope = RotaryPositions(rotary_frequencies(8, 10000.0))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)

    def score(pq, pk):
        return (rope.rotation(torch.tensor([[pq]]))(q) * rope.rotation(torch.tensor([[pk]]))(k)).sum().item()

    assert score(10, 7) == pytest.approx(score(30, 27), abs=1e-5)


def test_relative_buckets_exact_then_logarithmic():
    distance = torch.tensor([-200, -20, -3, 0, 3, 20, 200])
    bidirectional = relative_bucket(distance, True, buckets=32, max_distance=128)
    # 16 buckets per direction: distances < 8 exact, then log-spaced up to 128, positive ones offset by 16.
    assert bidirectional.tolist()[2:5] == [3, 0, 19]
    assert bidirectional[0].item() == 15 and bidirectional[-1].item() == 31
    # 20: 8 + floor(log(20 / 8) / log(128 / 8) * 8) = 8 + floor(0.9163 / 2.7726 * 8) = 8 + 2.
    assert bidirectional[1].item() == 10 and bidirectional[5].item() == 16 + 10
    causal = relative_bucket(distance, False, buckets=32, max_distance=128)
    assert causal.tolist()[3:] == [0, 0, 0, 0]  # the future is one bucket: a causal mask hides it anyway
    assert causal[2].item() == 3


# T5's buckets written out for 8 buckets and max_distance 8 (distance = key - query). Both
# directions: 4 buckets each, distances below 2 exact, then 2 + floor(log(n / 2) / log(8 / 2) * 2):
# n = 2, 3 -> 2, n = 4, 5 -> 3; a key after the query is offset by 4. Causal: the past only, 8
# buckets, below 4 exact, n = 4, 5 -> 4 + floor(log(n / 4) / log(2) * 4) = 4, 5; the future is 0.
BIDIRECTIONAL_BUCKETS = {-5: 3, -4: 3, -3: 2, -2: 2, -1: 1, 0: 0, 1: 5, 2: 6, 3: 6, 4: 7, 5: 7}
CAUSAL_BUCKETS = {-5: 5, -4: 4, -3: 3, -2: 2, -1: 1, 0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0}


@pytest.mark.parametrize(("bidirectional", "buckets"), [(True, BIDIRECTIONAL_BUCKETS), (False, CAUSAL_BUCKETS)])
def test_relative_bias_values_come_from_hand_computed_buckets(bidirectional, buckets):
    bias = RelativePositionBias(heads=2, buckets=8, max_distance=8, bidirectional=bidirectional)
    with torch.no_grad():  # table[bucket, head] = 10 * bucket + head: each value names its bucket
        bias.table.weight.copy_(10 * torch.arange(8.0)[:, None] + torch.arange(2.0))
    values = bias.bias(torch.arange(6)[None], torch.arange(6)[None])
    expected = torch.tensor([[[10.0 * buckets[k - q] + h for k in range(6)] for q in range(6)] for h in range(2)])
    torch.testing.assert_close(values[0], expected, atol=0, rtol=0)

"""The label-smoothed cross-entropy against a hand computation and against torch."""

import math

import pytest
import torch
import torch.nn.functional as F

from attn.core.errors import ConfigError, ShapeError
from attn.training.losses import label_smoothed_cross_entropy

LOGITS = [
    [0.5, 1.0, -1.0, 2.0, 0.0],
    [1.5, 0.2, 0.3, -0.4, 0.1],  # its target is padding: not counted
    [-0.5, 0.7, 0.0, 0.25, -2.0],
]
TARGETS = [3, 0, 1]
PAD = 0


def log_softmax(row):
    norm = math.log(sum(math.exp(x) for x in row))
    return [x - norm for x in row]


def test_matches_a_hand_computation_with_padding_ignored_and_no_mass_on_pad():
    eps = 0.1
    # Target distributions written out: 1 - eps on the target, eps / 3 on each of the three
    # classes that are neither the target nor padding (class 0), nothing on padding.
    q_first = [0.0, eps / 3, eps / 3, 1 - eps, eps / 3]
    q_third = [0.0, 1 - eps, eps / 3, eps / 3, eps / 3]
    expected = sum(
        -sum(q * lp for q, lp in zip(dist, log_softmax(row)))
        for dist, row in ((q_first, LOGITS[0]), (q_third, LOGITS[2]))
    )
    expected_nll = -log_softmax(LOGITS[0])[3] - log_softmax(LOGITS[2])[1]
    sums = label_smoothed_cross_entropy(torch.tensor(LOGITS), torch.tensor(TARGETS), eps, PAD)
    assert sums.loss.item() == pytest.approx(expected, rel=1e-5)
    assert sums.loss.item() == pytest.approx(1.8201067, rel=1e-5)
    assert sums.nll.item() == pytest.approx(expected_nll, rel=1e-5)
    assert sums.count.item() == 2


def test_returns_sums_not_means():
    logits, targets = torch.randn(4, 6, 11), torch.randint(1, 11, (4, 6))
    whole = label_smoothed_cross_entropy(logits, targets, 0.1, PAD)
    halves = [label_smoothed_cross_entropy(logits[i : i + 2], targets[i : i + 2], 0.1, PAD) for i in (0, 2)]
    assert whole.loss.item() == pytest.approx(sum(h.loss.item() for h in halves), rel=1e-5)
    assert whole.count.item() == 24


def test_without_smoothing_it_is_the_summed_cross_entropy():
    logits, targets = torch.randn(3, 7, 13), torch.randint(0, 13, (3, 7))
    sums = label_smoothed_cross_entropy(logits, targets, 0.0, PAD)
    reference = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(sums.loss, reference)
    torch.testing.assert_close(sums.nll, reference)
    assert sums.count.item() == int((targets != PAD).sum())


def test_without_a_pad_class_it_matches_torchs_label_smoothing():
    # torch spreads eps over all V classes; we spread eps' over the V - 1 others: equal when
    # eps' = eps (V - 1) / V.
    vocab, eps = 9, 0.2
    logits, targets = torch.randn(5, vocab), torch.randint(0, vocab, (5,))
    ours = label_smoothed_cross_entropy(logits, targets, eps * (vocab - 1) / vocab, pad_id=None)
    reference = F.cross_entropy(logits, targets, label_smoothing=eps, reduction="sum")
    torch.testing.assert_close(ours.loss, reference)


def test_all_padding_gives_zero_and_low_precision_logits_are_upcast():
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    sums = label_smoothed_cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long), 0.1, PAD)
    assert sums.loss.item() == 0.0 and sums.count.item() == 0 and sums.loss.dtype == torch.float32


def test_padding_gets_no_gradient_through_the_target_distribution():
    # With a pad class the smoothed loss does not push the pad logit up: its gradient is p_pad >= 0.
    logits = torch.tensor([LOGITS[0]], requires_grad=True)
    label_smoothed_cross_entropy(logits, torch.tensor([3]), 0.3, PAD).loss.backward()
    p_pad = torch.softmax(torch.tensor(LOGITS[0]), -1)[PAD]
    assert logits.grad[0, PAD].item() == pytest.approx(p_pad.item(), rel=1e-5)


def test_invalid_arguments():
    with pytest.raises(ShapeError, match="disagree"):
        label_smoothed_cross_entropy(torch.randn(2, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError, match="label_smoothing"):
        label_smoothed_cross_entropy(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(ShapeError, match="pad_id"):
        label_smoothed_cross_entropy(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), 0.1, pad_id=5)


def smoothed_target_distribution(targets, vocab, eps, pad):
    """q written out: 1 - eps on the target, eps spread over the classes that are neither it nor padding."""
    q = torch.zeros(targets.numel(), vocab, dtype=torch.float64)
    for row, y in enumerate(targets.reshape(-1).tolist()):
        if y == pad:
            continue  # padding targets are not counted: no distribution, no gradient
        sharing = [k for k in range(vocab) if k != y and k != pad]
        q[row, sharing] = eps / len(sharing)
        q[row, y] = 1.0 - eps
    return q


@pytest.mark.parametrize(("eps", "pad"), [(0.1, PAD), (0.2, None), (0.0, PAD), (0.0, None)])
def test_gradients_match_autograd_of_the_written_out_distribution(eps, pad):
    # Reference in float64 through autograd: loss = -Σ q log p, nll = -Σ onehot log p, over counted rows.
    torch.manual_seed(0)
    vocab = 7
    logits = torch.randn(3, 5, vocab)
    targets = torch.randint(0, vocab, (3, 5))
    targets[0, :2] = PAD  # some padding targets, counted only without a pad class
    weights = torch.tensor([0.7, -1.3])  # arbitrary upstream gradients of the two sums
    ours = logits.clone().requires_grad_()
    sums = label_smoothed_cross_entropy(ours, targets, eps, pad)
    (weights[0] * sums.loss + weights[1] * sums.nll).backward()
    reference = logits.double().requires_grad_()
    log_p = torch.log_softmax(reference, -1).reshape(-1, vocab)
    q = smoothed_target_distribution(targets, vocab, eps, pad)
    onehot = smoothed_target_distribution(targets, vocab, 0.0, pad)
    loss, nll = -(q * log_p).sum(), -(onehot * log_p).sum()
    (weights[0].double() * loss + weights[1].double() * nll).backward()
    torch.testing.assert_close(sums.loss.double(), loss.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sums.nll.double(), nll.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.grad.double(), reference.grad, atol=1e-5, rtol=1e-5)


def test_low_precision_logits_get_a_gradient_of_their_own_dtype():
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16, requires_grad=True)
    label_smoothed_cross_entropy(logits, torch.randint(1, 5, (2, 3)), 0.1, PAD).loss.backward()
    assert logits.grad.dtype == torch.bfloat16 and logits.grad.shape == (2, 3, 5)
    assert torch.allclose(logits.grad.float().sum(-1), torch.zeros(2, 3), atol=1e-2)  # p - q sums to 0 per row


@pytest.mark.parametrize("offset", [0.0, 60.0])
def test_confident_mistakes_and_shifted_logits_match_torch_in_float64(offset):
    # A target 200 logits below the row's best (p_y underflows in float32) and logits shifted by a
    # constant: the loss, the NLL and the gradient stay those of torch's float64 cross-entropy.
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3 + offset
    targets = torch.tensor([3, 7, 1, 0, 9, 2])
    logits[0, 3] -= 200.0
    logits = logits.requires_grad_()
    sums = label_smoothed_cross_entropy(logits, targets, 0.1)
    sums.loss.backward()
    reference = logits.detach().double().requires_grad_()
    expected = F.cross_entropy(reference, targets, label_smoothing=0.1 * 50 / 49, reduction="sum")
    expected.backward()
    nll = F.cross_entropy(reference.detach(), targets, reduction="sum")
    assert torch.isfinite(sums.loss) and sums.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert sums.nll.item() == pytest.approx(nll.item(), rel=1e-5)
    torch.testing.assert_close(logits.grad.double(), reference.grad, atol=1e-5, rtol=1e-5)

"""Beam search: scores by hand and by a full forward pass, the stopping rules on a hand-built model,
beam 1 = greedy, batch invariance, and BOUND returning what running to the limit returns."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from attn.decoding import (
    EarlyStopping,
    GenerationConfig,
    LengthNorm,
    generate,
    generate_seq2seq,
)
from attn.decoding.beam_search import (
    Hypothesis,
    beam_search,
    beam_search_seq2seq,
    huggingface_config,
    length_penalty,
)
from attn.core.errors import GenerationError
from attn.core.kv_cache import KVCache
from attn.core.masks import positions_from_mask
from attn.models import EncoderDecoder, build_model
from attn.core.presets import preset

EOS, BOS, A, B, C, D = range(6)
START, PAD = 1, 0
MARIAN_EOS = 16  # a token that `_marian()` tends to produce after a few steps: output lengths vary


class TableLM:
    """A decoder-only stand-in whose next-token distribution depends on the last token only."""

    def __init__(self, rules: dict[int, dict[int, float]], vocab: int = 6, max_positions: int = 32) -> None:
        table = torch.full((vocab, vocab), 1e-6)
        for prev, nexts in rules.items():
            for token, p in nexts.items():
                table[prev, token] = p
        self.logprobs = (table / table.sum(-1, keepdim=True)).log()
        self.max_positions = max_positions
        self.calls = 0

    def new_cache(self, batch: int, max_length: int) -> KVCache:
        return KVCache(1, batch, 1, max_length, 1)

    def decode_step(
        self, tokens: Tensor, cache: KVCache, mask: Tensor | None = None, last_only: bool = False
    ) -> Tensor:
        self.calls += 1
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
        cache.extend(cache.next_positions() + positions_from_mask(mask), mask)
        return self.logprobs[tokens]  # (B, T, V)

    def logprob(self, tokens: list[int]) -> float:
        return sum(float(self.logprobs[p, t]) for p, t in zip(tokens, tokens[1:]))


def _marian() -> EncoderDecoder:
    torch.manual_seed(0)
    return build_model(preset("marian-base-tiny").replace(dropout=0.0)).eval()


def _sources(count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (count,), generator=g).tolist()
    return [torch.randint(3, 97, (n,), generator=g).tolist() for n in lengths]


def test_length_penalties_by_hand():
    assert length_penalty(1, 0.6, LengthNorm.GNMT) == 1.0
    assert math.isclose(length_penalty(7, 0.6, LengthNorm.GNMT), 2.0**0.6)
    assert length_penalty(4, 0.5, LengthNorm.HF) == 2.0
    assert length_penalty(9, 0.0, LengthNorm.HF) == length_penalty(9, 0.0, LengthNorm.GNMT) == 1.0


def test_beam_search_finds_what_greedy_misses():
    # Greedy takes A (0.6), after which nothing is likely; B (0.4) is almost surely followed by EOS.
    lm = TableLM({BOS: {A: 0.6, B: 0.4}, A: {C: 0.32, D: 0.28, EOS: 0.2, A: 0.2}, B: {EOS: 0.95}, C: {EOS: 0.9}})
    greedy = GenerationConfig(max_new_tokens=6)
    assert generate(lm, [[BOS]], greedy, eos_id=EOS) == [[A, C]]  # 0.6 * 0.32 * 0.9 = 0.17
    beam = GenerationConfig(max_new_tokens=6, beam_size=2, n_best=2, length_penalty=0.0)
    found = beam_search(lm, [[BOS]], beam, eos_id=EOS)[0]
    assert [(h.tokens, h.finished) for h in found] == [([B], True), ([A, C], True)]  # 0.38, then 0.17
    for h in found:
        assert math.isclose(h.logprob, lm.logprob([BOS, *h.tokens, EOS]), rel_tol=1e-5)
        assert h.score == h.logprob  # alpha = 0: lp = 1


def _stopping_lm() -> TableLM:
    # EOS at once scores log 0.5; "B EOS" scores log(0.27) / 2 = -0.65 under |Y|^1; "A C D EOS" has
    # log-probability log(0.2 * 0.99^3) and, with 4 tokens, the best score of all: -0.41.
    return TableLM({BOS: {EOS: 0.5, B: 0.3, A: 0.2}, B: {EOS: 0.9}, A: {C: 0.99}, C: {D: 0.99}, D: {EOS: 0.99}})


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("bound", [A, C, D]), ("none", [A, C, D]), ("heuristic", [B]), ("first", [B])],
)
def test_stopping_rules_on_a_hand_built_model(rule, expected):
    lm = _stopping_lm()
    config = GenerationConfig(max_new_tokens=10, beam_size=2, length_penalty=1.0, length_norm="hf", early_stopping=rule)
    best = beam_search(lm, [[BOS]], config, eos_id=EOS)[0][0]
    assert best.tokens == expected
    logprob = lm.logprob([BOS, *expected, EOS])
    assert math.isclose(best.score, logprob / (len(expected) + 1), rel_tol=1e-5)
    # After step 2 both slots hold finished hypotheses and the best alive beam, "A C" with
    # log-probability log(0.198), scores log(0.198) / 2 = -0.81 < -0.69 if it ended now: the
    # heuristic stops there (the prefill and one step), while its bound, log(0.198) / 10, does not.
    if rule in ("heuristic", "first"):
        assert lm.calls == 2


@pytest.mark.parametrize(
    ("norm", "alpha", "saving"),
    [(LengthNorm.GNMT, 0.6, 0.2), (LengthNorm.GNMT, -0.3, 0.2), (LengthNorm.HF, 0.5, 0.15), (LengthNorm.HF, 0.0, 0.35)],
)
def test_bound_returns_what_running_to_the_limit_returns_sooner(norm, alpha, saving):
    model = _marian()
    decode_step, rows = model.decode_step, []  # rows: how many beams each decode_step fed
    model.decode_step = lambda tokens, cache: rows.append(tokens.size(0)) or decode_step(tokens, cache)
    found, work = {}, {}
    for rule in (EarlyStopping.BOUND, EarlyStopping.NONE):
        config = GenerationConfig(beam_size=4, n_best=4, length_penalty=alpha, length_norm=norm,
                                  early_stopping=rule, max_new_tokens=20)
        rows.clear()
        found[rule] = beam_search_seq2seq(model, _sources(8, seed=2), START, MARIAN_EOS, PAD, config)
        work[rule] = sum(rows)
    # Retiring sentences shrinks the batch, and CPU matrix products may sum in another order for another
    # number of rows: the same hypotheses, scores equal to float32 rounding.
    bound, full = found[EarlyStopping.BOUND], found[EarlyStopping.NONE]
    assert [[(h.tokens, h.finished) for h in hs] for hs in bound] == [[(h.tokens, h.finished) for h in hs] for hs in full]
    assert_close(torch.tensor([[h.score for h in hs] for hs in bound]), torch.tensor([[h.score for h in hs] for hs in full]))
    # Measured savings: 25 % and 46 % (GNMT), 20 % and 44 % (HF); with HF's |Y| ** 1 none would be
    # settled before the limit of 20, so that case would not show that BOUND stops at all.
    assert work[EarlyStopping.BOUND] <= (1 - saving) * work[EarlyStopping.NONE]


def _forward_logprob(model: EncoderDecoder, source: list[int], hypothesis: Hypothesis) -> float:
    targets = hypothesis.tokens + [MARIAN_EOS] * hypothesis.finished
    inputs = ([START] + targets)[:-1]
    with torch.no_grad():
        logprobs = model(torch.tensor([source]), torch.tensor([inputs]))[0].log_softmax(-1)
    return float(logprobs.gather(1, torch.tensor(targets)[:, None]).sum())


@pytest.mark.parametrize(("norm", "alpha"), [(LengthNorm.GNMT, 0.6), (LengthNorm.HF, 1.0)])
def test_scores_are_the_forward_pass_log_probabilities_over_the_length_penalty(norm, alpha):
    model = _marian()
    sources = _sources(6)
    config = GenerationConfig(beam_size=4, n_best=4, length_penalty=alpha, length_norm=norm, max_new_tokens=12)
    found = beam_search_seq2seq(model, sources, START, MARIAN_EOS, PAD, config)
    assert any(h.finished for hs in found for h in hs) and any(not h.finished for hs in found for h in hs)
    for source, hypotheses in zip(sources, found):
        assert len(hypotheses) == 4 and len({tuple(h.tokens) for h in hypotheses}) == 4
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        for h in hypotheses:
            logprob = _forward_logprob(model, source, h)
            assert_close(h.logprob, logprob, atol=1e-4, rtol=1e-5)
            length = len(h.tokens) + h.finished
            assert_close(h.score, h.logprob / length_penalty(length, alpha, norm), atol=1e-5, rtol=1e-5)


def test_beam_size_one_equals_greedy():
    model = _marian()
    sources = _sources(6)
    config = GenerationConfig(max_new_tokens=15)
    one = GenerationConfig(max_new_tokens=15, beam_size=1, length_penalty=0.0)
    greedy = generate_seq2seq(model, sources, START, MARIAN_EOS, PAD, config)
    assert [h[0].tokens for h in beam_search_seq2seq(model, sources, START, MARIAN_EOS, PAD, one)] == greedy
    torch.manual_seed(0)
    lm = build_model(preset("gpt2-tiny")).eval()
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12]]
    eos = generate(lm, prompts, config)[0][3]
    assert [h[0].tokens for h in beam_search(lm, prompts, one, eos)] == generate(lm, prompts, config, eos)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_sentence_translates_the_same_alone_and_in_a_padded_batch_of_32(beam_size):
    model = _marian()
    sources = _sources(32, seed=1)
    config = GenerationConfig(beam_size=beam_size, max_new_tokens=15)
    batched = generate_seq2seq(model, sources, START, MARIAN_EOS, PAD, config)
    assert len(set(map(len, batched))) > 3  # the outputs end at different steps
    for i in range(0, 32, 3):
        assert generate_seq2seq(model, [sources[i]], START, MARIAN_EOS, PAD, config)[0] == batched[i]


def test_decoder_only_beam_search_is_batch_invariant():
    torch.manual_seed(0)
    lm = build_model(preset("gpt2-tiny")).eval()
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    config = GenerationConfig(beam_size=3, n_best=3, max_new_tokens=8)
    batched = beam_search(lm, prompts, config, eos_id=EOS)
    assert generate(lm, prompts, config, eos_id=EOS) == [h[0].tokens for h in batched]
    for prompt, hypotheses in zip(prompts, batched):
        alone = beam_search(lm, [prompt], config, eos_id=EOS)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hypotheses]
        assert_close([h.score for h in alone], [h.score for h in hypotheses], atol=1e-5, rtol=0)


def test_huggingface_settings_map_to_our_rules():
    rule = lambda **kw: huggingface_config(4, 20, **kw).early_stopping  # noqa: E731
    assert rule(early_stopping=False) == EarlyStopping.HEURISTIC
    assert rule(early_stopping=True) == EarlyStopping.FIRST
    assert rule(early_stopping="never", length_penalty=1.0) == EarlyStopping.BOUND
    assert rule(early_stopping="never", length_penalty=0.0) == EarlyStopping.HEURISTIC
    assert huggingface_config(4, 20).length_norm == LengthNorm.HF
    with pytest.raises(GenerationError, match="early_stopping"):
        huggingface_config(4, 20, early_stopping="sometimes")


def test_beam_search_rejects_sampling():
    with pytest.raises(GenerationError, match="neither samples"):
        beam_search(_stopping_lm(), [[BOS]], GenerationConfig(sample=True), eos_id=EOS)

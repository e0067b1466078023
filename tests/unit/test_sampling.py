"""The sampling settings by number: each logits processor against transformers' own (bias, repetition penalty,
temperature, top-k, top-p, min-p), OpenAI's frequency and presence penalties against numpy, min-p's draws against
its distribution, and every setting applied per row in a running batch and in greedy decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_imports import require
from torch.testing import assert_close

from attn.core.errors import GenerationError
from attn.core.presets import preset
from attn.decoding import (
    GenerationConfig,
    add_logit_bias,
    choose_tokens,
    generate,
    keep_min_p,
    penalize_counts,
    penalize_repeats,
    requested,
    warped,
)
from attn.decoding.continuous import RunningBatch
from attn.models import Decoder, build_model

require("transformers")
from transformers.generation import logits_process as processors  # noqa: E402

V = 40
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]


@pytest.fixture(scope="module")
def lm() -> Decoder:
    torch.manual_seed(0)
    return build_model(preset("gpt2-tiny").replace(dropout=0.0, vocab_size=V)).eval()


def _logits(rows: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


def _history(rows: int = 6, length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bias", [((3, 2.0), (17, -100.0), (0, 0.5)), ((39, 100.0),)])
def test_logit_bias_adds_as_transformers_sequence_bias_does(bias):
    reference = processors.SequenceBiasLogitsProcessor([[[token], value] for token, value in bias])
    logits = _logits()
    assert_close(add_logit_bias(logits, bias), reference(_history(), logits.clone()))


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_is_transformers(penalty):
    logits, history = _logits(), _history()
    reference = processors.RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    assert_close(penalize_repeats(logits, history, penalty), reference)


BIG = torch.finfo(torch.float32).max


@pytest.mark.parametrize(("penalty", "expected"), [(5e-324, [BIG, -0.0, BIG]), (1e-30, [2e30, -2e-30, 1e30]),
                                                   (1e39, [2e-39, -BIG, 1e-39])])
def test_an_extreme_repetition_penalty_overflows_no_score(penalty, expected):
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, float("-inf")]])
    penalized = penalize_repeats(logits, torch.tensor([[0, 1, 2, 4]]), penalty)
    assert_close(penalized, torch.tensor([[*expected, 0.5, float("-inf")]]))
    assert not penalized.log_softmax(-1).isnan().any()


@pytest.mark.parametrize(("frequency", "presence"), [(0.7, 0.0), (0.0, 1.5), (-0.4, 2.0), (2.0, -2.0)])
def test_frequency_and_presence_penalties_are_openais_formula(frequency, presence):
    logits, generated = _logits(), _history(length=12)
    generated[0, :5] = -1  # rows that are not all tokens: their -1 entries count for nothing
    counts = np.zeros((generated.size(0), V))
    for row, tokens in enumerate(generated.numpy()):
        for token in tokens[tokens >= 0]:
            counts[row, token] += 1
    expected = logits.numpy() - counts * frequency - (counts > 0) * presence
    assert_close(penalize_counts(logits, generated, frequency, presence), torch.from_numpy(expected))


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 1.0])
def test_min_p_keeps_the_tokens_transformers_keeps(min_p):
    logits = _logits()
    assert_close(keep_min_p(logits, min_p), processors.MinPLogitsWarper(min_p)(_history(), logits.clone()))


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"),
                         [(0.7, 0, 1.0, 0.05), (1.3, 10, 0.9, 0.0), (1.0, 5, 0.8, 0.2), (2.0, 0, 0.6, 0.1)])
def test_the_sampling_chain_is_transformers_warpers_in_their_order(temperature, top_k, top_p, min_p):
    chain = [processors.TemperatureLogitsWarper(temperature)]
    chain += [processors.TopKLogitsWarper(top_k)] if top_k else []
    chain += [processors.TopPLogitsWarper(top_p)] if top_p < 1 else []
    chain += [processors.MinPLogitsWarper(min_p)] if min_p else []
    logits = _logits()
    expected = logits.clone()
    for warper in chain:
        expected = warper(_history(), expected)
    config = GenerationConfig(sample=True, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    assert_close(warped(logits, config), expected)


def test_min_p_samples_follow_the_kept_tokens_renormalised():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    draws = 40000
    logits = probs.log()[None].expand(draws, -1)
    drawn = choose_tokens(logits, GenerationConfig(sample=True, min_p=0.3), torch.Generator().manual_seed(0))
    observed = torch.bincount(drawn, minlength=probs.numel()).double()
    kept = probs >= 0.3 * 0.4  # 0.12: the first three
    expected = torch.where(kept, probs, 0.0).double() / probs[kept].sum() * draws
    assert observed[~kept].sum() == 0
    chi_square = float(((observed[kept] - expected[kept]) ** 2 / expected[kept]).sum())
    assert chi_square < 13.8  # the 0.999 quantile of chi-square with 2 degrees of freedom


def test_greedy_decoding_follows_logit_bias_and_the_penalties(lm):
    plain = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=12))
    assert generate(lm, PROMPTS, GenerationConfig(max_new_tokens=12, logit_bias={21: 100.0})) == [[21] * 12] * 3
    assert all(len(set(row)) < len(row) for row in plain)  # the tiny model repeats itself greedily
    for penalty in ("presence_penalty", "frequency_penalty"):
        penalised = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=12, **{penalty: 2.0}))
        assert sum(map(len, map(set, penalised))) > sum(map(len, map(set, plain)))


def _reference_penalised(model: Decoder, prompt: list[int], config: GenerationConfig) -> list[int]:
    """Greedy decoding the slow way, every step's scores through the whole sequence, with OpenAI's formulas in
    numpy: the bias, then the repetition penalty (over the prompt too), then frequency and presence (new tokens)."""
    tokens = list(prompt)
    for _ in range(config.max_new_tokens):
        scores = model(torch.tensor([tokens]))[0, -1].detach().double().numpy()
        for token, bias in config.logit_bias:
            scores[token] += bias
        seen = np.unique(tokens)
        scores[seen] = np.where(scores[seen] > 0, scores[seen] / config.repetition_penalty,
                                scores[seen] * config.repetition_penalty)
        counts = np.bincount(tokens[len(prompt):], minlength=scores.size)
        scores -= counts * config.frequency_penalty + (counts > 0) * config.presence_penalty
        tokens.append(int(scores.argmax()))
    return tokens[len(prompt):]


def test_each_row_of_a_running_batch_decodes_under_its_own_settings(lm):
    configs = [GenerationConfig(max_new_tokens=10, frequency_penalty=1.5, logit_bias={4: 1.0}),
               GenerationConfig(max_new_tokens=10, presence_penalty=-1.0, repetition_penalty=1.4),
               GenerationConfig(max_new_tokens=10, logit_bias={9: -100.0, 30: 3.0}, presence_penalty=2.0)]
    batch = RunningBatch(lm, eos_id=None)
    for key, (prompt, config) in enumerate(zip(PROMPTS, configs)):
        batch.add(key, prompt, config)
    found: list[list[int]] = [[] for _ in PROMPTS]
    while len(batch):
        for step in batch.step():
            found[step.key].append(step.token)
    with torch.enable_grad():  # the output projection as F.linear, not the copy decoding uses
        expected = [_reference_penalised(lm, prompt, config) for prompt, config in zip(PROMPTS, configs)]
    assert found == expected


def test_a_sampled_row_with_a_bias_and_min_p_is_reproducible_and_biased(lm):
    config = GenerationConfig(max_new_tokens=8, sample=True, temperature=1.5, min_p=0.05, seed=3,
                              logit_bias={11: 8.0})
    first = generate(lm, PROMPTS, config)
    assert first == generate(lm, PROMPTS, config)
    assert sum(row.count(11) for row in first) > len(PROMPTS) * 8 // 2


def test_a_biased_id_outside_the_vocabulary_is_named_before_decoding(lm):
    with pytest.raises(GenerationError, match=f"logit_bias: token id {V} is outside the model's vocabulary of {V}"):
        generate(lm, PROMPTS, GenerationConfig(max_new_tokens=2, logit_bias={V: 1.0}))
    with pytest.raises(GenerationError, match="logit_bias: token id 99"):
        RunningBatch(lm, eos_id=None).add(0, PROMPTS[0], GenerationConfig(logit_bias=((99, 1.0),)))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sample": True, "min_p": 1.5}, r"min_p: must be in \[0, 1\]"),
        ({"sample": True, "min_p": -0.1}, r"min_p: must be in \[0, 1\]"),
        ({"min_p": 0.1}, "min_p: only applies when sampling"),
        ({"frequency_penalty": 2.5}, r"frequency_penalty: must be in \[-2, 2\]"),
        ({"presence_penalty": -2.1}, r"presence_penalty: must be in \[-2, 2\]"),
        ({"logit_bias": {3: 100.5}}, r"logit_bias: the bias of token 3 must be a number in \[-100, 100\]"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias: token ids must be ints >= 0, got -1"),
        ({"logit_bias": {"3": 1.0}}, "logit_bias: token ids must be ints >= 0, got '3'"),
        ({"logit_bias": ((3, 1.0), (3, 2.0))}, "logit_bias: a token id is given twice"),
        ({"logit_bias": (3,)}, "logit_bias: expected a mapping of token ids to biases"),
    ],
)
def test_invalid_sampling_settings_name_the_field(fields, message):
    with pytest.raises(GenerationError, match=message):
        GenerationConfig(**fields)


def test_settings_as_a_user_asks_them():
    assert requested(temperature=0, min_p=0.2).min_p == 0.0  # greedy: min_p changes nothing
    assert requested(temperature=0.8, min_p=0.2).min_p == 0.2
    with pytest.raises(GenerationError, match=r"min_p: must be in \[0, 1\]"):
        requested(temperature=0, min_p=2.0)
    config = requested(logit_bias={5: 3, 2: -1.5}, frequency_penalty=0.5)
    assert (config.logit_bias, config.frequency_penalty) == (((2, -1.5), (5, 3.0)), 0.5)
    assert hash(config) == hash(requested(logit_bias={2: -1.5, 5: 3.0}, frequency_penalty=0.5))

"""Continuous batching: a row that joins, runs beside others and leaves a running batch gets exactly what it
gets decoded alone, its scores equal to an uncached forward pass, under every positional scheme."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attn.core.config import Positional
from attn.decoding import GenerationConfig, generate
from attn.decoding.continuous import RowToken, RunningBatch
from attn.core.errors import GenerationError
from attn.models import Decoder, build_model
from attn.core.presets import preset

EOS = 2
# (arrival step, prompt, max_new_tokens): prompts shorter and longer than the running rows, joining at
# different steps, one joining after every earlier row has left.
ARRIVALS = [(0, [5, 6, 7], 6), (0, [8, 9, 10, 11, 12, 13], 3), (2, [14], 8), (3, [15, 16, 17, 18, 19, 20, 21, 22], 4),
            (4, [23, 24], 1), (20, [25, 26, 27], 3)]


def _lm(positional: Positional) -> Decoder:
    torch.manual_seed(0)
    return build_model(preset("gpt2-tiny").replace(positional=positional, dropout=0.0)).eval()


def _run(batch: RunningBatch, arrivals: list[tuple[int, list[int], GenerationConfig]]) -> dict[int, list[RowToken]]:
    """Adds each prompt at its arrival step and steps until every row is done; the steps of each row."""
    found: dict[int, list[RowToken]] = {key: [] for key in range(len(arrivals))}
    clock = 0
    while clock <= max(a[0] for a in arrivals) or len(batch):
        for key, (arrival, prompt, config) in enumerate(arrivals):
            if arrival == clock:
                batch.add(key, prompt, config)
        for step in batch.step() if len(batch) else []:
            found[step.key].append(step)
        clock += 1
    return found


@pytest.mark.parametrize("positional", [Positional.LEARNED, Positional.ROTARY, Positional.RELATIVE])
def test_a_row_in_a_continuous_batch_gets_its_tokens_and_scores_alone(positional: Positional) -> None:
    model = _lm(positional)
    arrivals = [(t, prompt, GenerationConfig(max_new_tokens=n)) for t, prompt, n in ARRIVALS]
    found = _run(RunningBatch(model, eos_id=None), arrivals)
    for key, (_, prompt, config) in enumerate(arrivals):
        tokens = [step.token for step in found[key]]
        assert tokens == generate(model, [prompt], config)[0]
        with torch.no_grad():  # the uncached forward pass over prompt + every new token
            reference = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1 : -1]
        assert_close(torch.stack([step.scores for step in found[key]]), reference, atol=1e-5, rtol=1e-5)
        assert [step.finish for step in found[key]] == [None] * (len(tokens) - 1) + ["length"]


def test_sampled_rows_keep_their_own_settings_and_seeds() -> None:
    model = _lm(Positional.LEARNED)
    configs = [
        GenerationConfig(max_new_tokens=7, sample=True, temperature=0.7, seed=1),
        GenerationConfig(max_new_tokens=5, sample=True, top_k=3, seed=2),
        GenerationConfig(max_new_tokens=6),
        GenerationConfig(max_new_tokens=8, sample=True, top_p=0.5, seed=3, repetition_penalty=1.3),
    ]
    arrivals = [(t, prompt, config) for (t, prompt, _), config in zip(ARRIVALS, configs)]
    found = _run(RunningBatch(model, eos_id=None), arrivals)
    for key, (_, prompt, config) in enumerate(arrivals):
        assert [step.token for step in found[key]] == generate(model, [prompt], config)[0]


def test_rows_end_at_eos_and_stop_strings_as_alone() -> None:
    model = _lm(Positional.LEARNED)
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731 - a token id is a word
    alone = generate(model, [[5, 6, 7]], GenerationConfig(max_new_tokens=8))[0]
    eos = alone[4]
    configs = [GenerationConfig(max_new_tokens=8, stop=(f"{alone[2]} {alone[3]}",)), GenerationConfig(max_new_tokens=8)]
    found = _run(RunningBatch(model, eos_id=eos, decode=decode), [(0, [5, 6, 7], configs[0]), (1, [5, 6, 7], configs[1])])
    for key, config in enumerate(configs):
        expected = generate(model, [[5, 6, 7]], config, eos_id=eos, decode=decode)[0]
        assert [s.token for s in found[key] if s.token != eos] == expected
        assert found[key][-1].finish == "stop" and len(found[key]) < 8
    assert found[0][-1].token == alone[3]


def test_a_removed_row_leaves_and_the_others_go_on_as_alone() -> None:
    model = _lm(Positional.ROTARY)
    batch = RunningBatch(model, eos_id=None)
    config = GenerationConfig(max_new_tokens=6)
    batch.add("long", list(range(5, 30)), config)
    batch.add("short", [5, 6], config)
    tokens = [step.token for step in batch.step() if step.key == "short"]
    batch.remove("long")
    assert batch.cache is not None and batch.cache.length == 3  # the short prompt and its first token
    while len(batch):
        tokens += [step.token for step in batch.step()]
    assert tokens == generate(model, [[5, 6]], config)[0]


def test_bad_rows_are_refused_when_added_and_leave_the_batch_untouched() -> None:
    model = _lm(Positional.LEARNED)
    batch = RunningBatch(model, eos_id=None)
    with pytest.raises(GenerationError, match="max_positions"):
        batch.add(0, [5] * 10, GenerationConfig(max_new_tokens=model.max_positions))
    with pytest.raises(GenerationError, match="beam"):
        batch.add(0, [5], GenerationConfig(beam_size=2))
    with pytest.raises(GenerationError, match="decode"):
        batch.add(0, [5], GenerationConfig(stop=("x",)))
    assert len(batch) == 0

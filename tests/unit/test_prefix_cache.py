"""Prefix caching: a prompt that starts from the cached keys and values of tokens decoded before gets the tokens and
scores of an uncached forward pass over the whole sequence, in a running batch beside other rows (cached or not) and
in a chat over several turns; the cache keeps within its byte budget, least recently used dropped first, and keeps
nothing that a failed step left half written."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from chat_models import tiny_gqa_chat_bundle
from torch.testing import assert_close

from attn.core.config import Positional
from attn.core.kv_cache import KVCache
from attn.core.presets import preset
from attn.decoding import GenerationConfig, PrefixCache, continuous
from attn.decoding.continuous import RowToken, RunningBatch
from attn.inference.chat import ChatSession
from attn.inference.continuation import continue_texts
from attn.models import Decoder, build_model

# Every row stays within 16 positions: gpt2-tiny's relative buckets end there.
FIRST = [5, 6, 7, 8, 9, 10]
SECOND = [20, 21, 22]


def _lm(**changes: object) -> Decoder:
    torch.manual_seed(0)
    return build_model(preset("gpt2-tiny").replace(dropout=0.0, **changes)).eval()


def _run(batch: RunningBatch, arrivals: list[tuple[int, list[int], int]]) -> list[list[RowToken]]:
    """Adds each (arrival step, prompt, max_new_tokens) at its step and steps until every row is done."""
    found: list[list[RowToken]] = [[] for _ in arrivals]
    clock = 0
    while clock <= max(a[0] for a in arrivals) or len(batch):
        for key, (arrival, prompt, limit) in enumerate(arrivals):
            if arrival == clock:
                batch.add(key, prompt, GenerationConfig(max_new_tokens=limit))
        for step in batch.step() if len(batch) else []:
            found[step.key].append(step)
        clock += 1
    return found


def _check_uncached(model: Decoder, arrivals: list[tuple[int, list[int], int]], found: list[list[RowToken]]) -> None:
    """Each row's tokens are the greedy argmax of, and its scores equal to, a forward pass over prompt + tokens."""
    for (_, prompt, _), steps in zip(arrivals, found, strict=True):
        tokens = [step.token for step in steps]
        with torch.no_grad():
            reference = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1 : -1]
        assert_close(torch.stack([step.scores for step in steps]), reference, atol=1e-5, rtol=1e-5)
        assert tokens == reference.argmax(-1).tolist()


@pytest.fixture
def reused(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every cached prefix a running batch starts a row from, in order."""
    lengths: list[int] = []
    start = continuous.start_from_prefix

    def spy(model, prompt, prefix, max_length):
        lengths.append(prefix.length)
        return start(model, prompt, prefix, max_length)

    monkeypatch.setattr(continuous, "start_from_prefix", spy)
    return lengths


@pytest.mark.parametrize("changes", [{}, {"positional": Positional.ROTARY}, {"positional": Positional.RELATIVE},
                                     {"positional": Positional.ROTARY, "sliding_window": 4}],
                         ids=["learned", "rotary", "relative", "sliding-window"])
def test_rows_started_from_cached_prefixes_score_as_a_whole_prefill(changes: dict, reused: list[int]) -> None:
    model = _lm(**changes)
    batch = RunningBatch(model, eos_id=None, prefix_cache=PrefixCache())
    first = _run(batch, [(0, FIRST, 4), (0, SECOND, 3)])
    answered = FIRST + [step.token for step in first[0]]
    cached = answered[:-1]  # the last new token is never fed
    arrivals = [
        (0, [30, 31, 32, 33], 12),  # no cached start; running while the others join
        (1, answered + [40, 41], 4),  # the next turn: the prompt, its answer, more
        (1, FIRST[:5], 4),  # shorter than a cached sequence
        (1, cached, 4),  # a cached sequence exactly
        (1, [50, 51], 3),  # no cached start, joining with rows that have one
        (3, SECOND + [60], 2),  # a cached prompt without its answer
    ]
    assert reused == []
    _check_uncached(model, arrivals, _run(batch, arrivals))
    assert reused == [len(cached), 4, len(cached) - 1, len(SECOND)]


def test_a_tiny_budget_evicts_and_every_row_still_scores_as_a_whole_prefill(reused: list[int]) -> None:
    model = _lm(positional=Positional.ROTARY)
    per_token = 8 + 2 * model.new_cache(1, 1).keys[:, 0, :, 0].numel() * 4  # an int64 id, float32 keys and values
    prefixes = PrefixCache(max_bytes=10 * per_token)
    batch = RunningBatch(model, eos_id=None, prefix_cache=prefixes)
    first = _run(batch, [(0, FIRST, 5)])  # 10 tokens kept
    answered = FIRST + [step.token for step in first[0]]
    _run(batch, [(0, SECOND, 4)])  # 6 tokens kept: the first sequence leaves
    assert len(prefixes) == 1 and prefixes.nbytes == 6 * per_token
    arrivals = [(0, answered + [40], 3), (0, SECOND + [61, 62], 3)]
    _check_uncached(model, arrivals, _run(batch, arrivals))
    assert reused == [len(SECOND)]


def _kv(rows: list[list[int]]) -> KVCache:
    """A 2-layer, 1-head cache of left-padded rows; a token's key is its id (its value, minus it) in every
    layer and every one of 3 channels."""
    longest = max(map(len, rows))
    cache = KVCache(2, len(rows), 1, longest, 3)
    ids = torch.tensor([[0] * (longest - len(r)) + r for r in rows], dtype=torch.float32)
    mask = torch.tensor([[False] * (longest - len(r)) + [True] * len(r) for r in rows])
    cache.extend((mask.long().cumsum(-1) - 1).clamp(min=0), mask)
    for slot in cache.slots:
        slot.update(ids[:, None, :, None].expand(-1, 1, -1, 3), -ids[:, None, :, None].expand(-1, 1, -1, 3))
    return cache


BYTES_PER_TOKEN = 8 + 2 * 2 * 3 * 4  # its id (int64), its key and value (2 layers x 3 float32 channels)


def test_a_row_keeps_its_real_tokens_and_a_prompt_gets_its_longest_cached_start() -> None:
    prefixes = PrefixCache(max_bytes=1000)
    prefixes.keep(_kv([[1, 2], [3, 4, 5, 6]]), 0, [1, 2, 9])  # left-padded row: 2 real columns, 2 tokens
    assert (len(prefixes), prefixes.nbytes) == (1, 2 * BYTES_PER_TOKEN)
    prefixes.keep(_kv([[1, 2], [3, 4, 5, 6]]), 1, [3, 4, 5, 6])
    found = prefixes.longest_prefix([3, 4, 5, 7, 8])
    assert found.length == 3 and found.keys[:, 0, :, 0].tolist() == [[3, 4, 5]] * 2
    assert found.values[1, 0, :, 2].tolist() == [-3, -4, -5]
    assert prefixes.longest_prefix([3, 4, 5, 6]).length == 3  # the last token is fed, to score the next one
    assert prefixes.longest_prefix([1, 2, 3]).length == 2
    assert prefixes.longest_prefix([3]) is None and prefixes.longest_prefix([2, 1]) is None


def test_the_budget_drops_the_least_recently_used_and_keeps_no_sequence_twice() -> None:
    prefixes = PrefixCache(max_bytes=10 * BYTES_PER_TOKEN)
    for tokens in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        prefixes.keep(_kv([tokens]), 0, tokens)
    prefixes.longest_prefix([1, 2, 3, 4])  # used: [4, 5, 6] is now the least recent
    prefixes.keep(_kv([[11, 12]]), 0, [11, 12])  # 11 tokens: [4, 5, 6] leaves
    assert (len(prefixes), prefixes.nbytes) == (3, 8 * BYTES_PER_TOKEN)
    assert prefixes.longest_prefix([4, 5, 6]) is None and prefixes.longest_prefix([7, 8, 9]).length == 2
    prefixes.keep(_kv([[1, 2, 3, 10]]), 0, [1, 2, 3, 10])  # extends [1, 2, 3], which it replaces
    assert (len(prefixes), prefixes.nbytes) == (3, 9 * BYTES_PER_TOKEN)
    prefixes.keep(_kv([[1, 2]]), 0, [1, 2])  # inside a kept sequence: nothing more kept
    assert (len(prefixes), prefixes.nbytes) == (3, 9 * BYTES_PER_TOKEN)
    prefixes.keep(_kv([list(range(20, 31))]), 0, list(range(20, 31)))  # larger than the whole budget
    assert prefixes.longest_prefix([20, 21, 22]) is None and prefixes.nbytes == 9 * BYTES_PER_TOKEN


def test_a_step_cut_short_leaves_nothing_half_written_in_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _lm()
    prefixes = PrefixCache()
    batch = RunningBatch(model, eos_id=None, prefix_cache=prefixes)
    batch.add(0, FIRST, GenerationConfig(max_new_tokens=5))
    batch.step()

    def broken(tokens, cache, mask=None, last_only=False):
        cache.extend(cache.next_positions(), torch.ones_like(tokens, dtype=torch.bool))  # opened, never written
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "decode_step", broken)
    with pytest.raises(KeyboardInterrupt):
        batch.step()
    batch.close()
    assert len(prefixes) == 0
    monkeypatch.undo()
    _run(batch, [(0, SECOND, 2)])  # the batch emptied: what joins next is kept again
    assert len(prefixes) == 1


def _fed(model: Decoder) -> list[int]:
    """The number of tokens of every forward pass of `model` (its embeddings' inputs), as they happen."""
    counts: list[int] = []
    model.embeddings.register_forward_hook(lambda module, inputs, output: counts.append(inputs[0].numel()))
    return counts


TURNS = ["Hello! How are you today?", "Tell me a joke about cats.", "What is the capital of France?"]
# A template that writes an earlier answer as "(answered)": the next prompt shares only the tokens before it.
REWRITING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}(answered){% else %}"
             "{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [None, REWRITING], ids=["smollm2", "rewriting"])
def test_a_chat_reuses_its_cache_across_turns_and_answers_as_the_library(template: str | None) -> None:
    bundle = tiny_gqa_chat_bundle()
    bundle = bundle if template is None else dataclasses.replace(bundle, chat_template=template)
    config = GenerationConfig(max_new_tokens=12)
    session = ChatSession(bundle, config)
    fed = _fed(bundle.model)
    for text in TURNS:
        before = len(fed)
        answer = "".join(session.reply(text))
        prompt = bundle.render_chat(session.messages[:-1])
        library = continue_texts(bundle, [prompt], bundle.generation_config(config, chat=True))[0][0].text
        assert answer == library
        whole = len(bundle.tokenizer.encode(prompt))
        first_prefill = fed[before]
        assert first_prefill == whole if text == TURNS[0] else first_prefill < whole

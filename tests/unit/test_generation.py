"""Greedy, sampled and streamed decoding: equal to an uncached reference loop, batch-invariant under
left padding, with the logits processors, stopping rules and length checks checked by number."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attn.core.config import Positional
from attn.decoding import (
    GenerationConfig,
    ban_repeated_ngrams,
    choose_tokens,
    decode_rows,
    generate,
    generate_seq2seq,
    keep_top_k,
    keep_top_p,
    penalize_repeats,
    start_decoder,
    stream,
)
from attn.decoding.beam_search import beam_search
from attn.decoding.continuous import RunningBatch
from attn.decoding.text import StopStrings
from attn.decoding.sampling import tempered
from attn.core.errors import GenerationError
from attn.models import Decoder, EncoderDecoder, build_model
from attn.core.presets import preset

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16]]
SOURCES = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17], [18]]
START, EOS, PAD = 1, 2, 0


def _lm(positional: Positional = Positional.LEARNED) -> Decoder:
    torch.manual_seed(0)
    return build_model(preset("gpt2-tiny").replace(positional=positional, dropout=0.0)).eval()


@pytest.fixture(scope="module")
def lm() -> Decoder:
    return _lm()


@pytest.fixture(scope="module")
def seq2seq() -> EncoderDecoder:
    torch.manual_seed(1)
    return build_model(preset("paper-base-tiny").replace(dropout=0.0)).eval()


def _reference_greedy(model: Decoder, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding the slow way: the whole sequence through `forward` at every step, with autograd on
    (so the output projection multiplies by its weight with F.linear, not by the copy decoding uses)."""
    tokens = list(prompt)
    with torch.enable_grad():
        for _ in range(steps):
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt) :]


def _reference_translation(model: EncoderDecoder, source: list[int], steps: int) -> list[int]:
    output = [START]
    with torch.enable_grad():
        for _ in range(steps):
            output.append(int(model(torch.tensor([source]), torch.tensor([output]))[0, -1].argmax()))
    return output[1:]


@pytest.mark.parametrize("positional", [Positional.LEARNED, Positional.ROTARY, Positional.RELATIVE])
def test_batched_greedy_equals_one_at_a_time_and_the_uncached_loop(positional):
    model = _lm(positional)
    config = GenerationConfig(max_new_tokens=10)
    batched = generate(model, PROMPTS, config)
    alone = [generate(model, [prompt], config)[0] for prompt in PROMPTS]
    assert batched == alone
    assert batched == [_reference_greedy(model, prompt, 10) for prompt in PROMPTS]


def test_seq2seq_greedy_equals_the_uncached_loop_and_is_batch_invariant(seq2seq):
    config = GenerationConfig(max_new_tokens=8)
    batched = generate_seq2seq(seq2seq, SOURCES, START, None, PAD, config)
    assert batched == [_reference_translation(seq2seq, source, 8) for source in SOURCES]
    assert batched == [generate_seq2seq(seq2seq, [s], START, None, PAD, config)[0] for s in SOURCES]


def test_eos_ends_each_row_where_it_is_generated(lm):
    free = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=10))
    eos = free[1][4]  # a token that row 1 produces at step 4
    stopped = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=10), eos_id=eos)
    for row, tokens in zip(free, stopped):
        cut = row.index(eos) if eos in row else len(row)
        assert tokens == row[:cut]
    assert len(stopped[1]) <= 4


def test_stop_ids_end_a_row_as_eos_does_in_every_decode(lm):
    free = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=10), eos_id=EOS)
    turn = free[1][4]  # a token that row 1 produces at step 4: a chat model's end of turn
    config = GenerationConfig(max_new_tokens=10, stop_ids=(turn,))
    stopped = generate(lm, PROMPTS, config, eos_id=EOS)
    for row, tokens in zip(free, stopped):
        assert tokens == row[: row.index(turn) if turn in row else len(row)]
    assert list(stream(lm, PROMPTS[1], config, eos_id=EOS)) == stopped[1]
    batch = RunningBatch(lm, eos_id=EOS)
    batch.add("row", PROMPTS[1], config)
    steps = [batch.step()[0] for _ in range(len(stopped[1]) + 1)]
    assert [s.token for s in steps] == [*stopped[1], turn] and steps[-1].finish == "stop" and not len(batch)
    (best,) = beam_search(lm, [PROMPTS[1]], GenerationConfig(max_new_tokens=10, beam_size=2), eos_id=turn)
    (ended,) = beam_search(lm, [PROMPTS[1]], GenerationConfig(max_new_tokens=10, beam_size=2, stop_ids=(turn,)))
    assert ended == best  # a stop id ends a hypothesis as the EOS id does


def test_stop_string_ends_the_row_after_the_token_that_completes_it(lm):
    decode = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)  # noqa: E731
    free = generate(lm, [PROMPTS[1]], GenerationConfig(max_new_tokens=10))[0]
    stop = decode(free[3:5])
    first = decode(free).index(stop)  # may occur before step 3
    stopped = generate(lm, [PROMPTS[1]], GenerationConfig(max_new_tokens=10, stop=(stop,)), decode=decode)[0]
    assert stopped == free[: first + len(stop)]
    with pytest.raises(GenerationError, match="decode function"):
        generate(lm, [PROMPTS[1]], GenerationConfig(stop=("x",)))


def test_a_stop_string_with_tokens_that_render_nothing_inside_is_found(lm):
    free = generate(lm, [PROMPTS[1]], GenerationConfig(max_new_tokens=24))[0]
    assert len(free) == 24 and free[:16] == [92, 92, 92, 92, 69, 92, 92, 69, 69, 92, 92, 92, 92, 92, 92, 42]
    decode = lambda ids: "".join({69: "f", 42: "c"}.get(i, "") for i in ids)  # noqa: E731 - 92 renders nothing
    config = GenerationConfig(max_new_tokens=24, stop=("fc",))  # "f" at step 8, six silent tokens, "c" at 15
    assert generate(lm, [PROMPTS[1]], config, decode=decode)[0] == free[:16]


@pytest.mark.parametrize(("text", "index", "cut", "ready"), [
    ("say END now", 4, "say ", ("say ", True)),
    ("x END y", 2, "x ", ("x ", True)),  # "END" and "D y" both occur: the one that starts first wins
    ("say EN", None, "say EN", ("say ", False)),  # "EN" may start "END": held back
    ("say E", None, "say E", ("say ", False)),
    ("say D ", None, "say D ", ("say ", False)),  # "D " may start "D y"
    ("no stop", None, "no stop", ("no stop", False)),
    ("", None, "", ("", False)),
])
def test_stop_strings_find_cut_and_hold_back_text(text, index, cut, ready):
    stops = StopStrings(("END", "D y"), lambda ids: "")
    assert (stops.index(text), stops.cut(text), stops.ready(text)) == (index, cut, ready)
    assert StopStrings((), lambda ids: "").ready(text) == (text, False)  # no stop strings: all of it, always


def test_stream_yields_the_tokens_of_generate_lazily(lm):
    config = GenerationConfig(max_new_tokens=6)
    tokens = stream(lm, PROMPTS[0], config)
    first = next(tokens)
    assert [first, *tokens] == generate(lm, [PROMPTS[0]], config)[0]
    with pytest.raises(GenerationError, match="cannot stream"):
        stream(lm, PROMPTS[0], GenerationConfig(beam_size=2))


def test_sampling_is_reproducible_with_a_seed(lm):
    config = GenerationConfig(max_new_tokens=12, sample=True, temperature=1.5, seed=7)
    first, again = generate(lm, PROMPTS, config), generate(lm, PROMPTS, config)
    other = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=12, sample=True, temperature=1.5, seed=8))
    assert first == again != other
    assert generate(lm, PROMPTS, GenerationConfig(max_new_tokens=12, sample=True, top_k=1, seed=3)) == generate(
        lm, PROMPTS, GenerationConfig(max_new_tokens=12)
    )


def test_samples_follow_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(20000, 4)
    config = GenerationConfig(sample=True, temperature=2.0)
    drawn = choose_tokens(logits, config, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(drawn, minlength=4).float() / drawn.numel()
    assert_close(frequencies, (logits[0] / 2.0).softmax(-1), atol=0.01, rtol=0)


def test_a_temperature_too_small_for_float32_samples_the_most_likely_token():
    logits = torch.tensor([[-3.0, 2.0, 1.9, float("-inf")], [-5.0, -4.0, -4.5, -6.0]])
    for temperature in (5e-324, 1e-40, 1e-30):
        config = GenerationConfig(sample=True, temperature=temperature)
        assert choose_tokens(logits, config, torch.Generator().manual_seed(0)).tolist() == [1, 1]
    assert_close(tempered(logits, 0.5), logits / 0.5)  # a usual temperature: the scores divided, as before


def test_top_k_and_top_p_keep_the_expected_tokens():
    logits = torch.log(torch.tensor([[0.1, 0.5, 0.15, 0.25]]))
    ninf = float("-inf")
    assert_close(keep_top_k(logits, 2), torch.where(torch.tensor([False, True, False, True]), logits, ninf))
    # Sorted: 0.5, 0.25, 0.15, 0.1. Mass before each: 0, 0.5, 0.75, 0.9. top_p = 0.75 keeps 0.5, 0.25.
    assert_close(keep_top_p(logits, 0.75), torch.where(torch.tensor([False, True, False, True]), logits, ninf))
    assert_close(keep_top_p(logits, 0.76), torch.where(torch.tensor([False, True, True, True]), logits, ninf))
    assert_close(keep_top_p(logits, 1e-6), torch.where(torch.tensor([False, True, False, False]), logits, ninf))
    # 5e-324 is 0 in float32, where "mass before >= p" holds for the most likely token too: it is kept all the same.
    assert_close(keep_top_p(logits, 5e-324), torch.where(torch.tensor([False, True, False, False]), logits, ninf))


def test_repetition_penalty_divides_positive_and_multiplies_negative_scores():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    history = torch.tensor([[-1, 1, 1, 2]])  # left padding (-1) must touch neither token 0 nor token 3
    assert_close(penalize_repeats(logits, history, 2.0), torch.tensor([[2.0, -4.0, 0.5, 0.5]]))


def test_repeated_ngrams_are_banned():
    logits = torch.zeros(1, 9)
    history = torch.tensor([[-1, 5, 6, 7, 5, 6]])

    def banned(n: int) -> list[int]:
        return torch.isinf(ban_repeated_ngrams(logits, history, n)[0]).nonzero().flatten().tolist()

    assert banned(3) == [7]  # "5 6" was followed by 7
    assert banned(2) == [7]  # "6" was followed by 7
    assert banned(1) == [5, 6, 7]
    assert banned(4) == []


def test_no_repeat_ngram_generation_repeats_no_bigram(lm):
    prompt = PROMPTS[1]
    plain = generate(lm, [prompt], GenerationConfig(max_new_tokens=30))[0]
    banned = generate(lm, [prompt], GenerationConfig(max_new_tokens=30, no_repeat_ngram=2))[0]
    bigrams = lambda s: list(zip(s, s[1:]))  # noqa: E731
    assert len(set(bigrams(plain + prompt))) < len(bigrams(plain + prompt))  # the plain model does repeat
    assert len(set(bigrams(prompt + banned))) == len(bigrams(prompt + banned))


def test_suppressed_tokens_and_forced_eos(lm):
    free = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=8))
    common = max(set(sum(free, [])), key=sum(free, []).count)
    suppressed = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=8, suppress=(common,)))
    assert all(common not in row for row in suppressed)
    config = GenerationConfig(max_new_tokens=3, force_eos=True)
    steps = list(decode_rows(start_decoder(lm, PROMPTS, config), config, eos_id=EOS))
    assert steps[-1][1].tolist() == [EOS] * len(PROMPTS)


def test_lengths_are_checked_before_decoding(lm, seq2seq, monkeypatch):
    prompt = list(range(60))  # max_positions 64: the last new token is never fed, so 5 fit
    assert len(generate(lm, [prompt], GenerationConfig(max_new_tokens=5))[0]) == 5
    assert len(generate(lm, [prompt])[0]) == 5  # the default fills the positions
    monkeypatch.setattr(lm, "decode_step", lambda *a, **k: pytest.fail("decoded before checking"))
    with pytest.raises(GenerationError, match="max_new_tokens <= 5"):
        generate(lm, [prompt], GenerationConfig(max_new_tokens=6))
    with pytest.raises(GenerationError, match="max_positions=64"):
        generate_seq2seq(seq2seq, [[5, 6]], START, EOS, PAD, GenerationConfig(max_new_tokens=65))


def test_translation_length_defaults_to_source_plus_50_within_the_positions(seq2seq):
    sources = [[5, 6, 7], [8] * 7, [9] * 20]
    outputs = generate_seq2seq(seq2seq, sources, START, None, PAD)
    assert [len(o) for o in outputs] == [53, 57, 64]  # 20 + 50 is cut to max_positions = 64


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sample": True, "temperature": 0.0}, "temperature: must be > 0 when sampling"),
        ({"sample": True, "top_p": 0.0}, r"top_p: must be in \(0, 1\]"),
        ({"sample": True, "top_p": 1.5}, r"top_p: must be in \(0, 1\]"),
        ({"sample": True, "top_k": -1}, "top_k: must be >= 0"),
        ({"top_k": 5}, "only applies when sampling"),
        ({"beam_size": 0}, "beam_size: must be >= 1"),
        ({"max_new_tokens": 0}, "max_new_tokens: must be >= 1"),
        ({"repetition_penalty": 0.0}, "repetition_penalty: must be > 0"),
        ({"no_repeat_ngram": -1}, "no_repeat_ngram: must be >= 0"),
        ({"beam_size": 2, "n_best": 3}, r"n_best: must be in \[1, beam_size=2\]"),
        ({"beam_size": 2, "length_penalty": 1e300}, r"length_penalty: must be in \[-10, 10\], got 1e\+300"),
        ({"beam_size": 2, "sample": True}, "beam search does not sample"),
        ({"length_norm": "average"}, "length_norm: unknown value 'average'"),
        ({"stop": ("",)}, "stop strings must not be empty"),
        ({"stop_ids": (3, -1)}, r"stop_ids: token ids must be >= 0, got \(3, -1\)"),
    ],
)
def test_invalid_configs_name_the_field_and_the_fix(fields, message):
    with pytest.raises(GenerationError, match=message):
        GenerationConfig(**fields)


def test_config_parses_enum_strings_and_has_the_paper_preset():
    config = GenerationConfig(beam_size=4, length_norm="hf", early_stopping="first")
    assert (config.length_norm.value, config.early_stopping.value) == ("hf", "first")
    paper = GenerationConfig.paper()
    assert (paper.beam_size, paper.length_penalty, paper.length_norm.value) == (4, 0.6, "gnmt")

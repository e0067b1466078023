"""Continuing prompts with a decoder-only model: what `attn generate` and the server's completions call.

`generate_stream` gives a continuation's text as its tokens arrive (`TextStream`: whole characters, nothing
of a stop string); `continue_texts` gives whole continuations. Stop strings are found by
`attn.decoding.text.StopStrings`, the one that ends the decode, so a streamed continuation and a whole one
show the same text. The model's own rules and the default limit
(`DEFAULT_NEW_TOKENS`) come from `Bundle.generation_config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from attn.artifacts import Bundle
from attn.core.errors import GenerationError
from attn.data.grammar_tokens import grammar_matchers
from attn.decoding import (
    GenerationConfig,
    PrefixCache,
    StopStrings,
    check_samples,
    generate,
    stream,
    text_pieces,
)
from attn.decoding.beam_search import beam_search
from attn.inference.inputs import expect_model
from attn.models import Decoder


def generate_stream(bundle: Bundle, prompt: str, config: GenerationConfig, chat: bool = False,
                    prefix_cache: PrefixCache | None = None) -> Iterator[str]:
    """Continues a prompt with the decoder-only model, yielding text pieces as tokens arrive.

    Pieces hold whole characters only, and end before the first of `config.stop` (text that may
    be the start of a stop string is held back until it is known not to be one); together they are
    the continuation's text as `continue_texts` gives it for the same tokens.

    The prompt and `config.grammar` are checked and the prompt prefilled when this is called, so their errors come
    before any text. The model's
    rules apply (`Bundle.generation_config`: its bans, its end of turn with `chat`, and without
    `config.max_new_tokens` at most `DEFAULT_NEW_TOKENS` new tokens). The prompt starts from its longest start
    that `prefix_cache` holds, which then keeps the prompt's and the continuation's keys and values.

    Raises:
        GenerationError: the prompt is too long for the model, or the config asks for more tokens than fit.
    """
    expect_model(bundle, Decoder, "text generation")
    ids = prompt_ids(bundle, prompt)
    config = bundle.generation_config(config, prompt_length=len(ids), chat=chat)
    decode = bundle.tokenizer.decode
    tokens = stream(bundle.model, ids, config, eos_id=bundle.eos_id, decode=decode,
                    matcher=grammar_matchers(bundle.tokenizer), prefix_cache=prefix_cache)
    return text_pieces(tokens, decode, config.stop)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """One continuation of a prompt.

    Attributes:
        text: the new text (no prompt), ending before the first stop string.
        score: the beam-search score (length-normalised log-probability); None unless beam search.
    """

    text: str
    score: float | None = None


def continue_texts(bundle: Bundle, prompts: Sequence[str], config: GenerationConfig, samples: int = 1,
                   batch_size: int = 32, chat: bool = False) -> list[list[Continuation]]:
    """Continues every prompt with the decoder-only model, in left-padded batches of similar prompt length.

    A prompt gets `samples` sampled continuations (`config.sample`), its `config.n_best` best
    beam-search hypotheses (`config.beam_size > 1`, best first), or its greedy continuation. Each
    text is what `generate_stream` would show, under the model's rules (`Bundle.generation_config`).

    Args:
        bundle: a decoder-only model and its tokenizer.
        prompts: the prompts; an empty one starts from the start token.
        config: the decoding settings.
        samples: continuations drawn per prompt (more than one needs sampling).
        batch_size: rows decoded together (a prompt's samples are rows).
        chat: the prompts are conversations written by the chat template: the model's end of turn ends them.

    Returns:
        For every prompt, in input order, its continuations.

    Raises:
        GenerationError: no prompts; `samples` < 1, or > 1 without sampling; a prompt too long for the model.
    """
    expect_model(bundle, Decoder, "text generation")
    check_samples(samples, config)
    if not prompts:
        raise GenerationError("no prompts: give at least one, as an argument or as a non-blank line of the input file")
    ids = [prompt_ids(bundle, prompt) for prompt in prompts]
    rows = [i for i in range(len(ids)) for _ in range(samples)]  # the prompt of each row
    order = sorted(range(len(rows)), key=lambda row: len(ids[rows[row]]))
    found: list[list[Continuation]] = [[] for _ in rows]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = [ids[rows[row]] for row in chunk]
        for row, continuations in zip(chunk, _continue_batch(bundle, batch, config, chat), strict=True):
            found[row] = continuations
    return [[c for row in range(i * samples, (i + 1) * samples) for c in found[row]] for i in range(len(prompts))]


def _continue_batch(bundle: Bundle, prompts: list[list[int]], config: GenerationConfig,
                    chat: bool) -> list[list[Continuation]]:
    config = bundle.generation_config(config, prompt_length=max(map(len, prompts)), chat=chat)
    text = bundle.tokenizer.decode
    if config.beam_size > 1:  # beam search has no stop strings
        found = beam_search(bundle.model, prompts, config, bundle.eos_id)
        return [[Continuation(text(h.tokens), h.score) for h in hs] for hs in found]
    stops = StopStrings(config.stop, text)
    outputs = generate(bundle.model, prompts, config, bundle.eos_id, text, grammar_matchers(bundle.tokenizer))
    return [[Continuation(stops.cut(text(tokens)))] for tokens in outputs]


def prompt_ids(bundle: Bundle, prompt: str) -> list[int]:
    """The prompt's ids; an empty prompt is the start token alone."""
    ids = bundle.tokenizer.encode(prompt) if prompt else []
    if not ids:
        if bundle.start_id is None:
            raise GenerationError("empty prompt and the tokenizer has no start token: give a prompt")
        ids = [bundle.start_id]
    return ids

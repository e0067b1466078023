"""The library's decoding calls: `generate` and `stream` for a decoder-only model, `generate_seq2seq` for an
encoder-decoder, and beam search when `config.beam_size > 1`.

A decoder-only model decodes in a `RunningBatch` (`attn.decoding.continuous`): `generate` adds every prompt at once
and collects the new tokens, `stream` adds one and yields them as they come. An encoder-decoder's sources are
encoded once (`start_seq2seq`) and decoded by `decode_rows`; beam search (`attn.decoding.beam_search`) starts from
the same sessions.

Conventions:
- The lists returned hold the new tokens only: no prompt, no start token, no EOS (nor one of `config.stop_ids`,
  which end a row as EOS does). A stop string ends its row after the token that completes it; that token is kept.
- A row stops at EOS or a stop id, at a stop string, once its grammar is complete (`config.grammar`, its last token
  kept), or after its token limit, and leaves the batch, so the others go on with a smaller one.
- Lengths are checked before anything runs: a prompt and its new tokens but the last, which is never fed back, must
  fit in the model's `max_positions`; without a limit, a batch of prompts gets all the room its longest one leaves.
  Translations default to source length + 50 tokens (section 6.1 of the paper).
- Call `model.eval()` first: in training mode dropout makes every decode random.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from attn.core.errors import GenerationError
from attn.core.linear import in_inference
from attn.decoding.beam_search import beam_search, beam_search_seq2seq
from attn.decoding.continuous import RunningBatch
from attn.decoding.generation_config import Decode, GenerationConfig
from attn.decoding.grammar import MatcherFactory
from attn.decoding.prefix_cache import PrefixCache
from attn.decoding.sampling import adjust_logits, choose_tokens, seeded_generator
from attn.decoding.session import (
    Session,
    check_call,
    check_prompts,
    decode_one_token,
    decoder_limit,
    model_device,
    start_seq2seq,
)
from attn.models import Decoder, EncoderDecoder


def decode_rows(session: Session, config: GenerationConfig, eos_id: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """Greedy or sampled decoding of a session (an encoder-decoder's), one step at a time.

    Yields:
        (rows, tokens), both (R,) long: the session row of each still active row and its new token.
        A row appears for the last time with its EOS or last allowed token.
    """
    generator = seeded_generator(config.seed, session.logits.device)
    rows = torch.arange(session.logits.size(0), device=session.logits.device)
    logits, history, limits = session.logits, session.history, session.limits
    ends = torch.tensor(config.end_ids(eos_id), dtype=torch.long, device=rows.device)
    for step in range(int(limits.max())):
        column = session.offset + step
        logits = adjust_logits(logits, history[:, :column], config, eos_id, limits == step + 1, session.offset)
        tokens = choose_tokens(logits, config, generator)
        history[:, column] = tokens
        yield rows, tokens
        done = (limits == step + 1) | torch.isin(tokens, ends)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                return
            session.cache.reorder(keep, sources=keep)
            rows, tokens, history, limits = rows[keep], tokens[keep], history[keep], limits[keep]
        logits = decode_one_token(session.model, tokens, session.cache)


def generate(
    model: Decoder,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig = GenerationConfig(),
    eos_id: int | None = None,
    decode: Decode | None = None,
    matcher: MatcherFactory | None = None,
) -> list[list[int]]:
    """Continues each prompt with a decoder-only model, all prompts in one batch.

    Greedy or sampled per `config` (one generator, seeded by `config.seed`, draws every row's tokens); with
    `config.beam_size > 1` the best beam-search hypothesis.

    Args:
        model: the language model, in eval mode.
        prompts: B lists of token ids, of any lengths >= 1.
        eos_id: the token that ends a row (None: rows end at their limit or a stop string).
        decode: token ids -> text; needed for `config.stop`.
        matcher: a grammar -> its row's matcher; needed for `config.grammar` (`attn.decoding.grammar`).

    Returns:
        B lists of new token ids (no prompt, no EOS).

    Example (token ids in, token ids out; `attn.inference.continuation.continue_texts` works on text):
        >>> import torch
        >>> from attn import GenerationConfig, build_model, generate, preset
        >>> _ = torch.manual_seed(0)
        >>> model = build_model(preset("char-gpt-tiny")).eval()
        >>> new = generate(model, [[2, 17, 5], [2, 9]], GenerationConfig(max_new_tokens=4))
        >>> [len(row) for row in new]
        [4, 4]
    """
    check_call(config, eos_id, decode)
    if config.beam_size > 1:
        return [hypotheses[0].tokens for hypotheses in beam_search(model, prompts, config, eos_id)]
    check_prompts(model, prompts)
    limit = decoder_limit(config.max_new_tokens, max(map(len, prompts)), model.max_positions)
    config = dataclasses.replace(config, max_new_tokens=limit)
    batch = RunningBatch(model, eos_id, decode, matcher)
    generator = seeded_generator(config.seed, model_device(model))
    for key, prompt in enumerate(prompts):
        batch.add(key, prompt, config, generator)
    outputs: list[list[int]] = [[] for _ in prompts]
    ends = config.end_ids(eos_id)
    with contextlib.closing(batch):
        while len(batch):
            for step in batch.step():
                if step.token not in ends:
                    outputs[step.key].append(step.token)
    return outputs


@in_inference
def generate_seq2seq(
    model: EncoderDecoder,
    sources: Sequence[Sequence[int]],
    start_id: int,
    eos_id: int | None,
    pad_id: int,
    config: GenerationConfig = GenerationConfig(),
) -> list[list[int]]:
    """Translates a batch of sources (right-padded, with their mask) with an encoder-decoder.

    Greedy or sampled per `config`; with `config.beam_size > 1` the best beam-search hypothesis.

    Args:
        model: the encoder-decoder, in eval mode.
        sources: B lists of source token ids.
        start_id: the decoder's first input token (BOS, or Marian's pad).
        eos_id: the token that ends an output (None: outputs end at their limit).

    Returns:
        B lists of output token ids (no start token, no EOS).
    """
    check_call(config, eos_id, None)
    if config.grammar is not None:
        raise GenerationError("an encoder-decoder does not follow a grammar; leave it unset", "grammar")
    if config.beam_size > 1:
        found = beam_search_seq2seq(model, sources, start_id, eos_id, pad_id, config)
        return [hypotheses[0].tokens for hypotheses in found]
    session = start_seq2seq(model, sources, start_id, pad_id, config)
    outputs: list[list[int]] = [[] for _ in sources]
    ends = config.end_ids(eos_id)
    for rows, tokens in decode_rows(session, config, eos_id):
        for row, token in zip(rows.tolist(), tokens.tolist(), strict=True):
            if token not in ends:
                outputs[row].append(token)
    return outputs


def stream(
    model: Decoder,
    prompt: Sequence[int],
    config: GenerationConfig = GenerationConfig(),
    eos_id: int | None = None,
    decode: Decode | None = None,
    matcher: MatcherFactory | None = None,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[int]:
    """Continues one prompt, yielding each new token id as soon as it is chosen (EOS and stop ids are not yielded).

    The prompt is prefilled (and every argument checked) when `stream` is called; tokens are
    decoded as the iterator is consumed. `eos_id`, `decode` and `matcher` are as in `generate`; the prompt starts
    from the keys and values of its longest start in `prefix_cache`, which keeps those of the prompt and its new
    tokens once the iterator ends or is closed.
    """
    if config.beam_size > 1:
        raise GenerationError("beam search cannot stream: its best hypothesis is known only at the end; "
                              "set beam_size=1")
    batch = RunningBatch(model, eos_id, decode, matcher, prefix_cache=prefix_cache)
    batch.add(0, prompt, config)
    batch.prefill()
    return _stream_tokens(batch, config.end_ids(eos_id))


def _stream_tokens(batch: RunningBatch, ends: tuple[int, ...]) -> Iterator[int]:
    with contextlib.closing(batch):  # a stream left part way frees its rows and packed weights
        while len(batch):
            for step in batch.step():
                if step.token not in ends:
                    yield step.token

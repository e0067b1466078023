"""Decoding with the KV cache: greedy, sampled and streamed generation, as small free functions.

A decode starts from a `Session`. `start_decoder` left-pads the prompts and prefills a `KVCache`
with all of them in one `decode_step` (the model numbers each row's positions from its mask, so a
padded row decodes as if alone); `start_seq2seq` encodes the right-padded sources once (`new_cache`
computes every layer's cross-attention keys and values) and feeds the start token. Each later step
feeds one token per row (`decode_one_token`); no prefix is ever recomputed. Before a token is
chosen, `adjust_logits` applies the repetition penalty, the n-gram ban, the suppressed tokens and
the forced final EOS; `choose_tokens` then takes the argmax or samples (temperature, top-k,
top-p). Beam search (`attn.decoding.beam_search`) starts from the same sessions.

Conventions:
- The lists returned hold the new tokens only: no prompt, no start token, no EOS (nor one of
  `config.stop_ids`, which end a row as EOS does). A stop string ends its row after the token that
  completes it; that token is kept.
- A row stops at EOS or a stop id, at a stop string, or after its own token limit. Finished rows leave the
  batch (`KVCache.reorder`), so the others go on with a smaller one.
- Lengths are checked before anything runs. A decoder-only cache holds the longest (left-padded)
  prompt and the new tokens but the last, which is never fed back; that must fit in the model's
  `max_positions`. Translations default to source length + 50 tokens (section 6.1 of the paper).
- Call `model.eval()` first: in training mode dropout makes every decode random.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from attn.decoding.beam_search import beam_search, beam_search_seq2seq
from attn.decoding.generation_config import Decode, GenerationConfig
from attn.decoding.sampling import adjust_logits, choose_tokens, seeded_generator
from attn.decoding.session import (
    Session,
    decode_one_token,
    start_decoder,
    start_seq2seq,
)
from attn.core.errors import GenerationError
from attn.core.linear import packed_weights, with_packed_weights
from attn.models import Decoder, EncoderDecoder


class StopStrings:
    """A row's stop strings: whether its newest token completes one (decoding only its last tokens),
    and how much of its text may be shown (`cut`, `ready`). Generation, streamed text and the
    server all stop through it.

    A stop string of b UTF-8 bytes spans at most b tokens that render text (a byte-level tokenizer
    splits a character over up to 4) and any tokens between them that render nothing (special
    tokens, which decoding skips); 4 more tokens give the decoders that render a token by its
    neighbours (a metaspace, a joined word piece) their context.

    Example:
        >>> stops = StopStrings(("fc",), lambda ids: "".join(chr(i) for i in ids if i < 128))
        >>> stops.completed([ord("f"), *[500] * 9, ord("c")])  # nine ids that render nothing between
        True
        >>> stops.cut("abfcd"), stops.ready("abf"), stops.ready("abfcd")  # "f" may start "fc": held back
        ('ab', ('ab', False), ('ab', True))
    """

    def __init__(self, stop: Sequence[str], decode: Decode) -> None:
        self.stop, self.decode = tuple(stop), decode
        self.window = max((len(s.encode("utf-8")) for s in self.stop), default=0) + 4
        self._renders = functools.cache(lambda token: decode([token]) != "")

    def completed(self, tokens: Sequence[int], first: int = 0) -> bool:
        """Whether `tokens[first:]` (a row's new tokens, oldest first) hold a stop string."""
        start, need = len(tokens), self.window
        while start > first and need > 0:
            start -= 1
            need -= self._renders(tokens[start])
        return self.index(self.decode(list(tokens[start:]))) is not None

    def index(self, text: str) -> int | None:
        """Where the first of the stop strings found in `text` starts, or None."""
        return min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=None)

    def cut(self, text: str) -> str:
        """The text before its first stop string: what a finished continuation shows."""
        end = self.index(text)
        return text if end is None else text[:end]

    def ready(self, text: str) -> tuple[str, bool]:
        """What may be shown of `text`, the unshown end of a stream that may still grow, and whether a
        stop string ended it: the text before the first stop string, else all but its longest end
        that is the start of a stop string (shown, or dropped, once the next text tells which)."""
        end = self.index(text)
        if end is not None:
            return text[:end], True
        keep = max((n for s in self.stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        return text[: len(text) - keep], False


def decode_rows(
    session: Session, config: GenerationConfig, eos_id: int | None, decode: Decode | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Greedy or sampled decoding of a session, one step at a time.

    Yields:
        (rows, tokens), both (R,) long: the session row of each still active row and its new token.
        A row appears for the last time with its EOS, stop-string or last allowed token.
    """
    generator = seeded_generator(config.seed, session.logits.device)
    rows = torch.arange(session.logits.size(0), device=session.logits.device)
    logits, history, limits = session.logits, session.history, session.limits
    ends = torch.tensor(config.end_ids(eos_id), dtype=torch.long, device=rows.device)
    stops = StopStrings(config.stop, decode) if config.stop and decode is not None else None
    new: list[list[int]] = [[] for _ in range(logits.size(0))] if stops is not None else []  # rows' new tokens
    for step in range(int(limits.max())):
        column = session.offset + step
        logits = adjust_logits(logits, history[:, :column], config, eos_id, limits == step + 1)
        tokens = choose_tokens(logits, config, generator)
        history[:, column] = tokens
        yield rows, tokens
        done = (limits == step + 1) | torch.isin(tokens, ends)
        if stops is not None:
            for row, token in zip(new, tokens.tolist(), strict=True):
                row.append(token)
            done |= torch.tensor([stops.completed(row) for row in new], device=done.device)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                return
            session.cache.reorder(keep, sources=keep)
            rows, tokens, history, limits = rows[keep], tokens[keep], history[keep], limits[keep]
            new = [new[i] for i in keep.tolist()] if stops is not None else []
        logits = decode_one_token(session.model, tokens, session.cache)


def check_call(config: GenerationConfig, eos_id: int | None, decode: Decode | None) -> None:
    """Raises a GenerationError when `config` needs what the call did not give (a decode function, an EOS id)."""
    if config.stop and decode is None:
        raise GenerationError("stop strings need the tokenizer's decode function: pass decode=tokenizer.decode")
    if config.force_eos and eos_id is None:
        raise GenerationError("force_eos needs eos_id: pass the tokenizer's end-of-sequence id")


def _collect(steps: Iterator[tuple[Tensor, Tensor]], batch: int, ends: tuple[int, ...]) -> list[list[int]]:
    outputs: list[list[int]] = [[] for _ in range(batch)]
    for rows, tokens in steps:
        for row, token in zip(rows.tolist(), tokens.tolist()):
            if token not in ends:
                outputs[row].append(token)
    return outputs


@torch.inference_mode()
@with_packed_weights
def generate(
    model: Decoder,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig = GenerationConfig(),
    eos_id: int | None = None,
    decode: Decode | None = None,
) -> list[list[int]]:
    """Continues each prompt with a decoder-only model, all prompts in one left-padded batch.

    Greedy or sampled per `config`; with `config.beam_size > 1` the best beam-search hypothesis.

    Args:
        model: the language model, in eval mode.
        prompts: B lists of token ids, of any lengths >= 1.
        config: the decoding settings.
        eos_id: the token that ends a row (None: rows end at their limit or a stop string).
        decode: token ids -> text; needed for `config.stop`.

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
    session = start_decoder(model, prompts, config)
    return _collect(decode_rows(session, config, eos_id, decode), len(prompts), config.end_ids(eos_id))


@torch.inference_mode()
@with_packed_weights
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
    Each output has at most source length + 50 tokens unless `config.max_new_tokens` says otherwise.

    Args:
        model: the encoder-decoder, in eval mode.
        sources: B lists of source token ids.
        start_id: the decoder's first input token (BOS, or Marian's pad).
        eos_id: the token that ends an output (None: outputs end at their limit).
        pad_id: the source padding id.
        config: the decoding settings.

    Returns:
        B lists of output token ids (no start token, no EOS).
    """
    check_call(config, eos_id, None)
    if config.beam_size > 1:

        found = beam_search_seq2seq(model, sources, start_id, eos_id, pad_id, config)
        return [hypotheses[0].tokens for hypotheses in found]
    session = start_seq2seq(model, sources, start_id, pad_id, config)
    return _collect(decode_rows(session, config, eos_id), len(sources), config.end_ids(eos_id))


def stream(
    model: Decoder,
    prompt: Sequence[int],
    config: GenerationConfig = GenerationConfig(),
    eos_id: int | None = None,
    decode: Decode | None = None,
) -> Iterator[int]:
    """Continues one prompt, yielding each new token id as soon as it is chosen (EOS and stop ids are not yielded).

    The prompt is prefilled (and every argument checked) when `stream` is called; tokens are
    decoded as the iterator is consumed.
    """
    check_call(config, eos_id, decode)
    if config.beam_size > 1:
        raise GenerationError("beam search cannot stream: its best hypothesis is known only at the end; "
                              "set beam_size=1")
    with torch.inference_mode():
        session = start_decoder(model, [prompt], config)
    return _stream_tokens(session, config, eos_id, decode)


@torch.inference_mode()
def _stream_tokens(
    session: Session, config: GenerationConfig, eos_id: int | None, decode: Decode | None
) -> Iterator[int]:
    ends = config.end_ids(eos_id)
    with packed_weights(session.model):
        for _, tokens in decode_rows(session, config, eos_id, decode):
            token = int(tokens[0])
            if token not in ends:
                yield token

"""Continuing prompts with a decoder-only model: what `attn generate` and the server's completions call.

`generate_stream` and `CompletionText` give a continuation's text as its tokens arrive (`TextStream`:
whole characters, nothing of a stop string); `continue_texts` gives whole continuations. Stop strings
are found by `attn.decoding.generation.StopStrings`, the one that ends the decode, so a streamed
continuation and a whole one show the same text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence

from torch import Tensor

from attn.inference.inputs import expect_model
from attn.artifacts import Bundle
from attn.decoding import Decode, GenerationConfig, generate, stream
from attn.decoding.beam_search import beam_search
from attn.decoding.generation import StopStrings
from attn.core.errors import GenerationError
from attn.models import Decoder

DEFAULT_NEW_TOKENS = 200  # what `generate_stream` and `continue_texts` write when the config sets no limit
# The last tokens a stream decodes again with each new one: a UTF-8 character has at most 4 bytes and a
# token at least one, so a character still arriving lies inside them (see `TextStream`).
_WINDOW = 4


def generate_stream(loaded: Bundle, prompt: str, config: GenerationConfig) -> Iterator[str]:
    """Continues a prompt with the decoder-only model, yielding text pieces as tokens arrive.

    Pieces hold whole characters only, and end before the first of `config.stop` (text that may
    be the start of a stop string is held back until it is known not to be one); together they are
    the continuation's text as `continue_texts` gives it for the same tokens.

    The prompt is checked and prefilled when this is called, so its errors come before any text.
    Without `config.max_new_tokens`, at most `DEFAULT_NEW_TOKENS` tokens are written, fewer when the
    model's positions run out first.

    Raises:
        GenerationError: the prompt is too long for the model, or the config asks for more tokens than fit.
    """
    expect_model(loaded, Decoder, "text generation")
    ids = prompt_ids(loaded, prompt)
    decode = loaded.tokenizer.decode
    tokens = stream(loaded.model, ids, default_limit(config, loaded, len(ids)), eos_id=loaded.eos_id, decode=decode)
    return text_pieces(tokens, decode, config.stop)


@dataclasses.dataclass(frozen=True)
class GeneratedToken:
    """One new token of a continuation, with its text and log-probabilities (see `CompletionText`).

    Attributes:
        id: the token id (the final EOS or stop id too).
        text: the text that arrives with this token; "" while text is held back (a character not
            yet complete, or what may be the start of a stop string: it comes with a later token).
        logprob: the token's log-probability under the scores it was chosen from.
        top: the most likely tokens of this step as (id, log-probability), best first.
        finish: None, except on the last token: "stop" (EOS, a stop id or a stop string) or "length" (the limit).
    """

    id: int
    text: str
    logprob: float
    top: list[tuple[int, float]]
    finish: str | None = None


class CompletionText:
    """A continuation's tokens, pushed one at a time as a decoder chooses them, as `GeneratedToken`s.

    The texts of all tokens add up to what `generate_stream` shows for the same tokens (whole
    characters, nothing from the first stop string on). Log-probabilities are the log-softmax of
    the scores the token was chosen from (after the logit adjustments, before temperature, top-k
    and top-p), so sampling settings do not change them.

    Args:
        loaded: the decoder-only model's bundle (its tokenizer and EOS id).
        config: the continuation's decoding settings: its stop strings, and its stop ids, which end it as the
            EOS id does and show no text.
        top_logprobs: how many of each step's most likely tokens `GeneratedToken.top` holds.

    Example:
        >>> import torch
        >>> from attn import Bundle, GenerationConfig, Tokenizer, build_model, preset
        >>> tokenizer = Tokenizer.train_chars(["hello"])
        >>> config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size)
        >>> bundle = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="lm", model_config=config,
        ...                 path=".", eos_id=tokenizer.eos_id)
        >>> text = CompletionText(bundle, GenerationConfig(stop=("lo",)), top_logprobs=1)
        >>> scores = torch.zeros(tokenizer.vocab_size)
        >>> [text.push(tokenizer.token_to_id(c), scores, None).text for c in "hel"]
        ['h', 'e', '']
        >>> token = text.push(tokenizer.token_to_id("o"), scores, "stop")  # uniform scores: log(1 / V)
        >>> token.text, token.finish, round(token.logprob * -1 - torch.tensor(tokenizer.vocab_size).log().item(), 5)
        ('', 'stop', 0.0)
    """

    def __init__(self, loaded: Bundle, config: GenerationConfig, top_logprobs: int = 0) -> None:
        self._text = TextStream(loaded.tokenizer.decode, config.stop)
        self._ends = config.end_ids(loaded.eos_id)
        self._top = top_logprobs

    def push(self, token: int, scores: Tensor, finish: str | None) -> GeneratedToken:
        """The next token, from its (V,) scores; `finish` is set on the continuation's last token."""
        text = self._text.push(token) if token not in self._ends else ""
        if finish is not None:
            text += self._text.finish()
        logprobs = scores.float().log_softmax(-1)
        values, ids = logprobs.topk(min(self._top, logprobs.numel()))
        top = [(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if v > -math.inf]
        return GeneratedToken(token, text, float(logprobs[token]), top, finish)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """One continuation of a prompt.

    Attributes:
        text: the new text (no prompt), ending before the first stop string.
        score: the beam-search score (length-normalised log-probability); None unless beam search.
    """

    text: str
    score: float | None = None


def continue_texts(loaded: Bundle, prompts: Sequence[str], config: GenerationConfig, samples: int = 1,
                   batch_size: int = 32) -> list[list[Continuation]]:
    """Continues every prompt with the decoder-only model, in left-padded batches of similar prompt length.

    A prompt gets `samples` sampled continuations (`config.sample`), its `config.n_best` best
    beam-search hypotheses (`config.beam_size > 1`, best first), or its greedy continuation. Each
    text is what `generate_stream` would show. Without `config.max_new_tokens` a batch writes at
    most `DEFAULT_NEW_TOKENS` tokens, fewer when its longest prompt leaves less room.

    Args:
        loaded: a decoder-only model and its tokenizer.
        prompts: the prompts; an empty one starts from the start token.
        config: the decoding settings.
        samples: continuations drawn per prompt (more than one needs sampling).
        batch_size: rows decoded together (a prompt's samples are rows).

    Returns:
        For every prompt, in input order, its continuations.

    Raises:
        GenerationError: no prompts; `samples` < 1, or > 1 without sampling; a prompt too long for the model.
    """
    expect_model(loaded, Decoder, "text generation")
    check_samples(samples, config)
    if not prompts:
        raise GenerationError("no prompts: give at least one, as an argument or as a non-blank line of the input file")
    ids = [prompt_ids(loaded, prompt) for prompt in prompts]
    rows = [i for i in range(len(ids)) for _ in range(samples)]  # the prompt of each row
    order = sorted(range(len(rows)), key=lambda row: len(ids[rows[row]]))
    found: list[list[Continuation]] = [[] for _ in rows]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = [ids[rows[row]] for row in chunk]
        for row, continuations in zip(chunk, _continue_batch(loaded, batch, config), strict=True):
            found[row] = continuations
    return [[c for row in range(i * samples, (i + 1) * samples) for c in found[row]] for i in range(len(prompts))]


def check_samples(samples: int, config: GenerationConfig) -> None:
    """Raises a GenerationError unless `samples` continuations per prompt can be drawn under `config`."""
    if samples < 1:
        raise GenerationError(f"must be >= 1, got {samples}", "samples")
    if samples > 1 and not config.sample:
        raise GenerationError(f"greedy decoding and beam search give one continuation per prompt; sample to draw "
                              f"{samples}, or ask beam search for its n best", "samples")


def _continue_batch(loaded: Bundle, prompts: list[list[int]], config: GenerationConfig) -> list[list[Continuation]]:
    config = default_limit(config, loaded, max(map(len, prompts)))
    text = loaded.tokenizer.decode
    if config.beam_size > 1:  # beam search has no stop strings
        found = beam_search(loaded.model, prompts, config, loaded.eos_id)
        return [[Continuation(text(h.tokens), h.score) for h in hs] for hs in found]
    stops = StopStrings(config.stop, text)
    outputs = generate(loaded.model, prompts, config, loaded.eos_id, text)
    return [[Continuation(stops.cut(text(tokens)))] for tokens in outputs]


def prompt_ids(loaded: Bundle, prompt: str) -> list[int]:
    """The prompt's ids; an empty prompt is the start token alone."""
    ids = loaded.tokenizer.encode(prompt) if prompt else []
    if not ids:
        if loaded.start_id is None:
            raise GenerationError("empty prompt and the tokenizer has no start token: give a prompt")
        ids = [loaded.start_id]
    return ids


def default_limit(config: GenerationConfig, loaded: Bundle, longest: int) -> GenerationConfig:
    """`config` with `DEFAULT_NEW_TOKENS` as its limit when it sets none, fewer when the positions run out."""
    if config.max_new_tokens is not None:
        return config
    room = loaded.model.max_positions - longest + 1  # as in generation: the last token is never fed back
    return dataclasses.replace(config, max_new_tokens=max(1, min(DEFAULT_NEW_TOKENS, room)))


def text_pieces(tokens: Iterable[int], decode: Decode, stop: Sequence[str] = ()) -> Iterator[str]:
    """The text of a token stream in pieces, as the tokens arrive; the pieces add up to
    `StopStrings(stop, decode).cut(decode(all tokens))`. No token after the one that completes a stop
    string is read."""
    text = TextStream(decode, stop)
    for token in tokens:
        piece = text.push(token)
        if piece:
            yield piece
        if text.stopped:
            return
    rest = text.finish()
    if rest:
        yield rest


class TextStream:
    """The text of a token stream, pushed one token at a time: what `attn generate` prints and a server
    streams to its clients.

    `push` returns the new text of each token, in complete characters, decoding a window of the last
    `_WINDOW` tokens only. A byte-level tokenizer (GPT-2, byte-bpe) decodes a character split across
    tokens as U+FFFD until its last byte arrives, so a final U+FFFD is held back until the next token;
    the earlier tokens of the window give decoders that join tokens (a metaspace or a space between
    words) the context to render the newest one as the whole text does. What of the new text may be
    shown is `StopStrings.ready`'s call: text that may be the start of a stop string is held back until
    it is known not to be one; at the first stop string, `stopped` turns True and nothing more is
    shown. The pieces of all `push` calls and `finish` add up to `StopStrings.cut(decode(all tokens))`.

    Example:
        >>> text = TextStream(lambda ids: "".join(chr(i) for i in ids), stop=["!?"])
        >>> [text.push(ord(c)) for c in "hi!"], text.push(ord("?")), text.stopped
        (['h', 'i', ''], '', True)
    """

    def __init__(self, decode: Decode, stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = StopStrings(stop, decode)
        self._window: list[int] = []
        self._shown = ""  # the part of decode(window) already passed on
        self._held = ""  # text passed on by the window but not yet shown (see `StopStrings.ready`)
        self.stopped = False

    def push(self, token: int) -> str:
        """The text that `token` makes ready to show ('' when all of it is held back or the stream stopped)."""
        if self.stopped:
            return ""
        self._window.append(token)
        ready = _finished(self._decode(self._window))
        piece = ready[len(self._shown):]
        self._shown = ready
        if len(self._window) > _WINDOW:
            self._window = self._window[-_WINDOW:]
            self._shown = _finished(self._decode(self._window))  # all of it was shown but a held-back last character
        return self._ready(piece)

    def finish(self) -> str:
        """What is left to show when the stream ends: a held-back character or possible start of a stop string."""
        if self.stopped:
            return ""
        piece = self._ready(self._decode(self._window)[len(self._shown):])
        if self.stopped:
            return piece
        piece, self._held = piece + self._held, ""
        return piece

    def _ready(self, piece: str) -> str:
        """What may be shown now that `piece` has arrived after the held text."""
        if not piece:
            return ""
        shown, self.stopped = self._stops.ready(self._held + piece)
        self._held = (self._held + piece)[len(shown):]
        return shown


def _finished(text: str) -> str:
    """The text without a final U+FFFD, which may be the start of a character still to come."""
    return text[:-1] if text.endswith("\ufffd") else text

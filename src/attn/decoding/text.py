"""A decode's text: where its stop strings end it, and its text streamed as the tokens arrive.

`StopStrings` says whether a row's newest token completes a stop string (every decoding loop stops through
it) and how much of a text may be shown; `TextStream` turns tokens into whole characters as they arrive,
holding back what may be the start of a stop string, so a streamed continuation and a whole one show the
same text. `CompletionText` gives each token of a continuation with its text and log-probabilities, as the
server streams them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Iterator, Sequence

from torch import Tensor

from attn.decoding.generation_config import Decode, GenerationConfig

# The last tokens a stream decodes again with each new one: a UTF-8 character has at most 4 bytes and a
# token at least one, so a character still arriving lies inside them (see `TextStream`).
_WINDOW = 4


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


@dataclasses.dataclass(frozen=True)
class GeneratedToken:
    """One new token of a continuation, with its text and log-probabilities (see `CompletionText`).

    Attributes:
        id: the token id (the final EOS or stop id too).
        text: the text that arrives with this token; "" while text is held back (a character not
            yet complete, or what may be the start of a stop string: it comes with a later token).
        logprob: the token's log-probability under the scores it was chosen from.
        top: the most likely tokens of this step as (id, log-probability), best first.
        finish: None, except on the last token: "stop" (EOS, a stop id, a stop string or a completed grammar) or
            "length" (the limit).
    """

    id: int
    text: str
    logprob: float
    top: list[tuple[int, float]]
    finish: str | None = None


class CompletionText:
    """A continuation's tokens, pushed one at a time as a decoder chooses them, as `GeneratedToken`s.

    The texts of all tokens add up to what `text_pieces` shows for the same tokens (whole characters,
    nothing from the first stop string on); the EOS id and `config.stop_ids` end it and show no text.
    Log-probabilities are the log-softmax of the scores the token was chosen from (after the logit
    adjustments, before temperature, top-k and top-p), so sampling settings do not change them.

    Example:
        >>> import torch
        >>> text = CompletionText(lambda ids: "".join(map(chr, ids)), GenerationConfig(stop=("lo",)), eos_id=0,
        ...                       top_logprobs=1)
        >>> scores = torch.zeros(128)
        >>> [text.push(ord(c), scores, None).text for c in "hel"]
        ['h', 'e', '']
        >>> token = text.push(ord("o"), scores, "stop")  # uniform scores: log(1 / 128)
        >>> token.text, token.finish, abs(token.logprob + math.log(128)) < 1e-6, token.top[0][1] == token.logprob
        ('', 'stop', True, True)
    """

    def __init__(self, decode: Decode, config: GenerationConfig, eos_id: int | None, top_logprobs: int = 0) -> None:
        self._text = TextStream(decode, config.stop)
        self._ends = config.end_ids(eos_id)
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


def _finished(text: str) -> str:
    """The text without a final U+FFFD, which may be the start of a character still to come."""
    return text.removesuffix("\ufffd")

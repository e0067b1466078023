"""Decoding with the KV cache: greedy, sampled and streamed generation, as small free functions.

A decode starts from a `Session`. `start_decoder` left-pads the prompts and prefills a `KVCache`
with all of them in one `decode_step` (the model numbers each row's positions from its mask, so a
padded row decodes as if alone); `start_seq2seq` encodes the right-padded sources once (`new_cache`
computes every layer's cross-attention keys and values) and feeds the start token. Each later step
feeds one token per row (`decode_one_token`); no prefix is ever recomputed. Before a token is
chosen, `adjust_logits` applies the repetition penalty, the n-gram ban, the suppressed tokens and
the forced final EOS; `choose_tokens` then takes the argmax or samples (temperature, top-k,
top-p). Beam search (`attn.beam_search`) starts from the same sessions.

Conventions:
- The lists returned hold the new tokens only: no prompt, no start token, no EOS. A stop string
  ends its row after the token that completes it; that token is kept.
- A row stops at EOS, at a stop string, or after its own token limit. Finished rows leave the
  batch (`KVCache.reorder`), so the others go on with a smaller one.
- Lengths are checked before anything runs. A decoder-only cache holds the longest (left-padded)
  prompt and the new tokens but the last, which is never fed back; that must fit in the model's
  `max_positions`. Translations default to source length + 50 tokens (section 6.1 of the paper).
- Call `model.eval()` first: in training mode dropout makes every decode random.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch
from torch import Tensor

from attn.config import coerce_fields
from attn.errors import ConfigError, GenerationError
from attn.kv_cache import KVCache
from attn.models import Decoder, EncoderDecoder

PAPER_EXTRA_LENGTH = 50  # section 6.1: "maximum output length to input length + 50"

Decode = Callable[[list[int]], str]


class LengthNorm(str, enum.Enum):
    """How beam search divides a hypothesis' log-probability by its length (see `attn.beam_search`)."""

    GNMT = "gnmt"  # ((5 + |Y|) / 6) ** alpha, Wu et al. 2016, the paper's choice
    HF = "hf"  # |Y| ** alpha, Hugging Face's `length_penalty`


class EarlyStopping(str, enum.Enum):
    """When beam search stops a sentence before its length limit (see `attn.beam_search`)."""

    BOUND = "bound"  # no alive beam can beat the finished ones any more (exact)
    HEURISTIC = "heuristic"  # Hugging Face's early_stopping=False
    FIRST = "first"  # Hugging Face's early_stopping=True: once beam_size hypotheses have finished
    NONE = "none"  # run to the length limit


def _fail(field: str, message: str) -> None:
    raise GenerationError(f"{field}: {message}")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to decode. The defaults are greedy decoding; `GenerationConfig.paper()` is the paper's beam search.

    `max_new_tokens=None` means: source length + 50 for translation, and as many as the model's
    positions allow for a decoder-only model. `seed` seeds a `torch.Generator` for sampling (None
    uses torch's global generator). The beam fields (`beam_size`, `length_penalty`, `length_norm`,
    `early_stopping`, `n_best`) are read by `attn.beam_search`.
    """

    max_new_tokens: int | None = None
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram: int = 0
    suppress: tuple[int, ...] = ()
    force_eos: bool = False
    stop: tuple[str, ...] = ()
    seed: int | None = None
    beam_size: int = 1
    length_penalty: float = 0.6
    length_norm: LengthNorm = LengthNorm.GNMT
    early_stopping: EarlyStopping = EarlyStopping.BOUND
    n_best: int = 1

    def __post_init__(self) -> None:
        try:
            coerce_fields(self)
        except ConfigError as error:
            raise GenerationError(str(error)) from None
        self._validate_sampling()
        self._validate_penalties()
        self._validate_beam()

    @classmethod
    def paper(cls) -> GenerationConfig:
        """Section 6.1: beam size 4, length penalty alpha = 0.6 (GNMT's formula), output <= input + 50."""
        return cls(beam_size=4, length_penalty=0.6, length_norm=LengthNorm.GNMT)

    def _validate_sampling(self) -> None:
        if self.sample and not (self.temperature > 0 and math.isfinite(self.temperature)):
            _fail("temperature", f"must be > 0 when sampling, got {self.temperature}; "
                                 "use sample=False for greedy decoding")
        if not 0 < self.top_p <= 1:
            _fail("top_p", f"must be in (0, 1], got {self.top_p}; 1.0 turns nucleus sampling off")
        if self.top_k < 0:
            _fail("top_k", f"must be >= 0, got {self.top_k}; 0 turns top-k filtering off")
        if not self.sample:
            for name, neutral in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)):
                if getattr(self, name) != neutral:
                    _fail(name, f"only applies when sampling; set sample=True or leave {name}={neutral}")

    def _validate_penalties(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            _fail("max_new_tokens", f"must be >= 1, got {self.max_new_tokens}; use None for the default limit")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            _fail("repetition_penalty", f"must be > 0, got {self.repetition_penalty}; 1.0 turns it off")
        if self.no_repeat_ngram < 0:
            _fail("no_repeat_ngram", f"must be >= 0, got {self.no_repeat_ngram}; 0 turns it off")
        if any(token < 0 for token in self.suppress):
            _fail("suppress", f"token ids must be >= 0, got {self.suppress}")
        if not all(self.stop):
            _fail("stop", "stop strings must not be empty")

    def _validate_beam(self) -> None:
        if self.beam_size < 1:
            _fail("beam_size", f"must be >= 1, got {self.beam_size}; 1 decodes greedily (or samples)")
        if not 1 <= self.n_best <= self.beam_size:
            _fail("n_best", f"must be in [1, beam_size={self.beam_size}], got {self.n_best}")
        if not math.isfinite(self.length_penalty):
            _fail("length_penalty", f"must be a finite number, got {self.length_penalty}; 0 turns it off")
        if self.beam_size > 1 and self.sample:
            _fail("sample", "beam search does not sample; set beam_size=1 to sample or sample=False")
        if self.beam_size > 1 and self.stop:
            _fail("stop", "beam search stops at EOS only; set beam_size=1 to use stop strings")


class Steppable(Protocol):
    """What decoding needs of a model: `Decoder` and `EncoderDecoder` both provide it."""

    max_positions: int

    def decode_step(self, tokens: Tensor, cache: KVCache) -> Tensor: ...


@dataclasses.dataclass
class Session:
    """A prefilled cache and the scores of every row's first new token. Decoding consumes it.

    Attributes:
        model: the model whose `decode_step` extends `cache`.
        cache: the KV cache, holding the prompt (decoder-only) or the start token (seq2seq).
        logits: (B, V) float scores of each row's first new token.
        history: (B, offset + max(limits)) long: the prompt (left-padded with -1) or the start
            token in the first `offset` columns, then room for the new tokens (-1 until written).
        offset: the column of the first new token.
        limits: (B,) long, the most new tokens of each row.
    """

    model: Steppable
    cache: KVCache
    logits: Tensor
    history: Tensor
    offset: int
    limits: Tensor


def decode_one_token(model: Steppable, tokens: Tensor, cache: KVCache) -> Tensor:
    """Feeds one token per row (R,) to the cache; returns the next token's scores (R, V), float."""
    return model.decode_step(tokens[:, None], cache)[:, -1].float()


def start_decoder(model: Decoder, prompts: Sequence[Sequence[int]], config: GenerationConfig) -> Session:
    """Left-pads the prompts and prefills a fresh cache with all of them in one step.

    Raises:
        GenerationError: an empty prompt, a token id outside the vocabulary, or prompt + max_new_tokens
            beyond `model.max_positions`.
    """
    if not prompts or not all(prompts):
        raise GenerationError("every prompt needs at least one token; start empty prompts with a BOS token")
    check_token_ids(prompts, _embedding_rows(model, "embeddings"), "prompt")
    longest = max(map(len, prompts))
    limit = _decoder_limit(config.max_new_tokens, longest, model.max_positions)
    cache = model.new_cache(len(prompts), longest + limit - 1)
    padded = [[-1] * (longest - len(p)) + list(p) + [-1] * limit for p in prompts]
    history = torch.tensor(padded, dtype=torch.long, device=cache.keys.device)
    prompt = history[:, :longest]
    logits = model.decode_step(prompt.clamp(min=0), cache, prompt >= 0)[:, -1].float()
    limits = torch.full((len(prompts),), limit, dtype=torch.long, device=history.device)
    return Session(model, cache, logits, history, longest, limits)


def check_token_ids(rows: Sequence[Sequence[int]], vocab_size: int | None, what: str) -> None:
    """Raises a GenerationError naming the first id outside [0, vocab_size) (an embedding would fail on it).

    `vocab_size=None` (a model without a token embedding) checks nothing.
    """
    if vocab_size is None:
        return
    for row in rows:
        bad = next((token for token in row if not 0 <= token < vocab_size), None)
        if bad is not None:
            raise GenerationError(
                f"{what} token id {bad} is outside the model's vocabulary of {vocab_size} ids (0..{vocab_size - 1}); "
                "encode the text with the model's own tokenizer"
            )


def _embedding_rows(model: object, *path: str) -> int | None:
    """Rows of the token embedding at `model.<path>.tokens`, or None for a model without one (a
    scripted stand-in in tests)."""
    module = model
    for name in (*path, "tokens"):
        module = getattr(module, name, None)
    return module.num_embeddings if isinstance(module, torch.nn.Embedding) else None


def _decoder_limit(max_new_tokens: int | None, longest: int, max_positions: int) -> int:
    room = max_positions - longest + 1  # the last new token is never fed back
    if room < 1:
        raise GenerationError(f"the longest prompt has {longest} tokens, more than the model's "
                              f"max_positions={max_positions}; shorten the prompt")
    if max_new_tokens is None:
        return room
    if max_new_tokens > room:
        raise GenerationError(
            f"a prompt of {longest} tokens leaves room for {room} new tokens within the model's "
            f"max_positions={max_positions}, but max_new_tokens={max_new_tokens}; set max_new_tokens <= {room} "
            "or shorten the prompt"
        )
    return max_new_tokens


def start_seq2seq(
    model: EncoderDecoder, sources: Sequence[Sequence[int]], start_id: int, pad_id: int, config: GenerationConfig
) -> Session:
    """Encodes the right-padded sources once, builds the cache and feeds the start token.

    Raises:
        GenerationError: an empty or too long source, a token id outside the vocabulary, or
            max_new_tokens beyond `model.max_positions`.
    """
    limits = _seq2seq_limits(config.max_new_tokens, [len(s) for s in sources], model.max_positions)
    check_token_ids(sources, _embedding_rows(model, "encoder", "embeddings"), "source")
    check_token_ids([[start_id]], _embedding_rows(model, "embeddings"), "start_id")
    device = model.generator.weight.device
    longest = max(map(len, sources))
    src = torch.tensor([list(s) + [pad_id] * (longest - len(s)) for s in sources], dtype=torch.long, device=device)
    lengths = torch.tensor([len(s) for s in sources], device=device)
    src_mask = torch.arange(longest, device=device) < lengths[:, None]  # (B, S)
    cache = model.new_cache(model.encode(src, src_mask), src_mask, max(limits))  # start + all but the last
    history = torch.full((len(sources), 1 + max(limits)), -1, dtype=torch.long, device=device)
    history[:, 0] = start_id
    logits = decode_one_token(model, history[:, 0], cache)
    return Session(model, cache, logits, history, 1, torch.tensor(limits, device=device))


def _seq2seq_limits(max_new_tokens: int | None, lengths: list[int], max_positions: int) -> list[int]:
    if not lengths or min(lengths) == 0:
        raise GenerationError("every source needs at least one token (tokenizers append </s>); drop empty lines")
    if max(lengths) > max_positions:
        raise GenerationError(f"a source of {max(lengths)} tokens exceeds the model's max_positions="
                              f"{max_positions}; split or truncate long sentences")
    if max_new_tokens is None:  # the paper's limit, within what the decoder's positions allow
        return [min(n + PAPER_EXTRA_LENGTH, max_positions) for n in lengths]
    if max_new_tokens > max_positions:
        raise GenerationError(f"max_new_tokens={max_new_tokens} exceeds the model's max_positions="
                              f"{max_positions}; set max_new_tokens <= {max_positions}")
    return [max_new_tokens] * len(lengths)


def adjust_logits(
    logits: Tensor, history: Tensor, config: GenerationConfig, eos_id: int | None, at_limit: Tensor
) -> Tensor:
    """Applies the repetition penalty, the n-gram ban, the suppressed tokens and the forced final EOS.

    Args:
        logits: (R, V) scores of the next token (log-probabilities in beam search).
        history: (R, T) the tokens so far, prompt or start token included; -1 marks left padding.
        at_limit: (R,) bool, the rows whose next token is their last.

    Returns:
        (R, V) adjusted scores; banned tokens get -inf.
    """
    if config.repetition_penalty != 1.0:
        logits = penalize_repeats(logits, history, config.repetition_penalty)
    if config.no_repeat_ngram:
        logits = ban_repeated_ngrams(logits, history, config.no_repeat_ngram)
    if config.suppress:
        logits = logits.index_fill(1, torch.tensor(config.suppress, device=logits.device), float("-inf"))
    if config.force_eos and eos_id is not None:
        only_eos = torch.full_like(logits, float("-inf"))
        only_eos[:, eos_id] = 0.0
        logits = torch.where(at_limit[:, None], only_eos, logits)
    return logits


def penalize_repeats(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019) on every token in history (R, T).

    A seen token's positive score is divided by `penalty`, a negative one multiplied by it, so
    penalty > 1 makes repeats less likely whatever the sign.
    """
    # Padding (-1) points at the row's last token, which is real, so the scatter writes only True.
    index = torch.where(history >= 0, history, history[:, -1:])
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, index, True)  # (R, V)
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def ban_repeated_ngrams(logits: Tensor, history: Tensor, n: int) -> Tensor:
    """Sets to -inf every token that would repeat an n-gram of history (R, T)."""
    if history.size(1) < n:
        return logits
    grams = history.unfold(1, n, 1)  # (R, W, n): every n-gram so far
    suffix = history[:, history.size(1) - n + 1 :]  # (R, n - 1): what the next token would extend
    repeats = (grams[:, :, :-1] == suffix[:, None]).all(-1) & (grams[:, :, -1] >= 0)  # (R, W)
    rows, starts = repeats.nonzero(as_tuple=True)
    return logits.index_put((rows, grams[rows, starts, -1]), torch.tensor(float("-inf"), device=logits.device))


def choose_tokens(logits: Tensor, config: GenerationConfig, generator: torch.Generator | None = None) -> Tensor:
    """(R, V) scores -> (R,) next tokens: argmax, or a sample after temperature, top-k and top-p."""
    if not config.sample:
        return logits.argmax(-1)
    logits = logits / config.temperature
    if config.top_k:
        logits = keep_top_k(logits, config.top_k)
    if config.top_p < 1.0:
        logits = keep_top_p(logits, config.top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """(R, V) -> (R, V) with every score below the row's k-th largest set to -inf."""
    kth = logits.topk(min(k, logits.size(-1)), dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keeps the most likely tokens whose mass first reaches p.

    A token is dropped when the tokens more likely than it already hold at least p of the
    probability; the most likely token is always kept.
    """
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(-1)
    drop_sorted = probs.cumsum(-1) - probs >= p  # mass strictly before each token
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def _stop_hits(recent: list[list[int]], stop: tuple[str, ...], decode: Decode) -> list[bool]:
    return [any(s in decode(tokens) for s in stop) for tokens in recent]


def _stop_window(stop: tuple[str, ...]) -> int:
    # A stop string of b UTF-8 bytes spans at most b tokens when every token holds at least one
    # byte (byte-level tokenizers split a character over up to 4); the slack gives the decoders
    # that render a token by its neighbours (a metaspace, a joined word piece) their context.
    return max(len(s.encode("utf-8")) for s in stop) + 4


def decode_rows(
    session: Session, config: GenerationConfig, eos_id: int | None, decode: Decode | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Greedy or sampled decoding of a session, one step at a time.

    Yields:
        (rows, tokens), both (R,) long: the session row of each still active row and its new token.
        A row appears for the last time with its EOS, stop-string or last allowed token.
    """
    generator = _generator(config.seed, session.logits.device)
    rows = torch.arange(session.logits.size(0), device=session.logits.device)
    logits, history, limits = session.logits, session.history, session.limits
    window = _stop_window(config.stop) if config.stop else 0
    for step in range(int(limits.max())):
        column = session.offset + step
        logits = adjust_logits(logits, history[:, :column], config, eos_id, limits == step + 1)
        tokens = choose_tokens(logits, config, generator)
        history[:, column] = tokens
        yield rows, tokens
        done = limits == step + 1
        if eos_id is not None:
            done |= tokens == eos_id
        if config.stop and decode is not None:
            recent = history[:, max(session.offset, column + 1 - window) : column + 1].tolist()
            done |= torch.tensor(_stop_hits(recent, config.stop, decode), device=done.device)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                return
            session.cache.reorder(keep)
            rows, tokens, history, limits = rows[keep], tokens[keep], history[keep], limits[keep]
        logits = decode_one_token(session.model, tokens, session.cache)


def _check_call(config: GenerationConfig, eos_id: int | None, decode: Decode | None) -> None:
    if config.stop and decode is None:
        raise GenerationError("stop strings need the tokenizer's decode function: pass decode=tokenizer.decode")
    if config.force_eos and eos_id is None:
        raise GenerationError("force_eos needs eos_id: pass the tokenizer's end-of-sequence id")


def _collect(steps: Iterator[tuple[Tensor, Tensor]], batch: int, eos_id: int | None) -> list[list[int]]:
    outputs: list[list[int]] = [[] for _ in range(batch)]
    for rows, tokens in steps:
        for row, token in zip(rows.tolist(), tokens.tolist()):
            if token != eos_id:
                outputs[row].append(token)
    return outputs


@torch.inference_mode()
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
    """
    _check_call(config, eos_id, decode)
    if config.beam_size > 1:
        from attn.beam_search import beam_search  # beam search builds on this module

        return [hypotheses[0].tokens for hypotheses in beam_search(model, prompts, config, eos_id)]
    session = start_decoder(model, prompts, config)
    return _collect(decode_rows(session, config, eos_id, decode), len(prompts), eos_id)


@torch.inference_mode()
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
    _check_call(config, eos_id, None)
    if config.beam_size > 1:
        from attn.beam_search import beam_search_seq2seq  # beam search builds on this module

        found = beam_search_seq2seq(model, sources, start_id, eos_id, pad_id, config)
        return [hypotheses[0].tokens for hypotheses in found]
    session = start_seq2seq(model, sources, start_id, pad_id, config)
    return _collect(decode_rows(session, config, eos_id), len(sources), eos_id)


def stream(
    model: Decoder,
    prompt: Sequence[int],
    config: GenerationConfig = GenerationConfig(),
    eos_id: int | None = None,
    decode: Decode | None = None,
) -> Iterator[int]:
    """Continues one prompt, yielding each new token id as soon as it is chosen (EOS is not yielded).

    The prompt is prefilled (and every argument checked) when `stream` is called; tokens are
    decoded as the iterator is consumed.
    """
    _check_call(config, eos_id, decode)
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
    for _, tokens in decode_rows(session, config, eos_id, decode):
        token = int(tokens[0])
        if token != eos_id:
            yield token

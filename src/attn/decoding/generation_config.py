"""Decoding settings: `GenerationConfig` and the beam-search choices it names, validated once."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from typing import Any

from attn.core.config import coerce_fields
from attn.core.errors import ConfigError, GenerationError
from attn.decoding.grammar import Grammar

MAX_PENALTY = 2.0  # OpenAI's range of frequency_penalty and presence_penalty: [-2, 2]
MAX_LOGIT_BIAS = 100.0  # OpenAI's range of a logit_bias entry: [-100, 100]
MAX_LENGTH_PENALTY = 10.0  # lp(|Y|) = |Y| ** alpha stays a float for any length a model decodes (GNMT uses 0.6)
PAPER_EXTRA_LENGTH = 50  # section 6.1: "maximum output length to input length + 50"
DEFAULT_NEW_TOKENS = 200  # a decoder-only model's continuation when nothing sets a limit

Decode = Callable[[list[int]], str]


class LengthNorm(str, enum.Enum):
    """How beam search divides a hypothesis' log-probability by its length (see `attn.decoding.beam_search`)."""

    GNMT = "gnmt"  # ((5 + |Y|) / 6) ** alpha, Wu et al. 2016, the paper's choice
    HF = "hf"  # |Y| ** alpha, Hugging Face's `length_penalty`


class EarlyStopping(str, enum.Enum):
    """When beam search stops a sentence before its length limit (see `attn.decoding.beam_search`)."""

    BOUND = "bound"  # no alive beam can beat the finished ones any more (exact)
    HEURISTIC = "heuristic"  # Hugging Face's early_stopping=False
    FIRST = "first"  # Hugging Face's early_stopping=True: once beam_size hypotheses have finished
    NONE = "none"  # run to the length limit


def _fail(field: str, message: str) -> None:
    raise GenerationError(message, field)


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to decode. The defaults are greedy decoding; `GenerationConfig.paper()` is the paper's beam search.

    The settings mean what they mean in OpenAI's API and vLLM, applied in this order (`attn.decoding.sampling`):
    `logit_bias` ({token id: bias}, given as a mapping or as (id, bias) pairs) is added to the scores first; then
    `repetition_penalty` (CTRL's, over the prompt and the new tokens), `frequency_penalty` and `presence_penalty`
    (OpenAI's: score -= count x frequency_penalty + (count > 0) x presence_penalty, counting the new tokens only),
    the n-gram ban and the suppressed tokens: all of them change greedy choices too. A sampled token is then drawn
    after `temperature`, `top_k`, `top_p` and `min_p` (keeps the tokens at least min_p times as likely as the most
    likely one), in transformers' order.

    `max_new_tokens=None` means: source length + 50 for translation, and as many as the model's positions allow for
    a decoder-only model. `stop_ids` end a row as the EOS id does (a chat model's end-of-turn token, `<|im_end|>` in
    ChatML) and, like it, are no part of the output. `grammar` (`attn.decoding.grammar`) constrains the new tokens
    to a JSON schema, a regular expression or a Lark grammar; the row ends when the grammar is complete. `seed`
    seeds a `torch.Generator` for sampling (None uses torch's global generator). The beam fields (`beam_size` to
    `n_best`) are read by `attn.decoding.beam_search`.

    Example:
        >>> from attn import GenerationConfig
        >>> GenerationConfig.paper().beam_size, GenerationConfig.paper().length_penalty
        (4, 0.6)
    """

    max_new_tokens: int | None = None
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    no_repeat_ngram: int = 0
    suppress: tuple[int, ...] = ()
    force_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()
    grammar: Grammar | None = None
    seed: int | None = None
    beam_size: int = 1
    length_penalty: float = 0.6
    length_norm: LengthNorm = LengthNorm.GNMT
    early_stopping: EarlyStopping = EarlyStopping.BOUND
    n_best: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        try:
            coerce_fields(self)
        except ConfigError as error:
            raise GenerationError(error.detail, error.field) from None
        self._validate_sampling()
        self._validate_penalties()
        self._validate_logit_bias()
        self._validate_beam()

    def end_ids(self, eos_id: int | None) -> tuple[int, ...]:
        """The ids that end a row: `eos_id` (when there is one) and `stop_ids`."""
        return self.stop_ids if eos_id is None else (eos_id, *self.stop_ids)

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
        if not 0 <= self.min_p <= 1:
            _fail("min_p", f"must be in [0, 1], got {self.min_p}; 0 turns min-p filtering off")
        if not self.sample:
            for name, neutral in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
                if getattr(self, name) != neutral:
                    _fail(name, f"only applies when sampling; set sample=True or leave {name}={neutral}")

    def _validate_penalties(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            _fail("max_new_tokens", f"must be >= 1, got {self.max_new_tokens}; use None for the default limit")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            _fail("repetition_penalty", f"must be > 0, got {self.repetition_penalty}; 1.0 turns it off")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                _fail(name, f"must be in [-2, 2], got {getattr(self, name)}; 0 turns it off")
        if self.no_repeat_ngram < 0:
            _fail("no_repeat_ngram", f"must be >= 0, got {self.no_repeat_ngram}; 0 turns it off")
        for name in ("suppress", "stop_ids"):
            if any(token < 0 for token in getattr(self, name)):
                _fail(name, f"token ids must be >= 0, got {getattr(self, name)}")
        if not all(self.stop):
            _fail("stop", "stop strings must not be empty")

    def _validate_logit_bias(self) -> None:
        pairs = tuple(_bias_pair(pair) for pair in self.logit_bias)
        if len({token for token, _ in pairs}) < len(pairs):
            _fail("logit_bias", "a token id is given twice; give each token one bias")
        object.__setattr__(self, "logit_bias", pairs)

    def _validate_beam(self) -> None:
        if self.beam_size < 1:
            _fail("beam_size", f"must be >= 1, got {self.beam_size}; 1 decodes greedily (or samples)")
        if not 1 <= self.n_best <= self.beam_size:
            _fail("n_best", f"must be in [1, beam_size={self.beam_size}], got {self.n_best}")
        if not abs(self.length_penalty) <= MAX_LENGTH_PENALTY:
            _fail("length_penalty", f"must be in [-10, 10], got {self.length_penalty}; 0 turns it off")
        if self.beam_size > 1 and self.sample:
            _fail("sample", "beam search does not sample; set beam_size=1 to sample or sample=False")
        if self.beam_size > 1 and self.stop:
            _fail("stop", "beam search stops at EOS only; set beam_size=1 to use stop strings")
        if self.beam_size > 1 and self.grammar is not None:
            _fail("grammar", "beam search does not follow a grammar; set beam_size=1 to use one")


def _bias_pair(pair: object) -> tuple[int, float]:
    """One `logit_bias` entry as (token id, bias), checked."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        _fail("logit_bias", f"expected a mapping of token ids to biases, or (id, bias) pairs, got {pair!r}")
    token, bias = pair
    if not isinstance(token, int) or isinstance(token, bool) or token < 0:
        _fail("logit_bias", f"token ids must be ints >= 0, got {token!r}")
    if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not abs(bias) <= MAX_LOGIT_BIAS:
        _fail("logit_bias", f"the bias of token {token} must be a number in [-100, 100], got {bias!r}")
    return token, float(bias)


def requested(temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
              min_p: float | None = None, **fields: Any) -> GenerationConfig:
    """The decoding settings a user asked for (command-line flags, a request body, library arguments), in one
    convention, OpenAI's: temperature 0 (the default) decodes greedily, and top_p, top_k and min_p then change
    nothing; above 0 it samples at that temperature. A setting given as None takes its default.

    Raises:
        GenerationError: a setting out of range, naming its field.

    Example:
        >>> requested(temperature=0, top_p=0.9).sample, requested(temperature=0.7, top_p=0.9).top_p
        (False, 0.9)
    """
    asked = {name: value for name, value in fields.items() if value is not None}
    if temperature is not None and not (temperature >= 0 and math.isfinite(temperature)):
        _fail("temperature", f"must be a number >= 0, got {temperature}; 0 decodes greedily")
    if top_p is not None and not 0 < top_p <= 1:  # out of range is a mistake, greedy or not
        _fail("top_p", f"must be in (0, 1], got {top_p}; 1.0 turns nucleus sampling off")
    if top_k is not None and top_k < 0:
        _fail("top_k", f"must be >= 0, got {top_k}; 0 turns top-k filtering off")
    if min_p is not None and not 0 <= min_p <= 1:
        _fail("min_p", f"must be in [0, 1], got {min_p}; 0 turns min-p filtering off")
    if temperature:
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
        asked |= {"sample": True} | {name: value for name, value in sampling.items() if value is not None}
    return GenerationConfig(**asked)


def check_samples(samples: int, config: GenerationConfig) -> None:
    """Raises a GenerationError unless `samples` continuations per prompt can be drawn under `config`."""
    if samples < 1:
        raise GenerationError(f"must be >= 1, got {samples}", "samples")
    if samples > 1 and not config.sample:
        raise GenerationError(f"greedy decoding and beam search give one continuation per prompt; sample to draw "
                              f"{samples}, or ask beam search for its n best", "samples")

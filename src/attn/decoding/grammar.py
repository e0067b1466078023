"""Structured output: a `Grammar` that a row's tokens must follow, enforced by llguidance's token masks.

A row whose `GenerationConfig.grammar` is set gets, at every step, -inf on the scores of the tokens its grammar
does not allow next (`RowMatcher.allowed`); its chosen token is then fed to its matcher (`RowMatcher.consume`), and
the row ends ("stop") once the grammar is complete (`RowMatcher.done`). While the grammar could end (`accepting`)
the row's end ids stay allowed too. Each row has its own matcher; rows without a grammar are not touched.

A matcher needs the model's vocabulary as bytes, which only the tokenizer knows: the decoding loop takes a
`MatcherFactory` from its caller (`attn.data.grammar_tokens.grammar_matchers` builds one from a `Tokenizer`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Protocol

import llguidance
import numpy as np
import torch
from torch import Tensor

from attn.core.errors import GenerationError

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "lark")
# JSON is written as Python's json.dumps writes it, no other whitespace (a schema's "x-guidance" may say otherwise)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclasses.dataclass(frozen=True)
class Grammar:
    """What a row's text must be, checked when made.

    Attributes:
        kind: "json_object" (any JSON object, OpenAI's JSON mode), "json_schema" (JSON valid under a schema;
            both laid out as `JSON_LAYOUT` says), "regex" (text matching a regular expression, whole) or "lark"
            (a grammar in llguidance's Lark dialect, which may embed JSON schemas as `%json {...}`).
        source: "" for json_object; the schema's JSON text, the regular expression or the Lark grammar.

    Raises:
        GenerationError: an unknown kind, a source that is missing or not allowed, a schema that is not a JSON
            object, or a grammar llguidance rejects; the field is "grammar".

    Example:
        >>> Grammar("regex", "[0-9]+").kind
        'regex'
    """

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            _fail(f"unknown kind {self.kind!r}; use one of {', '.join(GRAMMAR_KINDS)}")
        if not isinstance(self.source, str):
            _fail(f"the source must be text, got {type(self.source).__name__}")
        if self.kind == "json_object" and self.source:
            _fail("a json_object grammar takes no source; use kind 'json_schema' to give a schema")
        if self.kind != "json_object" and not self.source.strip():
            _fail(f"a {self.kind} grammar needs its source (the {_SOURCES[self.kind]})")
        if self.kind == "json_schema":
            _schema(self.source)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.llguidance())
        if failed:
            _fail(f"llguidance rejects the {self.kind} grammar: {_one_line(messages[0])}; "
                  f"fix the {_SOURCES[self.kind]}")

    def llguidance(self) -> str:
        """The grammar in llguidance's own format, as `llguidance.LLMatcher` takes it."""
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.source)
        schema = self.source if self.kind == "json_schema" else '{"type": "object"}'
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)


_SOURCES = {"json_object": "nothing", "json_schema": "JSON schema", "regex": "regular expression",
            "lark": "Lark grammar"}


def _fail(message: str) -> None:
    raise GenerationError(message, "grammar")


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _schema(source: str) -> None:
    try:
        schema = json.loads(source)
    except json.JSONDecodeError as error:
        _fail(f"the JSON schema is not valid JSON ({error}); give the schema as a JSON object")
    if not isinstance(schema, dict):
        _fail(f"the JSON schema must be a JSON object, got {type(schema).__name__}")


class RowMatcher(Protocol):
    """One row's grammar state: what may come next, fed the tokens the row chooses."""

    def allowed(self, vocab_size: int) -> Tensor:
        """(vocab_size,) bool: the tokens the grammar allows next; its own end of text is not among them."""
        ...

    def accepting(self) -> bool:
        """Whether the text so far is complete under the grammar, so the row may end here."""
        ...

    def done(self) -> bool:
        """Whether the grammar is complete and allows nothing more."""
        ...

    def consume(self, token: int) -> None:
        """Feeds the row's chosen token; raises GenerationError (field "grammar") if the grammar forbids it."""
        ...


MatcherFactory = Callable[[Grammar], RowMatcher]


class GrammarMatcher:
    """A `RowMatcher` over llguidance's `LLMatcher`.

    Raises:
        GenerationError: llguidance cannot build the grammar against this vocabulary.
    """

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: Grammar) -> None:
        self.tokenizer = tokenizer
        self.matcher = llguidance.LLMatcher(tokenizer, grammar.llguidance(), log_level=0)
        if self.matcher.is_error():
            _fail(f"llguidance rejects the {grammar.kind} grammar: {_one_line(self.matcher.get_error())}")
        self._ends = np.array(tokenizer.eos_tokens, dtype=np.int64)

    def allowed(self, vocab_size: int) -> Tensor:
        # one bit per token, the lowest bit of each byte first; numpy unpacks them in microseconds
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        mask = np.zeros(vocab_size, dtype=bool)
        known = min(vocab_size, bits.size)
        mask[:known] = bits[:known]
        mask[self._ends[self._ends < vocab_size]] = False
        return torch.from_numpy(mask)

    def accepting(self) -> bool:
        return self.matcher.is_accepting()

    def done(self) -> bool:
        return self.matcher.is_stopped()

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            _fail(f"token {token} breaks the grammar ({self.matcher.get_error()}); the other settings "
                  "(logit_bias, suppressed tokens) left no token the grammar allows")


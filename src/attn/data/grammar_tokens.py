"""A tokenizer's vocabulary as llguidance reads it, and the grammar matchers of the rows that decode with it."""

from __future__ import annotations

import json
import weakref

import llguidance

from attn.core.errors import GenerationError
from attn.data.tokenizers import Tokenizer
from attn.decoding.grammar import GrammarMatcher, MatcherFactory

# llguidance reads each tokenizer's vocabulary once: that is slow for a large one
_READ: weakref.WeakKeyDictionary[Tokenizer, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()


def grammar_matchers(tokenizer: Tokenizer) -> MatcherFactory:
    """The `MatcherFactory` of a model that decodes with `tokenizer` (`RunningBatch`'s `matcher`).

    The vocabulary is read on the first grammar, not before: a model that never follows one pays nothing. Ids past
    the tokenizer's vocabulary (a model's padded embedding rows) are never allowed.

    Raises (when a matcher is made):
        GenerationError: llguidance cannot read this kind of tokenizer, or rejects the grammar (field "grammar").
    """
    return lambda grammar: GrammarMatcher(llguidance_tokenizer(tokenizer), grammar)


def llguidance_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """`tokenizer`'s vocabulary as llguidance reads it, its EOS the tokenizer's.

    Raises:
        GenerationError: a tokenizer llguidance cannot read (field "grammar").
    """
    if tokenizer not in _READ:
        pipeline = tokenizer.pipeline()
        if pipeline is None:
            raise GenerationError(f"llguidance cannot read a {tokenizer.kind} tokenizer; grammars need a tokenizer "
                                  "of the `tokenizers` library (tokenizer.json, GGUF)", "grammar")
        try:
            _READ[tokenizer] = llguidance.LLTokenizer(json.dumps(pipeline), eos_token=tokenizer.eos_id)
        except ValueError as error:
            raise GenerationError(f"llguidance cannot read this {tokenizer.kind} tokenizer ({error}); grammars "
                                  "need a vocabulary it reads, such as a byte-level BPE", "grammar") from None
    return _READ[tokenizer]

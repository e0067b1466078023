"""A tokenizer's vocabulary as llguidance reads it, and the grammar matchers of the rows that decode with it."""

from __future__ import annotations

import json
import weakref

import llguidance

from attn.core.errors import GenerationError
from attn.data.tokenizers import Tokenizer
from attn.decoding.grammar import Grammar, GrammarMatcher, MatcherFactory

# llguidance reads a vocabulary once per tokenizer and model size: about a second for 50,000 tokens
_READ: weakref.WeakKeyDictionary[Tokenizer, dict[int, llguidance.LLTokenizer]] = weakref.WeakKeyDictionary()


def grammar_matchers(tokenizer: Tokenizer, vocab_size: int) -> MatcherFactory:
    """The `MatcherFactory` of a model that decodes with `tokenizer` (`RunningBatch`'s `matcher`).

    The vocabulary is read on the first grammar, not before: a model that never follows one pays nothing.

    Args:
        vocab_size: the model's vocabulary (its scores' width), which may exceed the tokenizer's.

    Raises (when a matcher is made):
        GenerationError: llguidance cannot read this kind of tokenizer, or rejects the grammar (field "grammar").
    """
    return lambda grammar: GrammarMatcher(llguidance_tokenizer(tokenizer, vocab_size), grammar)


def llguidance_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """`tokenizer`'s vocabulary as llguidance reads it, `vocab_size` ids wide, its EOS the tokenizer's.

    Raises:
        GenerationError: a tokenizer llguidance cannot read (field "grammar").
    """
    read = _READ.setdefault(tokenizer, {})
    if vocab_size not in read:
        pipeline = tokenizer.pipeline()
        if pipeline is None:
            raise GenerationError(f"llguidance cannot read a {tokenizer.kind} tokenizer; grammars need a tokenizer "
                                  "of the `tokenizers` library (tokenizer.json, GGUF)", "grammar")
        try:
            read[vocab_size] = llguidance.LLTokenizer(json.dumps(pipeline), n_vocab=max(vocab_size, tokenizer.vocab_size),
                                                      eos_token=tokenizer.eos_id)
        except ValueError as error:
            raise GenerationError(f"llguidance cannot read this {tokenizer.kind} tokenizer ({error}); grammars "
                                  "need a vocabulary it reads, such as a byte-level BPE", "grammar") from None
    return read[vocab_size]

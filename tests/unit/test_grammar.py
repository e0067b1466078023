"""Structured output: each row of a running batch follows its own grammar through llguidance's token masks, checked
against references written apart from llguidance: the `regex` package's partial matches say which tokens keep a
regular expression's match possible, jsonschema-rs validates the JSON, and an uncached forward pass gives the
scores that the mask leaves as they are. A random model is free to choose any token the mask allows, so its answers
show that the mask alone makes them valid."""

from __future__ import annotations

import json

import pytest
import torch
from chat_models import tiny_chat_bundle
from reference_imports import require
from torch.testing import assert_close

from attn.artifacts import Bundle
from attn.core.errors import GenerationError
from attn.data.grammar_tokens import grammar_matchers
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig, generate
from attn.decoding.continuous import RowToken, RunningBatch
from attn.decoding.grammar import Grammar
from attn.inference.continuation import continue_texts, generate_stream

regex = require("regex")
jsonschema_rs = require("jsonschema_rs")

# Small schemas of every kind of constraint: nested objects, arrays, enums, bounded numbers, optional fields and
# string patterns; bounded so that a random model's answers end within LIMIT tokens.
SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["user"], "properties": {
        "user": {"type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
            "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}}}},
    "array-of-enums": {"type": "object", "additionalProperties": False, "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}}},
    "optional-and-bool": {"type": "object", "additionalProperties": False, "required": ["ok"], "properties": {
        "ok": {"type": "boolean"}, "note": {"type": "string", "maxLength": 4},
        "level": {"enum": [1, 2, 3]}}},
    "pattern": {"type": "object", "additionalProperties": False, "required": ["code"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}},
}
REGEX = r"(the|a) [a-z]{2,8}( [0-9]{1,2})?"
LIMIT = 60


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return tiny_chat_bundle()


def _decode(bundle: Bundle, rows: list[tuple[list[int], GenerationConfig]]) -> list[list[RowToken]]:
    """Every row's steps, all rows decoded together in one running batch with the bundle's grammar matchers."""
    batch = RunningBatch(bundle.model, bundle.eos_id, bundle.tokenizer.decode, grammar_matchers(bundle.tokenizer))
    for key, (prompt, config) in enumerate(rows):
        batch.add(key, prompt, config)
    found: list[list[RowToken]] = [[] for _ in rows]
    while len(batch):
        for step in batch.step():
            found[step.key].append(step)
    return found


def _text(bundle: Bundle, steps: list[RowToken]) -> str:
    return bundle.tokenizer.decode([step.token for step in steps if step.token != bundle.eos_id])


def test_every_row_follows_its_own_grammar_and_a_row_without_one_is_untouched(bundle: Bundle) -> None:
    prompt = bundle.tokenizer.encode("Hello! How are you today?")
    grammars = [Grammar("json_schema", json.dumps(schema)) for schema in SCHEMAS.values()] + [Grammar("regex", REGEX)]
    configs = [GenerationConfig(max_new_tokens=LIMIT, grammar=grammar, **sampled)
               for grammar in grammars for sampled in ({}, {"sample": True, "seed": 7})]
    configs.append(GenerationConfig(max_new_tokens=LIMIT, grammar=Grammar("json_object")))  # sampled, keys run on
    plain = GenerationConfig(max_new_tokens=12)
    found = _decode(bundle, [(prompt, config) for config in configs] + [(prompt, plain)])
    for steps, config in zip(found, configs):
        text = _text(bundle, steps)
        assert steps[-1].finish == "stop", text
        if config.grammar.kind == "regex":
            assert regex.fullmatch(REGEX, text), text
        elif config.grammar.kind == "json_object":
            assert isinstance(json.loads(text), dict), text
        else:
            jsonschema_rs.validate(json.loads(config.grammar.source), json.loads(text))
    alone = _decode(bundle, [(prompt, plain)])[0]
    assert [step.token for step in found[-1]] == [step.token for step in alone]
    assert_close(torch.stack([s.scores for s in found[-1]]), torch.stack([s.scores for s in alone]))


def test_the_mask_allows_exactly_the_tokens_that_keep_a_match_possible(bundle: Bundle) -> None:
    """Each step's scores are the model's (an uncached forward pass) where a token keeps the text a prefix of a
    match of the regex (and EOS where the text already matches), -inf elsewhere."""
    tokenizer, model = bundle.tokenizer, bundle.model
    prompt = tokenizer.encode("What is the capital of France?")
    config = GenerationConfig(max_new_tokens=LIMIT, sample=True, seed=3, grammar=Grammar("regex", REGEX))
    steps = _decode(bundle, [(prompt, config)])[0]
    tokens = [step.token for step in steps]
    with torch.no_grad():
        reference = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1 : -1]  # (steps, V)
    for i, step in enumerate(steps):
        text = tokenizer.decode(tokens[:i], skip_special=False)
        allowed = torch.tensor([regex.fullmatch(REGEX, text + _piece(tokenizer, tokens[:i], t), partial=True)
                                is not None for t in range(reference.size(-1))])
        allowed[bundle.eos_id] = regex.fullmatch(REGEX, text) is not None
        assert_close(step.scores, reference[i].masked_fill(~allowed, float("-inf")), atol=1e-5, rtol=1e-5)
    assert regex.fullmatch(REGEX, _text(bundle, steps))


def _piece(tokenizer: Tokenizer, before: list[int], token: int) -> str:
    """The text `token` adds after `before`; a special token or an incomplete character adds text no regex of
    plain ASCII matches."""
    if token in tokenizer.roles.values() or tokenizer.id_to_token(token).startswith("<|"):
        return "\x00"
    return tokenizer.decode(before + [token], skip_special=False)[len(tokenizer.decode(before, skip_special=False)):]


def test_the_library_follows_a_grammar_whole_and_streamed(bundle: Bundle) -> None:
    schema = SCHEMAS["nested"]
    config = GenerationConfig(max_new_tokens=LIMIT, grammar=Grammar("json_schema", json.dumps(schema)))
    (whole,), = continue_texts(bundle, ["Hello!"], config)
    jsonschema_rs.validate(schema, json.loads(whole.text))
    assert "".join(generate_stream(bundle, "Hello!", config)) == whole.text


@pytest.mark.parametrize(("kind", "source", "message"), [
    ("yaml", "a: 1", "unknown kind 'yaml'; use one of json_object, json_schema, regex, lark"),
    ("json_object", "{}", "a json_object grammar takes no source"),
    ("regex", " ", "a regex grammar needs its source (the regular expression)"),
    ("json_schema", "{'type': 'object'}", "the JSON schema is not valid JSON"),
    ("json_schema", "[1, 2]", "the JSON schema must be a JSON object, got list"),
    ("json_schema", '{"type": "bogus"}', "llguidance rejects the json_schema grammar: Invalid type: bogus"),
    ("regex", "[0-9", "unclosed character class"),
    ("lark", "start: missing", 'unknown name: "missing"'),
])
def test_a_bad_grammar_is_refused_when_made_naming_the_field(kind: str, source: str, message: str) -> None:
    with pytest.raises(GenerationError, match="^grammar: ") as found:
        Grammar(kind, source)
    assert message in str(found.value)


def test_what_cannot_follow_a_grammar_says_so(bundle: Bundle) -> None:
    grammar = Grammar("regex", "[a-z]+")
    with pytest.raises(GenerationError, match="^grammar: beam search does not follow a grammar"):
        GenerationConfig(beam_size=2, grammar=grammar)
    batch = RunningBatch(bundle.model, bundle.eos_id, bundle.tokenizer.decode)
    with pytest.raises(GenerationError, match="^grammar: this running batch was made without a grammar matcher"):
        batch.add(0, [5, 6], GenerationConfig(grammar=grammar))
    with pytest.raises(GenerationError, match="^grammar: llguidance cannot read this chars tokenizer"):
        grammar_matchers(Tokenizer.train_chars(["abc"]))(grammar)
    with pytest.raises(GenerationError, match="^grammar: "):
        generate(bundle.model, [[5, 6]], GenerationConfig(max_new_tokens=2, grammar=grammar), bundle.eos_id)

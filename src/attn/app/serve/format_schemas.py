"""`response_format` of completions and chat completions (docs/serve-api.md): OpenAI's plain text, JSON mode and
JSON schema, and attn's regular expression and Lark grammar, each the `Grammar` its rows follow."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attn.app.serve.errors import ApiError
from attn.core.errors import ConfigError, GenerationError
from attn.decoding.grammar import Grammar

# the field that holds each type's source, as a request names it
_SOURCES = {"json_schema": "response_format.json_schema.schema", "regex": "response_format.regex",
                 "grammar": "response_format.grammar"}


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="letters, digits, _ and -, at most 64")
    description: str | None = Field(None, description="accepted; the model is not shown it")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="the JSON schema the answer follows; "
                                                                              "null: any JSON object")
    strict: bool | None = Field(None, description="accepted; the answer always follows the schema")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text", "json_object", "json_schema", "regex", "grammar"] = Field(
        description="text: no constraint; json_object: a JSON object; json_schema: JSON under json_schema.schema; "
                    "regex and grammar (attn's): text that matches `regex`, or that `grammar` (llguidance's Lark) "
                    "derives")
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = Field(None, description="with type regex: the regular expression the whole answer matches")
    grammar: str | None = Field(None, description="with type grammar: a Lark grammar in llguidance's dialect")

    @model_validator(mode="after")
    def _its_source(self) -> ResponseFormat:
        for name in ("json_schema", "regex", "grammar"):
            given = getattr(self, name) is not None
            if given and name != self.type:
                raise ConfigError(name, f"goes with type {name!r} only; leave it out of a {self.type!r} format")
            if not given and name == self.type:
                raise ConfigError(name, f"type {name!r} needs its {name}")
        return self

    def to_grammar(self) -> Grammar | None:
        """The grammar the rows follow; None for plain text.

        Raises:
            GenerationError: a schema or grammar that llguidance rejects (field "grammar").
        """
        if self.type == "text":
            return None
        if self.type == "regex":
            return Grammar("regex", self.regex)
        if self.type == "grammar":
            return Grammar("lark", self.grammar)
        if self.type == "json_schema" and self.json_schema.schema_ is not None:
            return Grammar("json_schema", json.dumps(self.json_schema.schema_))
        return Grammar("json_object")


def grammar_of(response_format: ResponseFormat | None) -> Grammar | None:
    """The grammar a request's `response_format` asks for. A schema or grammar that llguidance rejects is a 400
    naming its field, as OpenAI answers a schema it cannot follow."""
    try:
        return None if response_format is None else response_format.to_grammar()
    except GenerationError as error:
        field = _SOURCES.get(response_format.type, "response_format")
        raise ApiError(400, f"{field}: {error.detail}", field) from None

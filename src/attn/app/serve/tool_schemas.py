"""The tool-calling parts of a chat request (docs/serve-api.md), as OpenAI's chat completions write them: the
functions offered (`tools`) and the calls an assistant message sent back holds (`tool_calls`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from attn.core.errors import ConfigError

FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionSpec(Strict):
    name: str = Field(pattern=FUNCTION_NAME, description="letters, digits, _ and -, at most 64")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="the arguments' JSON schema (an object); "
                                                                "default: no arguments")
    strict: bool | None = Field(None, description="accepted; a forced call always follows the schema")

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type", "object") != "object":
            raise ConfigError("parameters", f"the arguments are a JSON object: give a schema of \"type\": \"object\", "
                              f"not {parameters['type']!r}")
        return parameters


class ToolSpec(Strict):
    type: Literal["function"]
    function: FunctionSpec


class FunctionCall(Strict):
    name: str
    arguments: str = Field(description="the arguments as a JSON string")


class ToolCallSpec(Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall

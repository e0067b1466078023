"""Request bodies of the HTTP API (docs/serve-api.md), as pydantic models (the responses' are in `responses`).

Requests are strict (a string where a number goes is a 422, not a conversion) and ignore nothing: a field the
server does not read is a 422 naming it. The fields OpenAI's clients may send that change nothing here (`user`,
`store`, `metadata`, a message's `name`, ...) are declared, and those whose other values ask for what the server
does not do (`modalities`, `echo`, ...) are accepted at their no-op values only.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attn.app.serve.tool_schemas import ToolCallSpec, ToolSpec
from attn.app.serve.format_schemas import ResponseFormat
from attn.data.text import check_unicode
from attn.core.errors import ConfigError
from attn.inference.tools import check_tool_choice

MAX_SEED = 2**63 - 1  # seed + j (j < n) must fit the 64 bits of torch's generators


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = Field(None, description="a served model's name; may be left out when only one is served")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, body: object) -> object:
        """Refuses a string anywhere in the body that is not valid Unicode (an unpaired surrogate
        escape, which JSON allows), naming its field: `messages.0.content`, `inputs.1`."""
        _check_strings(body, "")
        return body


def _only_neutral(body: BaseModel, fields: dict[str, tuple[tuple[Any, ...], str]]) -> None:
    """Refuses each field of `fields` ({name: (the values that change nothing, what to do instead)}) whose value
    is another, naming it: the field asks for what this server does not do."""
    for name, (neutral, fix) in fields.items():
        if getattr(body, name) not in neutral:
            raise ConfigError(name, f"{getattr(body, name)!r} is not supported by this server; {fix}")


def _check_strings(body: object, root: str) -> None:
    """Every string of a parsed JSON body through `check_unicode`; a loop, as a body may nest deep."""
    pending = [(root, body)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            check_unicode(value, path)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        pending += [(f"{path}.{key}" if path else str(key), item) for key, item in items]


class TextsRequest(Request):
    """A request whose inputs are `inputs: [str]` or `input: str`."""

    inputs: list[str] | None = None
    input: str | None = None

    @model_validator(mode="after")
    def _some_text(self) -> TextsRequest:
        texts = self.texts()
        if not texts:
            raise ConfigError("inputs", "give a non-empty list of texts (or input: one text)")
        if not all(t.strip() for t in texts):
            raise ConfigError("inputs", "every text must hold a non-blank character")
        return self

    def texts(self) -> list[str]:
        return self.inputs if self.inputs is not None else [self.input] if self.input is not None else []


class AttentionOption(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    layer: int = Field(-1, description="the layer (negative counts from the last)")
    head: int | None = Field(None, ge=0, description="one head; null: the mean over heads")


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = Field(False, description="a last chunk, before [DONE], with the usage and no choices")
    include_obfuscation: bool = Field(True, description="accepted; chunks carry no obfuscation field either way")


class DecodingRequest(Request):
    """The decoding settings that completions and chat completions share, as OpenAI and vLLM mean them."""

    temperature: float = Field(1.0, ge=0, description="0: greedy decoding")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1, description="0 or -1: off")
    min_p: float = Field(0.0, ge=0, le=1, description="keep the tokens at least min_p times as likely as the most "
                                                      "likely one; 0: off")
    repetition_penalty: float = Field(1.0, gt=0, description="CTRL's, on the prompt's and the answer's tokens; 1: off")
    frequency_penalty: float = Field(0.0, ge=-2, le=2, description="each token's score less this times its count "
                                                                   "in the answer so far")
    presence_penalty: float = Field(0.0, ge=-2, le=2, description="each token's score less this once it is in the "
                                                                  "answer")
    logit_bias: dict[str, float] | None = Field(None, description="{token id: bias in -100..100}, added to the "
                                                                  "scores before every other setting")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="seeds choice j of each prompt with seed + j")
    n: int = Field(1, ge=1, le=16, description="choices per prompt")
    stream: bool = False
    stream_options: StreamOptions | None = None
    attention: AttentionOption | None = Field(None, description="stream: send the attention with which each token "
                                                                "was chosen")
    response_format: ResponseFormat | None = Field(None, description="what the answer's text must be: a JSON "
                                                   "object, JSON under a schema, a regex's or a grammar's match")
    user: str | None = Field(None, description="accepted; changes nothing")

    @model_validator(mode="after")
    def _stops(self) -> DecodingRequest:
        if isinstance(self.stop, str) and not self.stop or isinstance(self.stop, list) and not all(self.stop):
            raise ConfigError("stop", "stop strings must not be empty")
        return self

    @model_validator(mode="after")
    def _streamed(self) -> DecodingRequest:
        if self.attention is not None and not self.stream:
            raise ConfigError("attention", "is sent with streamed tokens only; set stream: true")
        if self.stream_options is not None and not self.stream:
            raise ConfigError("stream_options", "applies to streamed answers only; set stream: true")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            if not re.fullmatch("[0-9]+", key):
                raise ConfigError("logit_bias", f"{key!r} is not a token id; give each key as a token id in a string, "
                                  "e.g. {\"50256\": -100}")
        return bias

    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def settings(self) -> dict[str, Any]:
        """The decoding settings as `requested` takes them."""
        bias = {int(key): value for key, value in (self.logit_bias or {}).items()}
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": max(self.top_k, 0),
                "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
                "logit_bias": bias, "stop": self.stops(), "seed": self.seed}


class CompletionRequest(DecodingRequest):
    prompt: str | list[str] = Field(description="one prompt or several; \"\" starts from the start token")
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = Field(None, description="false only: the prompt is not echoed")
    suffix: str | None = Field(None, description="null or \"\" only: no insertion before a suffix")
    best_of: int | None = Field(None, description="n only: every choice drawn is returned")

    @model_validator(mode="after")
    def _prompts(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ConfigError("prompt", "give a prompt or a non-empty list of prompts")
        _only_neutral(self, {"echo": ((None, False), "leave echo out or false: the text holds the new tokens only"),
                             "suffix": ((None, ""), "leave suffix out: the server continues prompts, it does not "
                                                    "insert text"),
                             "best_of": ((None, self.n), "leave best_of out or equal to n: every choice drawn is "
                                                         "returned")})
        return self

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(description="\"developer\" is read "
                                                                                          "as \"system\"")
    content: str | list[TextPart] | None = Field(description="the text, or text parts, which are joined; null only "
                                                             "in an assistant message with tool_calls")
    name: str | None = Field(None, description="accepted; the chat template is not given it")
    refusal: str | None = Field(None, description="null only (an assistant message sent back as it came)")
    tool_calls: list[ToolCallSpec] | None = Field(None, description="an assistant's calls, as the answer gave them")
    tool_call_id: str | None = Field(None, description="a tool message's: the id of the call it answers")
    function_call: dict | None = Field(None, description="null only: the server calls no functions")
    audio: dict | None = Field(None, description="null only: the server reads text only")

    @model_validator(mode="after")
    def _text_only(self) -> ChatMessage:
        _only_neutral(self, {"refusal": ((None,), "send an assistant's refusal as its content"),
                             "function_call": ((None,), "send tool_calls instead of the older function_call"),
                             "audio": ((None,), "the server reads text only: leave audio out")})
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ConfigError("content", "give the message's text (null only in an assistant message with tool_calls)")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ConfigError("tool_call_id", "a tool message gives the id of the call it answers, and only a tool "
                              "message does")
        if self.tool_calls and self.role != "assistant":
            raise ConfigError("tool_calls", "only an assistant message holds tool_calls")
        return self

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: object) -> object:
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ConfigError("content", f"this server reads text only: give each part as {{\"type\": \"text\", "
                                  f"\"text\": ...}}, not a {kind!r} part")
        return content

    def plain(self) -> dict[str, Any]:
        """The message as a chat template reads it: a role, the text, and an assistant's calls or the id of the
        call a tool message answers."""
        text = self.content if isinstance(self.content, str | None) else "".join(part.text for part in self.content)
        plain: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            plain["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            plain["tool_call_id"] = self.tool_call_id
        return plain


class ChatCompletionRequest(DecodingRequest):
    messages: list[ChatMessage] = Field(min_length=1, description="the conversation, oldest first")
    max_completion_tokens: int | None = Field(None, ge=1, description="default: 200, fewer when the positions run out")
    max_tokens: int | None = Field(None, ge=1, description="the older name of max_completion_tokens")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: the most likely tokens of each step")
    tools: list[ToolSpec] | None = Field(None, description="the functions the model may call")
    tool_choice: str | dict | None = Field(None, description="\"none\", \"auto\" (the default with tools), "
                                           "\"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    parallel_tool_calls: bool | None = Field(None, description="accepted; a forced answer is one call")
    modalities: list[str] | None = Field(None, description="[\"text\"] only")
    store: bool | None = Field(None, description="accepted; nothing is stored")
    metadata: dict[str, str] | None = Field(None, description="accepted; changes nothing")
    service_tier: str | None = Field(None, description="accepted; every request is served alike")
    prompt_cache_key: str | None = Field(None, description="accepted; changes nothing")
    prompt_cache_retention: str | None = Field(None, description="accepted; changes nothing")
    safety_identifier: str | None = Field(None, description="accepted; changes nothing")

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        check_tool_choice(self.tool_list(), self.tool_choice)
        _only_neutral(self, {"modalities": ((None, ["text"]), "it answers in text only: leave modalities out or "
                                            "send [\"text\"]")})
        if self.top_logprobs is not None and not self.logprobs:
            raise ConfigError("top_logprobs", "needs logprobs: true")
        return self

    def conversation(self) -> list[dict[str, Any]]:
        return [message.plain() for message in self.messages]

    def tool_list(self) -> list[dict[str, Any]]:
        """The tools as plain OpenAI tool objects, without the fields left out."""
        return [tool.model_dump(exclude_none=True) for tool in self.tools or []]

    def limit(self) -> int | None:
        """The most new tokens: `max_completion_tokens`, else `max_tokens`, else None (the server's default)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class EmbeddingRequest(Request):
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: the little-endian float32 "
                                                                             "bytes of each vector, in base64")
    user: str | None = Field(None, description="accepted; changes nothing")

    @model_validator(mode="after")
    def _some_text(self) -> EmbeddingRequest:
        if not self.texts() or not all(t.strip() for t in self.texts()):
            raise ConfigError("input", "give a non-blank text or a non-empty list of them")
        return self

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class TranslateRequest(TextsRequest):
    beam_size: int = Field(4, ge=1, le=64)
    length_penalty: float = 0.6
    n_best: int = Field(1, ge=1, description="<= beam_size")
    max_tokens: int | None = Field(None, ge=1)
    alignment: bool = False


class ClassifyRequest(TextsRequest):
    pairs: list[str] | None = Field(None, description="a sentence-pair classifier's second text of each input")
    pair: str | None = Field(None, description="a sentence-pair classifier's second text of `input`")

    @model_validator(mode="after")
    def _a_pair_per_text(self) -> ClassifyRequest:
        seconds, name = self.second_texts(), "pairs" if self.pairs is not None else "pair"
        if seconds is None:
            return self
        if len(seconds) != len(self.texts()):
            raise ConfigError(name, f"{len(self.texts())} inputs but {len(seconds)} second texts; give one second "
                             "text per input (pairs with inputs, or pair with input)")
        if not all(t.strip() for t in seconds):
            raise ConfigError(name, "every second text must hold a non-blank character")
        return self

    def second_texts(self) -> list[str] | None:
        """The second texts (`pairs`, or `pair` alone), None when the request has none."""
        return self.pairs if self.pairs is not None else [self.pair] if self.pair is not None else None


class AttentionRequest(Request):
    text: str = Field(min_length=1)
    kind: Literal["encoder", "decoder", "cross", "self"] = "self"
    layer: int | None = Field(None, description="null: every layer")
    head: int | str | None = Field(None, description="one head (0, 1, ...); \"mean\": the mean over heads; null: "
                                                     "every head")
    pool: int | None = Field(None, ge=1, le=4096, description="at most pool x pool cells per map, each the largest "
                                                              "weight of its block of queries and keys")
    format: Literal["float", "uint16"] = Field("float", description="uint16: each map as base64 of little-endian "
                                                                    "uint16, a row's weights in 65535ths of its scale")

    @model_validator(mode="after")
    def _a_head_or_the_mean(self) -> AttentionRequest:
        if isinstance(self.head, str) and self.head != "mean" or isinstance(self.head, int) and self.head < 0:
            raise ConfigError("head", f"{self.head!r} is not a head: give a head's number (0 or more), \"mean\" for "
                              "the mean over heads, or null for every head")
        return self

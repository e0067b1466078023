"""Request and response bodies of the HTTP API (docs/serve-api.md), as pydantic models.

Requests are strict (a string where a number goes is a 422, not a conversion) and ignore fields
they do not know, as OpenAI clients send some (`user`, `presence_penalty`, ...).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attn.data.text import check_unicode
from attn.core.errors import ConfigError

MAX_SEED = 2**63 - 1  # seed + j (j < n) must fit the 64 bits of torch's generators


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = Field(None, description="a served model's name; may be left out when only one is served")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, body: object) -> object:
        """Refuses a string anywhere in the body that is not valid Unicode (an unpaired surrogate
        escape, which JSON allows), naming its field: `messages.0.content`, `inputs.1`."""
        _check_strings(body, "")
        return body


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


class DecodingRequest(Request):
    """The decoding settings that completions and chat completions share."""

    temperature: float = Field(1.0, ge=0, description="0: greedy decoding")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0: off")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="seeds choice j of each prompt with seed + j")
    n: int = Field(1, ge=1, le=16, description="choices per prompt")
    stream: bool = False
    attention: AttentionOption | None = Field(None, description="stream: send the attention with which each token "
                                                                "was chosen")

    @model_validator(mode="after")
    def _stops(self) -> DecodingRequest:
        if isinstance(self.stop, str) and not self.stop or isinstance(self.stop, list) and not all(self.stop):
            raise ConfigError("stop", "stop strings must not be empty")
        return self

    @model_validator(mode="after")
    def _attention_streamed(self) -> DecodingRequest:
        if self.attention is not None and not self.stream:
            raise ConfigError("attention", "is sent with streamed tokens only; set stream: true")
        return self

    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(DecodingRequest):
    prompt: str | list[str] = Field(description="one prompt or several; \"\" starts from the start token")
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)

    @model_validator(mode="after")
    def _prompts(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ConfigError("prompt", "give a prompt or a non-empty list of prompts")
        return self

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant"] = Field(description="\"developer\" is read as "
                                                                                   "\"system\"")
    content: str | list[TextPart] = Field(description="the text, or text parts, which are joined")

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: object) -> object:
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ConfigError("content", f"this server reads text only: give each part as {{\"type\": \"text\", "
                                  f"\"text\": ...}}, not a {kind!r} part")
        return content

    def plain(self) -> dict[str, str]:
        """The message as a chat template reads it: a role and the text."""
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = Field(False, description="a last chunk, before [DONE], with the usage and no choices")


class ChatCompletionRequest(DecodingRequest):
    messages: list[ChatMessage] = Field(min_length=1, description="the conversation, oldest first")
    max_completion_tokens: int | None = Field(None, ge=1, description="default: 200, fewer when the positions run out")
    max_tokens: int | None = Field(None, ge=1, description="the older name of max_completion_tokens")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: the most likely tokens of each step")
    stream_options: StreamOptions | None = None
    tools: list | None = Field(None, description="not supported: a request with tools is refused")

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        if self.tools:
            raise ConfigError("tools", "this server does not call tools; leave tools out")
        if self.top_logprobs is not None and not self.logprobs:
            raise ConfigError("top_logprobs", "needs logprobs: true")
        if self.stream_options is not None and not self.stream:
            raise ConfigError("stream_options", "applies to streamed answers only; set stream: true")
        return self

    def conversation(self) -> list[dict[str, str]]:
        return [message.plain() for message in self.messages]

    def limit(self) -> int | None:
        """The most new tokens: `max_completion_tokens`, else `max_tokens`, else None (the server's default)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class Logprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: Logprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Usage(EmbeddingUsage):
    completion_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class EmbeddingRequest(Request):
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: the little-endian float32 "
                                                                             "bytes of each vector, in base64")

    @model_validator(mode="after")
    def _some_text(self) -> EmbeddingRequest:
        if not self.texts() or not all(t.strip() for t in self.texts()):
            raise ConfigError("input", "give a non-blank text or a non-empty list of them")
        return self

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class TranslateRequest(TextsRequest):
    beam_size: int = Field(4, ge=1, le=64)
    length_penalty: float = 0.6
    n_best: int = Field(1, ge=1, description="<= beam_size")
    max_tokens: int | None = Field(None, ge=1)
    alignment: bool = False


class Scored(BaseModel):
    text: str
    score: float


class Alignment(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str]
    weights: list[list[float]] = Field(description="target x source")


class TranslationOut(BaseModel):
    text: str
    n_best: list[Scored]
    alignment: Alignment | None = None


class TranslateResponse(BaseModel):
    model: str
    translations: list[TranslationOut]


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


class ClassifyResult(BaseModel):
    label: str
    score: float
    probabilities: dict[str, float]


class ClassifyResponse(BaseModel):
    model: str
    results: list[ClassifyResult]


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


class AttentionResponse(BaseModel):
    model: str
    kind: str
    layers: int
    heads: int
    kv_heads: int
    groups: list[int] = Field(description="the key/value head each query head shares")
    queries: list[str]
    keys: list[str]
    target: str | None
    format: Literal["float", "uint16"]
    weights: list[list[list[list[float]]]] | list[list[str]] = Field(
        description="float: [layer][head][row][col]; uint16: [layer][head] base64 of rows x cols uint16")
    scales: list[list[list[float]]] | None = Field(description="uint16: [layer][head][row] the largest weight of "
                                                               "each row, which 65535 stands for")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "attn"
    task: str
    architecture: str
    max_positions: int
    layers: int
    decoder_layers: int | None
    heads: int
    kv_heads: int = Field(description="key/value heads, each shared by a group of heads // kv_heads query heads")
    head_groups: list[int] = Field(description="the key/value head each query head shares")
    labels: list[str]
    pairs: bool = Field(False, description="a sentence-pair classifier: /v1/classify needs a second text per input")
    chat: bool = Field(False, description="a decoder-only model with a chat template: it serves /v1/chat/completions")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "draining"]
    models: list[str]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(BaseModel):
    error: ErrorDetail

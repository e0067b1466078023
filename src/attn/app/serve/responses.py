"""Response bodies of the HTTP API (docs/serve-api.md), as pydantic models: the schema at /docs describes them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from attn.app.serve.tool_schemas import ToolCallSpec


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
    content: str | None = Field(description="null when the answer is calls only")
    tool_calls: list[ToolCallSpec] | None = Field(None, description="the functions the answer calls")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


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


class ClassifyResult(BaseModel):
    label: str
    score: float
    probabilities: dict[str, float]


class ClassifyResponse(BaseModel):
    model: str
    results: list[ClassifyResult]


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
    parent: str | None = Field(None, description="the served base model of a LoRA adapter's model (attn serve --lora)")


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

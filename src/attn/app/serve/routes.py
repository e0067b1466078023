"""The HTTP routes of docs/serve-api.md: each checks its request, builds an engine job and submits it.

Model work never runs here (it runs on the model's engine thread, see `engine` and `work`); a
route only validates, tokenizes to count and check, and turns the job's result into the response.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from torch import Tensor

from attn.inference.classification import Prediction
from attn.inference.continuation import prompt_ids
from attn.app.serve.access import check_choices, held_to_cap, timed_out, token_limit
from attn.app.serve.answers import Answer, ChatCompletion, Completion, rounded
from attn.app.serve.engine import BatchJob, Closed, Engine, RowsJob
from attn.app.serve.errors import ApiError, error_body, log
from attn.app.serve.format_schemas import grammar_of
from attn.app.serve.gate import Traffic
from attn.app.serve.prometheus import ServeMetrics
from attn.app.serve.options import ServeOptions
from attn.app.serve.served_models import ServedModel
from attn.app.serve.tool_answers import ToolChatCompletion
from attn.app.serve.responses import (
    AttentionResponse,
    ChatCompletionResponse,
    ClassifyResponse,
    CompletionResponse,
    EmbeddingResponse,
    ErrorBody,
    Health,
    ModelList,
    TranslateResponse,
)
from attn.app.serve.schemas import (
    AttentionRequest,
    ChatCompletionRequest,
    ClassifyRequest,
    CompletionRequest,
    DecodingRequest,
    EmbeddingRequest,
    TranslateRequest,
)
from attn.app.serve.work import (
    Chunk,
    Translation,
    attention_job,
    classify_job,
    completion_rows,
    embed_job,
    translate_job,
)
from attn.decoding import GenerationConfig, check_samples, requested
from attn.decoding.attention_maps import layer_count
from attn.core.errors import AttnError
from attn.inference.tools import ToolUse

PAGE = Path(__file__).parent / "static" / "index.html"


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The schema's answers of `statuses`, each the one error shape."""
    return {status: {"model": ErrorBody} for status in statuses}


# Every status a route may answer besides 200 (a guarded route's 401 and the per-key 429 included: the schema
# describes a server with keys and limits).
ERRORS = _errors(400, 401, 404, 413, 422, 429, 500, 503, 504)
# A server-sent event of a streamed answer (OpenAPI 3.1: the schema of an event stream describes one event).
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {
    "type": "string", "description": "a chunk as JSON (the answer's shape with one token's delta; an error body when "
    "the answer fails once started), or [DONE] last"}}}
STREAMED = {**ERRORS, 200: {"description": "the answer; with stream: true, server-sent events of its chunks",
                            "content": {"text/event-stream": {"schema": _EVENT}}}}
# Library field names that the API calls otherwise.
_PARAMS = {"samples": "n", "max_new_tokens": "max_tokens", "grammar": "response_format"}
# The most attention weights one /v1/attention answer holds: one 1,448-token map (2,097,152 weights: at most
# 9 bytes each as floats, 8/3 as uint16), or every head of a layer pooled to 128 x 128 for a model of up to 128 heads.
MAX_ATTENTION_WEIGHTS = 2**21
_UINT16_TOP = 65535
T = TypeVar("T")

router = APIRouter()


@dataclasses.dataclass
class ServeState:
    """What the routes share: the served models, each one's engine, the metrics, the traffic gate and the
    server's settings."""

    models: dict[str, ServedModel]
    engines: dict[str, Engine]
    metrics: ServeMetrics
    traffic: Traffic
    options: ServeOptions


def _state(request: Request) -> ServeState:
    return request.app.state.serve


def _served(request: Request, name: str | None, route: str) -> ServedModel:
    """The model a request names (or the only one), checked to serve `route`."""
    models = _state(request).models
    names = ", ".join(models)
    if name is None:
        if len(models) != 1:
            raise ApiError(422, f"model: this server serves several models ({names}); name one", "model")
        name = next(iter(models))
    if name not in models:
        raise ApiError(404, f"model {name!r} is not served here; the served models are: {names}", "model")
    served = models[name]
    request.state.model = name
    needs = served.can(route)
    if needs:
        raise ApiError(400, f"model {name!r} (task {served.bundle.task}, {served.card()['architecture']}) cannot "
                       f"serve /v1/{route}, which needs {needs}; choose another model (GET /v1/models)", "model")
    return served


def _checked(make: Callable[[], T], param: str) -> T:
    """`make()`, with a user's mistake it reports (an AttnError) as a 422 naming the request field."""
    try:
        return make()
    except AttnError as error:
        raise _invalid(error, param) from None


async def _run(request: Request, served: ServedModel, job: BatchJob, param: str) -> Any:
    """The result of `job` on the served model's engine; a mistake it finds is a 422 naming `param`, a job past the
    server's --request-timeout a 504 (leaving the queue, see `engine`)."""
    state = _state(request)
    try:
        async with asyncio.timeout(state.options.request_timeout_s):
            return await state.engines[served.name].submit(job)
    except AttnError as error:
        raise _invalid(error, param) from None
    except TimeoutError:
        raise timed_out(state.options) from None


def _deadline(request: Request) -> float | None:
    """When a request that starts now must end (the event loop's clock), or None: no --request-timeout."""
    timeout = _state(request).options.request_timeout_s
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


def _invalid(error: AttnError, param: str) -> ApiError:
    """A 422 naming the request field the error concerns, else `param`; a closed engine's 503."""
    if isinstance(error, Closed):
        return ApiError(503, str(error))
    detail = error.detail.replace("max_new_tokens", "max_tokens")  # the fix in the API's words
    if error.field is None:
        return ApiError(422, detail, param)
    field = _PARAMS.get(error.field, error.field)
    return ApiError(422, f"{field}: {detail}", field)


# -- completions and chat completions -----------------------------------------------------------


def _decoding_config(request: Request, body: DecodingRequest, served: ServedModel, max_tokens: int | None,
                     prompt_length: int | None = None, chat: bool = False) -> GenerationConfig:
    """What the body asks (`requested`: temperature 0 is greedy decoding, top_p, top_k and min_p then do nothing)
    under the model's rules (`Bundle.generation_config`); `n` within the server's --max-n."""
    check_choices(_state(request).options, body.n)
    asked = requested(**body.settings(), max_new_tokens=max_tokens, grammar=grammar_of(body.response_format))
    config = served.bundle.generation_config(asked, prompt_length=prompt_length, chat=chat)
    check_samples(body.n, config)
    return config


def _rows(served: ServedModel, route: str, prompts: list[list[int]], config: GenerationConfig, n: int,
          logprobs: int, attention: tuple[int, int | None] | None = None) -> RowsJob:
    """The running batch's rows of a request: `n` choices per prompt, choice j of a prompt seeded with seed + j."""
    seeds = [None if config.seed is None else config.seed + j for j in range(n)]
    configs = [dataclasses.replace(config, seed=seed) for _ in prompts for seed in seeds]
    return completion_rows(served, [p for p in prompts for _ in seeds], configs, logprobs, attention, route)


def _token_attention(served: ServedModel, body: DecodingRequest) -> tuple[int, int | None] | None:
    """(layer, head) of the attention each streamed token carries, checked against the model; None when not asked."""
    if body.attention is None:
        return None
    _check_layer_head(served, "self", body.attention.layer, body.attention.head, "attention.")
    return body.attention.layer, body.attention.head


def _completion(request: Request, body: CompletionRequest) -> Completion:
    served = _served(request, body.model, "completions")
    options = _state(request).options
    asked = "max_tokens" in body.model_fields_set  # else its default, which the cap holds rather than refuses
    limit = token_limit(options, body.max_tokens, "max_tokens") if asked else held_to_cap(options, body.max_tokens)
    config = _checked(lambda: _decoding_config(request, body, served, limit), "prompt")
    attention = _token_attention(served, body)
    ids = _checked(lambda: [prompt_ids(served.bundle, p) for p in body.prompts()], "prompt")
    rows = _rows(served, "completions", ids, config, body.n, body.logprobs or 0, attention)
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": served.name}
    prompts = [p for p in body.prompts() for _ in range(body.n)]
    return Completion(served, rows, head, "prompt", sum(map(len, ids)), attention, body.include_usage(), prompts,
                      body.logprobs is not None)


def _chat_completion(request: Request, body: ChatCompletionRequest) -> ChatCompletion:
    served = _served(request, body.model, "chat/completions")
    bundle = served.bundle
    attention = _token_attention(served, body)
    template = bundle.compiled_chat_template()  # compiled when the model was loaded
    tools = _checked(lambda: ToolUse.of(template, body.tool_list(), body.tool_choice), "tool_choice")
    prompt = _checked(lambda: prompt_ids(bundle, tools.prompt(template, body.conversation())), "messages")
    options = _state(request).options
    asked = token_limit(options, body.limit(), "max_tokens" if body.max_completion_tokens is None
                        else "max_completion_tokens")
    config = _checked(lambda: _decoding_config(request, body, served, asked, len(prompt), chat=True), "messages")
    config = _checked(lambda: tools.applied(config), "tools")
    if asked is None:  # the model's default limit, held to the server's cap
        config = dataclasses.replace(config, max_new_tokens=held_to_cap(options, config.max_new_tokens))
    top = (body.top_logprobs or 0) if body.logprobs else 0
    rows = _rows(served, "chat/completions", [prompt], config, body.n, top, attention)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": served.name}
    answer = functools.partial(ToolChatCompletion, use=tools) if tools.calls else ChatCompletion
    return answer(served, rows, head, "messages", len(prompt), attention, body.include_usage(), body.logprobs)


@router.post("/v1/completions", response_model=CompletionResponse, responses=STREAMED,
             summary="Continue prompts with a decoder-only model (OpenAI completions; stream: server-sent events)")
async def completions(body: CompletionRequest, request: Request) -> Any:
    return await _respond(request, time.monotonic(), _completion(request, body), body.stream)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=STREAMED,
             summary="Answer a conversation with a chat model, through its chat template (OpenAI chat completions; "
             "stream: server-sent events)")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    return await _respond(request, time.monotonic(), _chat_completion(request, body), body.stream)


async def _respond(request: Request, started: float, answer: Answer, streamed: bool) -> Any:
    """Runs the answer's rows in the model's running batch: the whole answer, or its server-sent events; past the
    server's --request-timeout the rows leave the batch, and the answer is a 504 (or a stream's last event)."""
    state = _state(request)
    deadline = _deadline(request)
    try:  # the first token before the answer starts, so that a prompt's mistake is still an error status
        chunks = state.engines[answer.served.name].submit_stream(answer.rows)
        async with asyncio.timeout_at(deadline):
            first = await anext(chunks)
            state.metrics.first_token.labels(model=answer.served.name).observe(time.monotonic() - started)
            if not streamed:
                return answer.answer([first, *[chunk async for chunk in chunks]])
    except AttnError as error:
        raise _invalid(error, answer.param) from None
    except TimeoutError:
        raise timed_out(state.options) from None
    return StreamingResponse(_events(answer, first, chunks, deadline, state.options), media_type="text/event-stream")


async def _events(answer: Answer, first: Chunk, chunks: AsyncIterator[Chunk], deadline: float | None,
                  options: ServeOptions) -> AsyncIterator[str]:
    chunk: Chunk | None = first
    tokens = 0
    try:
        while chunk is not None:
            yield _event(answer.event(chunk))
            tokens += 1
            async with asyncio.timeout_at(deadline):  # around the wait only: a yield may not leave its scope
                chunk = await anext(chunks, None)
        last = answer.usage_event(tokens)
        if last is not None:
            yield _event(last)
        yield "data: [DONE]\n\n"
    except TimeoutError:
        expired = timed_out(options)
        yield _event(error_body(expired.status, expired.message))
    except Exception:  # the status went out with the first event: the error goes in the stream
        log.exception("internal error in a completion stream")
        yield _event(error_body(500, "internal error while streaming; the server log has the details"))
    finally:
        await chunks.aclose()


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


# -- translation, embeddings, classification ----------------------------------------------------


@router.post("/v1/translate", response_model=TranslateResponse, responses=ERRORS,
             summary="Translate with an encoder-decoder (beam search, n best, alignment)")
async def translate(body: TranslateRequest, request: Request) -> Any:
    served = _served(request, body.model, "translate")
    options = _state(request).options
    asked = token_limit(options, body.max_tokens, "max_tokens")
    limit = asked if asked is not None or options.max_tokens_cap is None else held_to_cap(options, served.max_positions)
    config = _checked(lambda: GenerationConfig(beam_size=body.beam_size, length_penalty=body.length_penalty,
                                               n_best=body.n_best, max_new_tokens=limit), "inputs")
    if body.max_tokens is not None and body.max_tokens > served.max_positions:
        raise ApiError(422, f"max_tokens: {body.max_tokens} is more than the model's max_positions="
                       f"{served.max_positions}; ask for at most {served.max_positions}", "max_tokens")
    job = _checked(lambda: translate_job(served, body.texts(), config, body.alignment), "inputs")
    found: list[Translation] = await _run(request, served, job, "inputs")
    return {"model": served.name, "translations": [_translation(t) for t in found]}


def _translation(found: Translation) -> dict[str, Any]:
    aligned = None
    if found.alignment is not None:
        aligned = {"source_tokens": found.source_tokens, "target_tokens": found.target_tokens,
                   "weights": found.alignment.tolist()}
    return {"text": found.hypotheses[0][0], "n_best": [{"text": t, "score": s} for t, s in found.hypotheses],
            "alignment": aligned}


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS,
             summary="Sentence embeddings of an encoder (mean-pooled, L2-normalised; OpenAI embeddings)")
async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
    served = _served(request, body.model, "embeddings")
    job = embed_job(served, body.texts())
    vectors = await _run(request, served, job, "input")
    tokens = sum(job.sizes)
    return {"object": "list", "model": served.name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(_encoded(vectors, body))]}


def _encoded(vectors: Tensor, body: EmbeddingRequest) -> list[list[float]] | list[str]:
    """The vectors as lists of numbers, or as base64 of their little-endian float32 bytes (what the `openai`
    client asks for unless told otherwise)."""
    if body.encoding_format == "float":
        return vectors.tolist()
    rows = vectors.float().numpy().astype("<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]


@router.post("/v1/classify", response_model=ClassifyResponse, responses=ERRORS,
             summary="Label texts with a trained classifier")
async def classify(body: ClassifyRequest, request: Request) -> Any:
    served = _served(request, body.model, "classify")
    pairs = _pairs(served, body)
    job = _checked(lambda: classify_job(served, body.texts(), pairs), "pairs")
    found: list[Prediction] = await _run(request, served, job, "inputs")
    return {"model": served.name, "results": [{"label": p.label, "score": p.probability,
                                               "probabilities": p.probabilities} for p in found]}


def _pairs(served: ServedModel, body: ClassifyRequest) -> list[str] | None:
    """The request's second texts, which a sentence-pair classifier needs and any other refuses (400)."""
    pairs, fields = body.second_texts(), served.bundle.fields
    if served.takes_pairs and pairs is None:
        raise ApiError(400, f"model {served.name!r} classifies sentence pairs ({fields.text_field}, "
                       f"{fields.text_pair_field}); send pairs: the second text of each input (or pair with input)",
                       "pairs")
    if not served.takes_pairs and pairs is not None:
        raise ApiError(400, f"model {served.name!r} classifies single texts ({fields.text_field}); leave out pairs "
                       "and pair, or choose a sentence-pair classifier (\"pairs\": true in GET /v1/models)", "pairs")
    return pairs


# -- attention ----------------------------------------------------------------------------------


def _check_layer_head(served: ServedModel, kind: str, layer: int | None, head: int | None, prefix: str = "") -> None:
    """422 unless the model has attention of `kind`, and the layer and head exist."""
    layers = _checked(lambda: layer_count(served.bundle.model, kind), "kind")
    if layer is not None and not -layers <= layer < layers:
        raise ApiError(422, f"{prefix}layer: layer {layer} does not exist; the {kind} attention of {served.name!r} "
                       f"has layers 0..{layers - 1} (negative counts from the last)", f"{prefix}layer")
    heads = served.bundle.model_config.heads
    if head is not None and head >= heads:
        raise ApiError(422, f"{prefix}head: head {head} does not exist; {served.name!r} has heads 0..{heads - 1}",
                       f"{prefix}head")


@router.post("/v1/attention", response_model=AttentionResponse, responses=ERRORS,
             summary="Attention weights of any model on a text: one layer or all, one head, all or their mean")
async def attention(body: AttentionRequest, request: Request) -> Any:
    served = _served(request, body.model, "attention")
    _check_layer_head(served, body.kind, body.layer, None if body.head == "mean" else body.head)
    job = attention_job(served, body.text, body.kind, body.layer, body.head, body.pool, MAX_ATTENTION_WEIGHTS)
    (found,) = await _run(request, served, job, "text")
    layout = found.layout
    return {"model": served.name, "kind": body.kind, "layers": found.layers, "heads": layout.heads,
            "kv_heads": layout.kv_heads, "groups": list(layout.groups), "queries": found.queries, "keys": found.keys,
            "target": found.target, "format": body.format, **_maps(found.weights, body.format)}


def _maps(weights: Tensor, form: str) -> dict[str, Any]:
    """{"weights", "scales"} of (layers, heads, rows, cols) maps: nested floats, or each map as base64 of
    little-endian uint16 with each row's largest weight as its scale (a weight w is sent as
    round(65535 w / scale), so it comes back within scale / 131070 of what it was)."""
    if form == "float":
        return {"weights": rounded(weights), "scales": None}
    scales = weights.float().amax(-1, keepdim=True)  # (L, H, R, 1)
    levels = (weights.float() / scales.clamp(min=torch.finfo(torch.float32).tiny) * _UINT16_TOP).round()
    data = levels.to(torch.int32).numpy().astype("<u2")
    return {"weights": [[base64.b64encode(data[i, h].tobytes()).decode("ascii") for h in range(data.shape[1])]
                        for i in range(data.shape[0])],
            "scales": scales[..., 0].tolist()}


# -- the server itself --------------------------------------------------------------------------


@router.get("/v1/models", response_model=ModelList, responses=_errors(401, 413, 429, 500, 503),
            summary="The served models")
async def models(request: Request) -> Any:
    return {"object": "list", "data": [served.card() for served in _state(request).models.values()]}


@router.get("/health", response_model=Health, responses={**_errors(413, 500), 503: {"model": Health}},
            summary="ok while serving; 503 draining once the server was told to stop")
async def health(request: Request) -> Any:
    state = _state(request)
    draining = state.traffic.draining
    return JSONResponse({"status": "draining" if draining else "ok", "models": list(state.models)},
                        status_code=503 if draining else 200)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={**_errors(401, 413, 500), 200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.text(), media_type=CONTENT_TYPE_LATEST)


@router.get("/", summary="The page that talks to these routes", response_class=FileResponse,
            responses={**_errors(404, 413, 500, 503), 200: {"content": {"text/html": {"schema": {"type": "string"}}}}})
async def page() -> FileResponse:
    if not PAGE.exists():
        raise ApiError(404, "the page is not part of this installation; the API routes are listed at /docs")
    return FileResponse(PAGE, media_type="text/html")

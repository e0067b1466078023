"""The HTTP routes of docs/serve-api.md: each checks its request, builds an engine job and submits it.

Model work never runs here (it runs on the model's engine thread, see `engine` and `work`); a
route only validates, tokenizes to count and check, and turns the job's result into the response.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from attn.app.classification import Prediction
from attn.app.continuation import check_samples, prompt_ids
from attn.app.serve.errors import ApiError, error_body, log
from attn.app.serve.gate import Traffic
from attn.app.serve.metrics import ServeMetrics
from attn.app.serve.registry import ServedModel
from attn.app.serve.engine import BatchJob, Closed, Engine, RowsJob
from attn.app.serve.schemas import (
    AttentionRequest,
    AttentionResponse,
    ClassifyRequest,
    ClassifyResponse,
    CompletionRequest,
    CompletionResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorBody,
    Health,
    ModelList,
    TranslateRequest,
    TranslateResponse,
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
from attn.decoding import GenerationConfig
from attn.decoding.attention_maps import layer_count
from attn.errors import AttnError

PAGE = Path(__file__).parent / "static" / "index.html"
ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": ErrorBody} for status in (400, 404, 413, 422, 429, 500, 503)}
# Library field names that the API calls otherwise.
_PARAMS = {"samples": "n", "max_new_tokens": "max_tokens"}
T = TypeVar("T")

router = APIRouter()


@dataclasses.dataclass
class ServeState:
    """What the routes share: the served models, each one's engine, the metrics and the traffic gate."""

    models: dict[str, ServedModel]
    engines: dict[str, Engine]
    metrics: ServeMetrics
    traffic: Traffic


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
    """The result of `job` on the served model's engine; a mistake it finds is a 422 naming `param`."""
    try:
        return await _state(request).engines[served.name].submit(job)
    except AttnError as error:
        raise _invalid(error, param) from None


def _invalid(error: AttnError, param: str) -> ApiError:
    """A 422 naming the request field the error concerns, else `param`; a closed engine's 503."""
    if isinstance(error, Closed):
        return ApiError(503, str(error))
    detail = error.detail.replace("max_new_tokens", "max_tokens")  # the fix in the API's words
    if error.field is None:
        return ApiError(422, detail, param)
    field = _PARAMS.get(error.field, error.field)
    return ApiError(422, f"{field}: {detail}", field)


# -- completions --------------------------------------------------------------------------------


def _completion_config(body: CompletionRequest) -> GenerationConfig:
    """Temperature 0 is greedy decoding (top_p and top_k then do nothing)."""
    sample = body.temperature > 0
    config = GenerationConfig(max_new_tokens=body.max_tokens, sample=sample, stop=body.stops(), seed=body.seed,
                              **({"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
                                 if sample else {}))
    check_samples(body.n, config)
    return config


@dataclasses.dataclass
class _Completion:
    """A completion request, checked: its model, its rows (one per choice) and how to answer.

    Attributes:
        prompts: the prompt of each choice (choice i * n + j is sample j of prompt i).
        prompt_tokens: the prompts' tokens, each prompt counted once.
        logprobs: whether the choices carry logprobs.
        attention: (layer, head) of the attention sent with each streamed token, or None.
    """

    served: ServedModel
    rows: RowsJob
    head: dict[str, Any]
    prompts: list[str]
    prompt_tokens: int
    logprobs: bool
    attention: tuple[int, int | None] | None

    def choice(self, chunks: list[Chunk]) -> dict[str, Any]:
        """One choice from all its chunks."""
        index = chunks[0].index
        return {"text": "".join(c.token.text for c in chunks), "index": index,
                "logprobs": self._logprobs(chunks, len(self.prompts[index])), "finish_reason": chunks[-1].token.finish}

    def event(self, chunk: Chunk, offset: int) -> str:
        """The server-sent event of one chunk, whose text starts at `offset` in prompt + text."""
        choice = {"text": chunk.token.text, "index": chunk.index, "logprobs": self._logprobs([chunk], offset),
                  "finish_reason": chunk.token.finish}
        body: dict[str, Any] = {**self.head, "choices": [choice]}
        if chunk.attention is not None and self.attention is not None:
            layer, head = self.attention
            body["attention"] = {"layer": layer, "head": head, "token": self._decode([chunk.token.id]),
                                 "keys": chunk.attention.keys, "weights": chunk.attention.weights}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def _decode(self, ids: list[int]) -> str:
        return self.served.bundle.tokenizer.decode(ids)

    def _logprobs(self, chunks: list[Chunk], offset: int) -> dict[str, list] | None:
        if not self.logprobs:
            return None
        offsets = []
        for chunk in chunks:
            offsets.append(offset)
            offset += len(chunk.token.text)
        return {"tokens": [self._decode([c.token.id]) for c in chunks],
                "token_logprobs": [c.token.logprob for c in chunks],
                "top_logprobs": [{self._decode([i]): p for i, p in c.token.top} for c in chunks],
                "text_offset": offsets}


def _completion(request: Request, body: CompletionRequest) -> _Completion:
    served = _served(request, body.model, "completions")
    config = _checked(lambda: _completion_config(body), "prompt")
    attention = None
    if body.attention is not None:
        _check_layer_head(served, "self", body.attention.layer, body.attention.head, "attention.")
        attention = (body.attention.layer, body.attention.head)
    ids = _checked(lambda: [prompt_ids(served.bundle, p) for p in body.prompts()], "prompt")
    seeds = [None if config.seed is None else config.seed + j for j in range(body.n)]
    configs = [dataclasses.replace(config, seed=seed) for _ in ids for seed in seeds]
    rows = completion_rows(served, [p for p in ids for _ in seeds], configs, body.logprobs or 0, attention)
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": served.name}
    prompts = [p for p in body.prompts() for _ in seeds]
    return _Completion(served, rows, head, prompts, sum(map(len, ids)), body.logprobs is not None, attention)


@router.post("/v1/completions", response_model=CompletionResponse, responses=ERRORS,
             summary="Continue prompts with a decoder-only model (OpenAI completions; stream: server-sent events)")
async def completions(body: CompletionRequest, request: Request) -> Any:
    started = time.monotonic()
    completion = _completion(request, body)
    state = _state(request)
    chunks = state.engines[completion.served.name].submit_stream(completion.rows)
    try:  # the first token before the answer starts, so that a prompt's mistake is still an error status
        first = await anext(chunks)
    except AttnError as error:
        raise _invalid(error, "prompt") from None
    state.metrics.first_token.labels(model=completion.served.name).observe(time.monotonic() - started)
    if body.stream:
        return StreamingResponse(_events(completion, first, chunks), media_type="text/event-stream")
    found = [first, *[chunk async for chunk in chunks]]
    choices = [completion.choice([c for c in found if c.index == i]) for i in range(len(completion.prompts))]
    used = completion.prompt_tokens
    return {**completion.head, "choices": choices,
            "usage": {"prompt_tokens": used, "completion_tokens": len(found), "total_tokens": used + len(found)}}


async def _events(completion: _Completion, first: Chunk, chunks: AsyncIterator[Chunk]) -> AsyncIterator[str]:
    offsets = [len(prompt) for prompt in completion.prompts]  # where each choice's next text starts
    chunk: Chunk | None = first
    try:
        while chunk is not None:
            yield completion.event(chunk, offsets[chunk.index])
            offsets[chunk.index] += len(chunk.token.text)
            chunk = await anext(chunks, None)
        yield "data: [DONE]\n\n"
    except Exception:  # the status went out with the first event: the error goes in the stream
        log.exception("internal error in a completion stream")
        yield f"data: {json.dumps(error_body(500, 'internal error while streaming; the server log has the details'))}\n\n"
    finally:
        await chunks.aclose()


# -- translation, embeddings, classification ----------------------------------------------------


@router.post("/v1/translate", response_model=TranslateResponse, responses=ERRORS,
             summary="Translate with an encoder-decoder (beam search, n best, alignment)")
async def translate(body: TranslateRequest, request: Request) -> Any:
    served = _served(request, body.model, "translate")
    config = _checked(lambda: GenerationConfig(beam_size=body.beam_size, length_penalty=body.length_penalty,
                                               n_best=body.n_best, max_new_tokens=body.max_tokens), "inputs")
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
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors.tolist())]}


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
             summary="Attention weights of any model on a text: one layer or all, one head or all")
async def attention(body: AttentionRequest, request: Request) -> Any:
    served = _served(request, body.model, "attention")
    _check_layer_head(served, body.kind, body.layer, body.head)
    (found,) = await _run(request, served, attention_job(served, body.text, body.kind, body.layer, body.head), "text")
    return {"model": served.name, "kind": body.kind, "layers": found.layers, "heads": found.heads,
            "queries": found.queries, "keys": found.keys, "target": found.target,
            "weights": found.weights.double().round(decimals=6).tolist()}


# -- the server itself --------------------------------------------------------------------------


@router.get("/v1/models", response_model=ModelList, summary="The served models")
async def models(request: Request) -> Any:
    return {"object": "list", "data": [served.card() for served in _state(request).models.values()]}


@router.get("/health", response_model=Health, responses={503: {"model": Health}},
            summary="ok while serving; 503 draining once the server was told to stop")
async def health(request: Request) -> Any:
    state = _state(request)
    draining = state.traffic.draining
    return JSONResponse({"status": "draining" if draining else "ok", "models": list(state.models)},
                        status_code=503 if draining else 200)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.text(), media_type=CONTENT_TYPE_LATEST)


@router.get("/", summary="The page that talks to these routes", response_class=FileResponse, responses=ERRORS)
async def page() -> FileResponse:
    if not PAGE.exists():
        raise ApiError(404, "the page is not part of this installation; the API routes are listed at /docs")
    return FileResponse(PAGE, media_type="text/html")

"""What each kind of job computes, on the model's own thread: the jobs routes build and schedulers run.

A job holds a route's checked inputs and settings. `run_job` computes a whole answer with
`attn.app.inference`; `stream_job` gives a completion's tokens one at a time. Nothing here knows
about HTTP: routes turn the results into responses.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from torch import Tensor

from attn.app.inference import (
    AttentionLayers,
    GeneratedToken,
    Prediction,
    alignment,
    attention_layers,
    classify,
    embed,
    next_token_attention,
    source_ids,
    start_completion,
    token_pieces,
    translate_hypotheses,
)
from attn.app.serve.registry import ServedModel
from attn.decoding import GenerationConfig


@dataclasses.dataclass(frozen=True)
class Job:
    """One request's model work.

    Attributes:
        model: the model it runs on.
        route: the route that made it ("completions", "translate", "embeddings", "classify", "attention").
        tokens: its input tokens, what a token budget counts.
    """

    model: ServedModel
    route: str
    tokens: int


@dataclasses.dataclass(frozen=True)
class CompletionJob(Job):
    """Continue each prompt `n` times; choice i * n + j is sample j of prompt i (seed + j when seeded).

    Attributes:
        prompts: the prompts.
        config: the decoding settings (sampled or greedy).
        n: continuations per prompt.
        logprobs: how many top log-probabilities per token (0: the token's own only).
        attention: (layer, head or None for the mean) of the attention to send with each streamed token, or None.
    """

    prompts: list[str] = dataclasses.field(default_factory=list)
    config: GenerationConfig = GenerationConfig()
    n: int = 1
    logprobs: int = 0
    attention: tuple[int, int | None] | None = None


@dataclasses.dataclass(frozen=True)
class TranslateJob(Job):
    """Translate each text, keeping `config.n_best` hypotheses; with `alignment`, the best one's cross-attention."""

    texts: list[str] = dataclasses.field(default_factory=list)
    config: GenerationConfig = GenerationConfig()
    alignment: bool = False


@dataclasses.dataclass(frozen=True)
class EmbedJob(Job):
    texts: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class ClassifyJob(Job):
    texts: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class AttentionJob(Job):
    """The attention of `kind` on `text`: one layer or all (None), one head or all (None)."""

    text: str = ""
    kind: str = "self"
    layer: int | None = None
    head: int | None = None


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One token of one choice of a completion.

    Attributes:
        index: the choice.
        token: the token, its text and log-probabilities (`token.finish` set on the choice's last).
        attention: with `CompletionJob.attention`, how the model attended when it chose the token.
    """

    index: int
    token: GeneratedToken
    attention: TokenAttention | None = None


@dataclasses.dataclass(frozen=True)
class TokenAttention:
    """Attention of the position that chose a token: `weights[i]` is over `keys[i]` (prompt and earlier tokens)."""

    keys: list[str]
    weights: list[float]


@dataclasses.dataclass(frozen=True)
class Translation:
    """The hypotheses of one source, best first: (text, score); with alignment, the best one's cross-attention."""

    hypotheses: list[tuple[str, float]]
    source_tokens: list[str]
    target_tokens: list[str]
    alignment: Tensor | None


def stream_job(job: CompletionJob) -> Iterator[Chunk]:
    """The chunks of every choice, choice after choice. Every prompt is checked (and its first
    continuation prefilled) before the first chunk."""
    seeds = [None if job.config.seed is None else job.config.seed + j for j in range(job.n)]
    completions = [start_completion(job.model.bundle, prompt, dataclasses.replace(job.config, seed=seed),
                                    job.logprobs) for prompt in job.prompts for seed in seeds]
    return (chunk for index, completion in enumerate(completions)
            for chunk in _choice_chunks(job, index, completion.prompt_ids, completion.tokens))


def _choice_chunks(job: CompletionJob, index: int, prompt: list[int],
                   tokens: Iterator[GeneratedToken]) -> Iterator[Chunk]:
    context = list(prompt)
    for token in tokens:
        attention = None
        if job.attention is not None:
            weights = next_token_attention(job.model.bundle, context, *job.attention)
            attention = TokenAttention(token_pieces(job.model.bundle, context), weights.tolist())
        context.append(token.id)
        yield Chunk(index, token, attention)


@functools.singledispatch
def run_job(job: Job) -> Any:
    """The whole answer of a job: a list of chunks (completions), `Translation`s, an (N, d) tensor
    (embeddings), `Prediction`s or `AttentionLayers`."""
    raise TypeError(f"no work defined for {type(job).__name__}")


@run_job.register
def _(job: CompletionJob) -> list[Chunk]:
    return list(stream_job(job))


@run_job.register
def _(job: TranslateJob) -> list[Translation]:
    bundle = job.model.bundle
    found = translate_hypotheses(bundle, job.texts, job.config)
    sources = source_ids(bundle, job.texts)
    return [_translation(job, source, hypotheses) for source, hypotheses in zip(sources, found, strict=True)]


def _translation(job: TranslateJob, source: list[int], hypotheses: list) -> Translation:
    bundle = job.model.bundle
    texts = [(bundle.tokenizer.decode(h.tokens), h.score) for h in hypotheses]
    best = list(hypotheses[0].tokens)
    if not job.alignment:
        return Translation(texts, [], [], None)
    return Translation(texts, token_pieces(bundle, source), token_pieces(bundle, best), alignment(bundle, source, best))


@run_job.register
def _(job: EmbedJob) -> Tensor:
    return embed(job.model.bundle, job.texts)


@run_job.register
def _(job: ClassifyJob) -> list[Prediction]:
    return classify(job.model.bundle, job.texts)


@run_job.register
def _(job: AttentionJob) -> AttentionLayers:
    return attention_layers(job.model.bundle, job.text, job.kind, job.layer, job.head)

"""The engine jobs that routes build: what each route computes with the application's inference
modules (`translation`, `continuation`, `classification`, `attention_views`), and how jobs of one
group run together.

A `TextBatch` holds one request's texts; its `run` computes the texts of all the jobs the engine
put together in one call of the library and gives each job its share. A completion is `RowsJob` for
the model's running batch; its `chunk` turns each new token into a `Chunk` (text, log-probabilities,
and the attention the page asked for). Nothing here knows about HTTP: routes shape the answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from attn.app.serve.engine import BatchJob, RowsJob
from attn.app.serve.served_models import ServedModel
from attn.data.framing import classifier_inputs
from attn.decoding import CompletionText, GeneratedToken, GenerationConfig, RowToken
from attn.inference.attention_views import (
    AttentionFollower,
    AttentionLayers,
    HeadChoice,
    alignment,
    attention_layers,
    attention_source,
    token_pieces,
)
from attn.inference.classification import classify, embed
from attn.inference.translation import source_ids, translate_hypotheses


@dataclasses.dataclass(eq=False)
class TextBatch(BatchJob):
    """A `BatchJob` job over a request's texts (one size per text), and their second texts for a
    sentence-pair classifier."""

    texts: list[str]
    pairs: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One new token of one choice of a completion.

    Attributes:
        index: the choice (the row of the `RowsJob` job).
        token: the token, its text and log-probabilities (`token.finish` set on the choice's last).
        attention: when asked, how the model attended when it chose the token.
    """

    index: int
    token: GeneratedToken
    attention: TokenAttention | None = None


@dataclasses.dataclass(frozen=True)
class TokenAttention:
    """Attention of the position that chose a token: `weights[i]` (a (T,) tensor) is over `keys[i]` (the prompt
    and the tokens before it)."""

    keys: list[str]
    weights: Tensor


@dataclasses.dataclass(frozen=True)
class Translation:
    """The hypotheses of one source, best first, as (text, score); with alignment, the best one's
    (target, source) cross-attention and the tokens of both sides."""

    hypotheses: list[tuple[str, float]]
    source_tokens: list[str]
    target_tokens: list[str]
    alignment: Tensor | None


def _together(compute: Callable[[list[str]], Sequence[Any]]) -> Callable[[list[BatchJob]], list[Any]]:
    """A `BatchJob.run` that computes the texts of all its jobs in one call; each job gets its slice."""

    def run(jobs: list[BatchJob]) -> list[Any]:
        return _shares(jobs, compute([text for job in jobs for text in job.texts]))

    return run


def _shares(jobs: list[BatchJob], results: Sequence[Any]) -> list[Any]:
    """The results of the texts of all `jobs`, in order, cut into one slice per job."""
    shares, start = [], 0
    for job in jobs:
        shares.append(results[start : start + len(job.texts)])
        start += len(job.texts)
    return shares


def _sizes(served: ServedModel, texts: list[str]) -> list[int]:
    """The tokens of each text as an encoder-only model reads it (in the tokenizer's frame)."""
    return [len(ids) for ids in served.bundle.tokenizer.encode_batch(texts, add_special=True)]


def embed_job(served: ServedModel, texts: list[str]) -> TextBatch:
    """Result: (len(texts), d_model) embeddings, as `classification.embed`."""
    return TextBatch("embeddings", ("embeddings",), _sizes(served, texts),
                     _together(lambda all_texts: embed(served.bundle, all_texts)), texts)


def classify_job(served: ServedModel, texts: list[str], pairs: list[str] | None = None) -> TextBatch:
    """Result: one `Prediction` per text (or pair texts[i], pairs[i]), as `classification.classify`.

    Raises:
        AttnError: pairs for a tokenizer without [CLS] and [SEP] tokens.
    """
    bundle = served.bundle
    ids, _ = classifier_inputs(bundle.tokenizer, texts, pairs, served.max_positions)

    def run(jobs: list[BatchJob]) -> list[Any]:
        all_texts = [text for job in jobs for text in job.texts]
        all_pairs = None if pairs is None else [pair for job in jobs for pair in job.pairs]
        return _shares(jobs, classify(bundle, all_texts, pairs=all_pairs))

    return TextBatch("classify", ("classify", pairs is not None), [len(row) for row in ids], run, texts, pairs)


def translate_job(served: ServedModel, texts: list[str], config: GenerationConfig, aligned: bool) -> TextBatch:
    """Result: one `Translation` per text (jobs with the same settings run together)."""
    sizes = [len(ids) for ids in source_ids(served.bundle, texts)]

    def compute(all_texts: list[str]) -> list[Translation]:
        found = translate_hypotheses(served.bundle, all_texts, config)
        sources = source_ids(served.bundle, all_texts)
        return [_translation(served, source, hypotheses, aligned) for source, hypotheses in zip(sources, found)]

    return TextBatch("translate", ("translate", config, aligned), sizes, _together(compute), texts)


def _translation(served: ServedModel, source: list[int], hypotheses: list, aligned: bool) -> Translation:
    bundle = served.bundle
    texts = [(bundle.tokenizer.decode(h.tokens), h.score) for h in hypotheses]
    if not aligned:
        return Translation(texts, [], [], None)
    best = list(hypotheses[0].tokens)
    return Translation(texts, token_pieces(bundle, source), token_pieces(bundle, best), alignment(bundle, source, best))


def attention_job(served: ServedModel, text: str, kind: str, layer: int | None, head: HeadChoice,
                  pool: int | None = None, max_weights: int | None = None) -> TextBatch:
    """Result: a one-element list with the `AttentionLayers` of the text (maps are computed text by text)."""

    def compute(texts: list[str]) -> list[AttentionLayers]:
        return [attention_layers(served.bundle, t, kind, layer, head, pool, max_weights) for t in texts]

    size = len(attention_source(served.bundle, text))
    return TextBatch("attention", ("attention", kind, layer, head, pool), [size], _together(compute), [text])


def completion_rows(served: ServedModel, prompts: list[list[int]], configs: list[GenerationConfig],
                    logprobs: int, attention: tuple[int, int | None] | None, route: str = "completions") -> RowsJob:
    """One row per choice (prompt ids and decoding settings); the stream yields a `Chunk` per token.

    Args:
        logprobs: how many top log-probabilities each token carries.
        attention: (layer, head or None for the mean over heads) of the attention each token carries, or None.
        route: the route the rows serve (a metrics label): completions or chat/completions.
    """
    texts = [CompletionText(served.bundle.tokenizer.decode, config, served.bundle.eos_id, logprobs) for config in configs]
    followers: list[AttentionFollower | None] = [None] * len(prompts)  # made at each row's first token

    def chunk(row: int, token: RowToken) -> Chunk:
        seen = None
        if attention is not None:
            if followers[row] is None:
                followers[row] = AttentionFollower(served.bundle, prompts[row], *attention,
                                                   configs[row].max_new_tokens or 1)
            seen = TokenAttention(*followers[row].next(token.token))
        return Chunk(row, texts[row].push(token.token, token.scores, token.finish), seen)

    return RowsJob(route, prompts, configs, chunk)

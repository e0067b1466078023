"""The answers of completions and chat completions: one checked request's rows, and how each shape is written.

Nothing here waits or validates: the routes do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from torch import Tensor

from attn.app.serve.engine import RowsJob
from attn.app.serve.served_models import ServedModel
from attn.app.serve.work import Chunk


@dataclasses.dataclass
class Answer:
    """A checked request for the running batch: its model, its rows (one per choice) and how to answer; the
    answers of completions and of chat completions differ in their shape only (`choice`, `event`, `usage_event`).

    Attributes:
        param: the request field that a mistake found while decoding is about (a prompt too long).
        prompt_tokens: the prompts' tokens, each prompt counted once.
        attention: (layer, head, or None for the mean over heads) of the attention each streamed token carries,
            or None.
        include_usage: a stream's chunks carry "usage": null, and one more chunk, with the usage and no choices,
            follows the last.
    """

    chunk_object: ClassVar[str]  # the "object" of a streamed chunk

    served: ServedModel
    rows: RowsJob
    head: dict[str, Any]
    param: str
    prompt_tokens: int
    attention: tuple[int, int | None] | None
    include_usage: bool

    def choice(self, chunks: list[Chunk]) -> dict[str, Any]:
        """One choice of the whole answer, from all its chunks."""
        raise NotImplementedError

    def event(self, chunk: Chunk) -> dict[str, Any]:
        """The streamed object of one chunk."""
        raise NotImplementedError

    def usage_event(self, tokens: int) -> dict[str, Any] | None:
        """The chunk streamed after the last one, with the usage, when the request asked for it."""
        if not self.include_usage:
            return None
        return {**self.head, "object": self.chunk_object, "choices": [], "usage": self.usage(tokens)}

    def streamed(self, choice: dict[str, Any], chunk: Chunk) -> dict[str, Any]:
        """The streamed object of one chunk's `choice`."""
        return {**self.head, "object": self.chunk_object, "choices": [choice],
                **({"usage": None} if self.include_usage else {}), **self.token_attention(chunk)}

    def answer(self, chunks: list[Chunk]) -> dict[str, Any]:
        choices = [self.choice([c for c in chunks if c.index == i]) for i in range(len(self.rows.prompts))]
        return {**self.head, "choices": choices, "usage": self.usage(len(chunks))}

    def usage(self, tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": tokens,
                "total_tokens": self.prompt_tokens + tokens}

    def decode(self, ids: list[int]) -> str:
        return self.served.bundle.tokenizer.decode(ids)

    def token_attention(self, chunk: Chunk) -> dict[str, Any]:
        """{"attention": ...} with the attention that chose the chunk's token, when the request asked; else {}."""
        if chunk.attention is None or self.attention is None:
            return {}
        layer, head = self.attention
        return {"attention": {"layer": layer, "head": head, "token": self.decode([chunk.token.id]),
                              "keys": chunk.attention.keys, "weights": rounded(chunk.attention.weights)}}


@dataclasses.dataclass
class Completion(Answer):
    """A completion: text choices, logprobs in the completions shape, the attention the page asks for.

    Attributes:
        prompts: the prompt of each choice (choice i * n + j is sample j of prompt i).
    """

    prompts: list[str]
    logprobs: bool
    chunk_object: ClassVar[str] = "text_completion"
    offsets: list[int] = dataclasses.field(init=False)  # where each streamed choice's next text starts

    def __post_init__(self) -> None:
        self.offsets = [len(prompt) for prompt in self.prompts]

    def choice(self, chunks: list[Chunk]) -> dict[str, Any]:
        index = chunks[0].index
        return {"text": "".join(c.token.text for c in chunks), "index": index,
                "logprobs": self._logprobs(chunks, len(self.prompts[index])), "finish_reason": chunks[-1].token.finish}

    def event(self, chunk: Chunk) -> dict[str, Any]:
        choice = {"text": chunk.token.text, "index": chunk.index,
                  "logprobs": self._logprobs([chunk], self.offsets[chunk.index]), "finish_reason": chunk.token.finish}
        self.offsets[chunk.index] += len(chunk.token.text)
        return self.streamed(choice, chunk)

    def _logprobs(self, chunks: list[Chunk], offset: int) -> dict[str, list] | None:
        if not self.logprobs:
            return None
        offsets = []
        for chunk in chunks:
            offsets.append(offset)
            offset += len(chunk.token.text)
        return {"tokens": [self.decode([c.token.id]) for c in chunks],
                "token_logprobs": [c.token.logprob for c in chunks],
                "top_logprobs": [{self.decode([i]): p for i, p in c.token.top} for c in chunks],
                "text_offset": offsets}


@dataclasses.dataclass
class ChatCompletion(Answer):
    """A chat completion: assistant messages (streamed as deltas, the first with the role), logprobs in the
    chat shape."""

    logprobs: bool
    chunk_object: ClassVar[str] = "chat.completion.chunk"
    started: set[int] = dataclasses.field(default_factory=set)  # the streamed choices that sent their role

    def choice(self, chunks: list[Chunk]) -> dict[str, Any]:
        return {"index": chunks[0].index, "message": {"role": "assistant", "content": "".join(c.token.text for c in chunks)},
                "logprobs": self._logprobs(chunks), "finish_reason": chunks[-1].token.finish}

    def event(self, chunk: Chunk) -> dict[str, Any]:
        delta = {"content": chunk.token.text}
        if chunk.index not in self.started:
            self.started.add(chunk.index)
            delta = {"role": "assistant", **delta}
        choice = {"index": chunk.index, "delta": delta, "logprobs": self._logprobs([chunk]),
                  "finish_reason": chunk.token.finish}
        return self.streamed(choice, chunk)

    def _logprobs(self, chunks: list[Chunk]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {"content": [{**self._token(c.token.id, c.token.logprob),
                             "top_logprobs": [self._token(i, p) for i, p in c.token.top]} for c in chunks],
                "refusal": None}

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}



def rounded(weights: Tensor) -> list:
    """Weights as nested lists of numbers, rounded to 6 decimals (what keeps a map's JSON small)."""
    return weights.double().round(decimals=6).tolist()


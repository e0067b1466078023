"""Chat completions whose answers may call tools: each choice's calls read from its text, whole or streamed as
OpenAI streams them (`delta.tool_calls[i]`: the index, id, type and function name first, then pieces of the
arguments), with `finish_reason` "tool_calls"."""

from __future__ import annotations

import dataclasses
from typing import Any

from attn.app.serve.answers import ChatCompletion
from attn.app.serve.work import Chunk
from attn.inference.tool_calls import CallStream
from attn.inference.tools import ToolUse


@dataclasses.dataclass
class ToolChatCompletion(ChatCompletion):
    """A chat completion of a request with tools (`use`), whose choices may be calls."""

    use: ToolUse | None = None
    streams: dict[int, CallStream] = dataclasses.field(default_factory=dict)  # each streamed choice's calls

    def choice(self, chunks: list[Chunk]) -> dict[str, Any]:
        choice = super().choice(chunks)
        content, calls = self.use.parsed(choice["message"]["content"])
        if calls:
            choice["message"] = {"role": "assistant", "content": content, "tool_calls": [c.openai() for c in calls]}
            choice["finish_reason"] = "tool_calls"
        return choice

    def event(self, chunk: Chunk) -> dict[str, Any]:
        stream = self.streams.setdefault(chunk.index, self.use.stream())
        text, deltas = stream.push(chunk.token.text)
        finish = chunk.token.finish
        if finish is not None:
            rest, last, called = stream.finish()
            text, deltas, finish = text + rest, deltas + last, "tool_calls" if called else finish
        event = super().event(chunk)
        choice = event["choices"][0]
        choice["delta"]["content"] = text if text or not deltas else None
        if deltas:
            choice["delta"]["tool_calls"] = [delta.openai() for delta in deltas]
        choice["finish_reason"] = finish
        return event


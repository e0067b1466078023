"""Chatting with a decoder-only model that has a chat template: what `attn chat` and the server's chat call.

A conversation becomes a prompt through the model's template (`Bundle.render_chat`); the answer is that prompt's
continuation, which ends at the model's end of turn as well as at its EOS. A `ChatSession` keeps the keys and values
of its prompts and answers (`PrefixCache`), so each turn feeds the model only what its prompt adds to the tokens
before: the new message, and whatever the template renders differently from the answer's own tokens. With tools
(`attn.inference.tools`), an answer may call functions (`ChatSession.calls`), whose results `answer_calls` sends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from attn.inference.continuation import generate_stream
from attn.inference.inputs import expect_model
from attn.inference.tool_calls import ToolCall
from attn.inference.tools import Tool, ToolUse
from attn.artifacts import Bundle
from attn.core.errors import ConfigError
from attn.data.text import check_unicode
from attn.decoding import DEFAULT_PREFIX_CACHE_BYTES, GenerationConfig, PrefixCache
from attn.models import Decoder

Message = dict[str, Any]


def conversation(text: str, system: str | None = None) -> list[Message]:
    """The messages of a one-turn chat: the system message (when given), then `text` as the user's."""
    return [*_opening(system), {"role": "user", "content": text}]


def _opening(system: str | None) -> list[Message]:
    return [] if system is None else [{"role": "system", "content": system}]


class ChatSession:
    """One conversation with a chat model: a system message (optional), then the user's messages and the answers.

    Args:
        system: the system message that starts the conversation (None: the template's default, if it has one).
        prefix_cache_bytes: the most bytes of keys and values kept between turns (0: none kept, every turn
            prefills the whole conversation).
        tools: the functions the model may call (OpenAI's tool objects), or None.
        tool_choice: OpenAI's "none", "auto" (the default with tools), "required" or {"type": "function",
            "function": {"name": ...}}: a forced call answers each user message; the answer to the calls' results
            is the model's choice.

    Raises:
        ChatTemplateError: the model has no chat template.
        AttnError: the model is not a decoder-only model.

    Example:
        >>> import torch
        >>> from attn import Bundle, GenerationConfig, Tokenizer, build_model, preset
        >>> tokenizer = Tokenizer.train_chars(["user: Hi!\\nassistant:"])
        >>> config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0)
        >>> _ = torch.manual_seed(0)
        >>> bundle = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="lm", model_config=config,
        ...                 path=".", chat_template="{% for m in messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}")
        >>> chat = ChatSession(bundle, GenerationConfig(max_new_tokens=3))
        >>> answer = "".join(chat.reply("Hi!"))
        >>> [m["role"] for m in chat.messages], chat.messages[-1]["content"] == answer
        (['user', 'assistant'], True)
    """

    def __init__(self, bundle: Bundle, config: GenerationConfig, system: str | None = None,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, tools: Sequence[Tool] | None = None,
                 tool_choice: str | Mapping[str, Any] | None = None) -> None:
        expect_model(bundle, Decoder, "chat")
        self.template = bundle.compiled_chat_template()  # a model without one is refused before the first message
        self.tools = ToolUse.of(self.template, tools, tool_choice)
        self.calls: list[ToolCall] = []  # the calls of the last answer
        self.bundle = bundle
        self.config = config
        self.system = system
        self.messages: list[Message] = []
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
        self.reset()

    def reset(self) -> None:
        """Forgets every message but the system message."""
        self.messages = _opening(self.system)

    def reply(self, text: str) -> Iterator[str]:
        """The answer to the user's `text`, in pieces as its tokens arrive (see `generate_stream`).

        The prompt is checked before this returns, so its errors come before any text and leave the history as
        it was. Once the answer ends, or its iterator is closed part way (Ctrl-C), the user's message and the
        answer shown so far join the history.

        Raises:
            ChatTemplateError: the template fails on the conversation.
            GenerationError: the conversation is too long for the model.
            TextError: `text` is not valid Unicode.
        """
        messages = [*self.messages, {"role": "user", "content": check_unicode(text, "message")}]
        return self._turn(messages, self.tools)

    def answer_calls(self, results: Sequence[str]) -> Iterator[str]:
        """The answer once the last answer's calls (`calls`) returned `results`, one each, in their order; as `reply`.

        Raises:
            ConfigError: not one result per call (field "results").
        """
        if not self.calls or len(results) != len(self.calls):
            raise ConfigError("results", f"the last answer made {len(self.calls)} calls, and {len(results)} results "
                              "came back; give one result per call, after an answer that calls")
        returned = [{"role": "tool", "tool_call_id": call.id, "content": check_unicode(result, "result")}
                    for call, result in zip(self.calls, results)]
        choice = "auto" if self.tools.calls else "none"
        return self._turn([*self.messages, *returned], dataclasses.replace(self.tools, choice=choice))

    def _turn(self, messages: list[Message], tools: ToolUse) -> Iterator[str]:
        prompt = tools.prompt(self.template, messages)
        pieces = generate_stream(self.bundle, prompt, tools.applied(self.config), chat=True,
                                 prefix_cache=self.prefix_cache)
        return self._answer(messages, pieces, tools)

    def _answer(self, messages: list[Message], pieces: Iterator[str], tools: ToolUse) -> Iterator[str]:
        shown: list[str] = []
        try:
            for piece in pieces:
                shown.append(piece)
                yield piece
        finally:
            content, self.calls = tools.parsed("".join(shown))
            answer: Message = {"role": "assistant", "content": content}
            if self.calls:
                answer["tool_calls"] = [call.openai() for call in self.calls]
            self.messages = [*messages, answer]

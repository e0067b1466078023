"""Conversations as language-model training data: JSON Lines of OpenAI-style messages, written by a model's chat
template, the assistant's tokens marked as the ones to learn.

A line is `{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}`; the
roles are `ROLES`, a content is a string (an assistant's may be null when it carries `tool_calls`), every
conversation has an assistant turn, and the other keys (`tool_calls`, `tool_call_id`, `name`) go to the template
as they are.

An assistant turn's tokens are those between the rendering of the conversation before it with the generation
prompt and the rendering through it: what a model that is given the first writes. The whole conversation is
tokenized piece by piece at those boundaries, so the tokens before a turn are the tokens of the prompt a model
answers. A template whose rendering of a shorter conversation is not the start of its rendering of a longer one
cannot mark turns this way and is refused.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from attn.core.errors import ChatTemplateError, DataFormatError, TextError
from attn.data.chat_template import ChatTemplate
from attn.data.collate import pad_batch
from attn.data.file_formats import read_records
from attn.data.text import MAX_LINE_CHARS, check_unicode
from attn.data.tokenizers import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
_EXAMPLE = '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}'


@dataclass(frozen=True)
class Conversation:
    """The messages of one line of a chat file, checked, and the line's 1-based number."""

    messages: list[dict[str, Any]]
    line: int


@dataclass(frozen=True)
class ChatExample:
    """A conversation's tokens and which of them the assistant wrote (True), with its line in the file."""

    ids: list[int]
    assistant: list[bool]
    line: int


def read_conversations(path: str | Path) -> list[Conversation]:
    """The conversations of a chat file, in file order (blank lines skipped).

    Raises:
        DataFormatError: a line that is not JSON, has no "messages", a message with an unknown role or a content
            that is not a string, a conversation without an assistant turn, or a file without conversations;
            names the file, the line and the fix.
    """
    records = read_records(str(path), "jsonl", MAX_LINE_CHARS)
    if not records.rows:
        raise DataFormatError(records.path, f"has no conversations; write one per line: {_EXAMPLE}")
    return [Conversation(_messages(records.path, number, row), number) for number, row in records.rows]


def _messages(path: str, line: int, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        found = f"its keys are {', '.join(map(repr, row)) or 'none'}" if messages is None else \
            f'its "messages" is {json.dumps(messages)[:80]}'
        raise DataFormatError(path, f'the line needs "messages", a list of messages ({found}); write {_EXAMPLE}',
                              line)
    for number, message in enumerate(messages):
        where = f"message {number}"
        if not isinstance(message, dict):
            raise DataFormatError(path, f'{where} is a JSON {type(message).__name__}; write an object with "role" '
                                        'and "content"', line)
        role = message.get("role")
        if role not in ROLES:
            raise DataFormatError(path, f"{where} has the role {json.dumps(role)}; use one of {', '.join(ROLES)}",
                                  line)
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        if not isinstance(content, str):
            raise DataFormatError(path, f'{where} ({role}) has the content {json.dumps(content)[:80]}, not a string; '
                                        'write its text as one JSON string', line)
        try:
            check_unicode(content)
        except TextError as error:
            raise DataFormatError(path, f"{where} ({role}) {error.detail}", line) from None
    if not any(message["role"] == "assistant" for message in messages):
        raise DataFormatError(path, "the conversation has no assistant turn (what training learns and evaluation "
                                    'scores); add the answer as a message with the role "assistant", or delete the '
                                    "line", line)
    return messages


def assistant_spans(template: ChatTemplate, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as the template writes it, and the (start, end) characters of each assistant turn.

    Raises:
        ChatTemplateError: the template fails on the conversation, or does not write it by appending turns.
    """
    text = template.render(messages)
    spans = []
    for number, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:number], add_generation_prompt=True)
        through = text if number == len(messages) - 1 else template.render(messages[: number + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise ChatTemplateError(
                f"the chat template writes the conversation up to message {number} differently from the start of "
                "a longer one (with the generation prompt, or without later turns), so the assistant's tokens "
                "cannot be found; train with a template that only appends each turn", "messages")
        spans.append((len(before), len(through)))
    return text, spans


def encode_conversations(
    path: str | Path, conversations: Sequence[Conversation], template: ChatTemplate, tokenizer: Tokenizer
) -> list[ChatExample]:
    """Every conversation's tokens, with the assistant's marked (see the module docstring).

    Raises:
        DataFormatError: the template fails on a conversation or cannot mark its turns; names the line.
    """
    cut: list[list[str]] = []  # each conversation's pieces: not the assistant's, the assistant's, ... alternately
    for conversation in conversations:
        try:
            text, spans = assistant_spans(template, conversation.messages)
        except ChatTemplateError as error:
            raise DataFormatError(str(path), str(error), conversation.line) from None
        bounds = [0, *(at for span in spans for at in span), len(text)]
        cut.append([text[start:end] for start, end in itertools.pairwise(bounds)])
    encoded = iter(tokenizer.encode_batch([piece for pieces in cut for piece in pieces]))
    examples = []
    for conversation, pieces in zip(conversations, cut, strict=True):
        ids: list[int] = []
        assistant: list[bool] = []
        for number in range(len(pieces)):
            piece = next(encoded)
            ids += piece
            assistant += [number % 2 == 1] * len(piece)
        examples.append(ChatExample(ids, assistant, conversation.line))
    return examples


def drop_long(examples: Sequence[ChatExample], limit: int) -> tuple[list[ChatExample], int]:
    """The examples whose next-token rows (all tokens but the last) fit `limit` positions, and how many did not."""
    kept = [example for example in examples if len(example.ids) - 1 <= limit]
    return kept, len(examples) - len(kept)


def unscored_id(vocab_size: int, *splits: Sequence[ChatExample]) -> int:
    """The largest token id that no assistant turn holds: the id that marks a target as not scored (the loss takes a
    class of the vocabulary that is never a target)."""
    used = {token for examples in splits for example in examples
            for token, mine in zip(example.ids, example.assistant) if mine}
    return next(i for i in range(vocab_size - 1, -1, -1) if i not in used)


def collate_chat(examples: Sequence[ChatExample], ignore_id: int) -> tuple[Tensor, Tensor]:
    """Inputs (B, L) and their next tokens (B, L), right-padded with `ignore_id`; a next token that is not the
    assistant's is `ignore_id` too. A causal model's real positions never see the padding after them."""
    inputs = [example.ids[:-1] for example in examples]
    targets = [[token if mine else ignore_id for token, mine in zip(example.ids[1:], example.assistant[1:])]
               for example in examples]
    return pad_batch(inputs, ignore_id)[0], pad_batch(targets, ignore_id)[0]

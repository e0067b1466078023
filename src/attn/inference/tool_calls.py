"""Tool calls read from a chat model's answer, whole or as its text arrives, in the formats chat templates define.

- `HERMES` (Qwen2.5, Hermes): each call `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, after
  text or not;
- `LLAMA3` (Llama 3.1 and later): the answer is `{"name": ..., "parameters": {...}}` (several separated by ";"),
  after `<|python_tag|>` or not;
- `MISTRAL`: the answer is `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`;
- `FALLBACK`: Hermes' calls, for a template that knows no tools (see `attn.inference.tools`).

Special tokens such as [TOOL_CALLS] and <|python_tag|> are usually decoded away; a call is read without them.
A call's arguments are the JSON text the model wrote for them (an object), or the text of a JSON string it wrote
instead, so that streamed pieces add up to the whole answer's arguments.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import string
from collections.abc import Sequence
from typing import Any

# The start of a call written name first: its name (a JSON string) and where its arguments' value starts.
_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_DECODER = json.JSONDecoder()


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call of a function: its id, its name and its arguments as a JSON string (as OpenAI sends them)."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class ToolFormat:
    """How a template's model writes its calls.

    Attributes:
        name: "hermes", "llama3", "mistral" or "fallback".
        opening: the text that starts the calls (Hermes: each call).
        closing: the text that ends each call, or "" when none does.
        arguments_key: the key of a call's arguments ("arguments", or Llama's "parameters").
        anchored: the calls are the whole answer (they start it), rather than text anywhere in it.
        in_template: the chat template renders tools, calls and results itself.
        as_list: the calls are one JSON list (Mistral), rather than one object each.
    """

    name: str
    opening: str
    closing: str
    arguments_key: str
    anchored: bool
    in_template: bool
    as_list: bool = False

    def call_id(self) -> str:
        """A new call's id: Mistral's templates take 9 letters and digits only; others OpenAI's "call_" ids."""
        if self.name == "mistral":
            return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
        return f"call_{secrets.token_hex(12)}"


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", anchored=False, in_template=True)
LLAMA3 = ToolFormat("llama3", "<|python_tag|>", "", "parameters", anchored=True, in_template=True)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "", "arguments", anchored=True, in_template=True, as_list=True)
FALLBACK = dataclasses.replace(HERMES, name="fallback", in_template=False)


def tool_format(template: str) -> ToolFormat:
    """The format of the calls that a chat template's source writes (FALLBACK when it writes none)."""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or '"parameters"' in template and "tools" in template:
        return LLAMA3
    return FALLBACK


@dataclasses.dataclass(frozen=True)
class _Found:
    """A call met in an answer: its name (None until known), its arguments' text so far, and whether it ended."""

    name: str | None
    arguments: str
    ended: bool


def call_start(text: str, form: ToolFormat) -> int | None:
    """Where the calls start in `text`, or None when it holds none (yet)."""
    if not form.anchored:
        start = text.find(form.opening)
        return None if start < 0 else start
    stripped = text.lstrip()
    opens = (form.opening, "[" if form.as_list else "{")
    return len(text) - len(stripped) if stripped.startswith(opens) else None


def _calls_in(text: str, form: ToolFormat) -> list[_Found]:
    """The calls that `text` (from where they start) holds, the last perhaps not ended; reading stops at text
    that is no call (what follows Hermes' calls, or JSON that is not one)."""
    found: list[_Found] = []
    at = 0
    while True:
        at = _separators(text, at, form)
        if at >= len(text) or text[at] != "{":
            return found
        call, at = _call_at(text, at, form)
        found.append(call)
        if not call.ended:
            return found


def _separators(text: str, at: int, form: ToolFormat) -> int:
    """Where the next call may start: past white space, the format's markers, and list or ";" separators."""
    while at < len(text):
        marker = next((m for m in (form.opening, form.closing) if m and text.startswith(m, at)), None)
        if marker:
            at += len(marker)
        elif text[at] in " \t\r\n;,[]":
            at += 1
        else:
            break
    return at


def _call_at(text: str, at: int, form: ToolFormat) -> tuple[_Found, int]:
    """The call whose object starts at `at`, and where it ends; one not ended holds the arguments so far."""
    head = _HEAD.match(text, at)
    if head is None:  # not written name first: read whole, once it is
        try:
            item, end = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return _Found(None, "", False), len(text)
        key = form.arguments_key if isinstance(item, dict) and form.arguments_key in item else "arguments"
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get(key), dict | str)):
            return _Found(None, "", False), len(text)
        arguments = item[key] if isinstance(item[key], str) else json.dumps(item[key], ensure_ascii=False)
        return _Found(item["name"], arguments, True), end
    name, start = json.loads(head.group(1)), head.end()
    try:
        value, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:  # the arguments so far; a string's text is known once it ends
        return _Found(name, "" if text.startswith('"', start) else _held(text[start:], form), False), len(text)
    arguments = value if isinstance(value, str) else text[start:end]
    close = end + len(text[end:]) - len(text[end:].lstrip())
    if close == len(text):
        return _Found(name, "" if isinstance(value, str) else arguments, False), close
    ended = text[close] == "}" and isinstance(value, dict | str)
    return _Found(name if ended else None, arguments, ended), close + 1


def _held(arguments: str, form: ToolFormat) -> str:
    """Arguments not ended, less what may yet turn out to close the call rather than them (white space, "}", the
    format's closing or its first characters)."""
    closing = form.closing
    if closing:
        arguments = arguments.split(closing)[0]
        arguments = arguments[:len(arguments) - _marker_start(arguments, closing)]
    return arguments.rstrip(" \t\r\n}")


def _marker_start(text: str, marker: str) -> int:
    """The length of the longest end of `text` that starts `marker` (0: none)."""
    return next((n for n in range(len(marker) - 1, 0, -1) if text.endswith(marker[:n])), 0)


def parse_calls(text: str, form: ToolFormat, names: Sequence[str]) -> tuple[str | None, list[ToolCall]]:
    """An answer's text and the calls in it.

    Args:
        text: the answer as decoded.
        names: the functions the model may call; an answer that calls another is text.

    Returns:
        (the text before the calls, None when blank; the calls), or (text, []) when it holds no valid call.
    """
    start = call_start(text, form)
    found = [] if start is None else _calls_in(text[start:], form)
    if not found or any(not call.ended or call.name not in names for call in found):
        return text, []
    return text[:start].strip() or None, [ToolCall(form.call_id(), call.name, call.arguments) for call in found]


@dataclasses.dataclass(frozen=True)
class CallDelta:
    """A piece of a streamed call: its index among the answer's calls; its id and name on its first piece only."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def openai(self) -> dict[str, Any]:
        """The piece as OpenAI streams it, one item of `delta.tool_calls`."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class CallStream:
    """An answer's text as its pieces arrive: the text that can be shown at once, and each call's pieces, its name
    first and its arguments as they come.

    Text that may start a call (the format's opening, or its first characters) is held back until it is known.
    A call is sent once its name is known; if its text turns out to be no valid call, that text follows as text.
    """

    def __init__(self, form: ToolFormat, names: Sequence[str]) -> None:
        self.form = form
        self.names = list(names)
        self.text = ""
        self.shown = 0
        self.sent: list[tuple[str, str]] = []  # (name, arguments) of each call streamed so far

    def push(self, piece: str) -> tuple[str, list[CallDelta]]:
        """(the text not shown yet that is no call, the pieces of calls not sent yet) after `piece`."""
        self.text += piece
        shown, self.shown = self.shown, max(self.shown, self._safe())
        return self.text[shown:self.shown], self._deltas()

    def finish(self) -> tuple[str, list[CallDelta], bool]:
        """(the text held back that is no call, the calls' last pieces, whether the answer holds calls) at its end."""
        _, calls = parse_calls(self.text, self.form, self.names)
        rest = "" if calls else self.text[self.shown:]
        self.shown = len(self.text)
        return rest, self._deltas(), bool(calls or self.sent)

    def _safe(self) -> int:
        """How much of the text cannot be part of a call."""
        start = call_start(self.text, self.form)
        if start is not None:
            return start
        if not self.form.anchored:
            return len(self.text) - _marker_start(self.text, self.form.opening)
        return 0 if self.shown == 0 and self.form.opening.startswith(self.text.lstrip()) else len(self.text)

    def _deltas(self) -> list[CallDelta]:
        start = call_start(self.text, self.form)
        if start is None:
            return []
        deltas = []
        for index, call in enumerate(_calls_in(self.text[start:], self.form)):
            if call.name not in self.names:
                break
            if index == len(self.sent):
                self.sent.append((call.name, call.arguments))
                deltas.append(CallDelta(index, self.form.call_id(), call.name, call.arguments))
            elif len(call.arguments) > len(self.sent[index][1]) and call.arguments.startswith(self.sent[index][1]):
                name, before = self.sent[index]
                self.sent[index] = (name, call.arguments)
                deltas.append(CallDelta(index, None, None, call.arguments[len(before):]))
        return deltas

"""Tool calling: a conversation with functions a chat model may call, rendered, forced and parsed.

A model's chat template says how it calls tools; `tool_format` reads which of the known formats it writes:

- `HERMES` (Qwen2.5, Hermes): each call `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- `LLAMA3` (Llama 3.1 and later): the answer is `{"name": ..., "parameters": {...}}`, after `<|python_tag|>` or not;
- `MISTRAL`: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`;
- `FALLBACK`, for a template that knows no tools (SmolLM2's ChatML): the tool list and the Hermes call format go
  into the system message (`FALLBACK_INSTRUCTIONS`), a `tool` message becomes a user message holding
  `<tool_response>\\n...\\n</tool_response>`, and an assistant's calls its text in the Hermes format.

The templates that know tools get `tools` as transformers' `apply_chat_template(tools=...)` passes them, and an
assistant's `tool_calls` with their arguments as objects (OpenAI sends a JSON string). A forced call (`tool_choice`
"required" or one function) is a Lark grammar (llguidance's dialect): the format's markers around `%json` of the
call, whose "name" is the function's and whose arguments follow its parameter schema, so any chat model writes a
valid call. Markers that are special tokens ([TOOL_CALLS], <|python_tag|>) are left out of the grammar: they are
not text, and the parser takes a call without them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import string
from collections.abc import Mapping, Sequence
from typing import Any

from attn.core.errors import ConfigError
from attn.data.chat_template import ChatTemplate

Tool = Mapping[str, Any]  # OpenAI's {"type": "function", "function": {"name", "description", "parameters"}}
Message = Mapping[str, Any]
CHOICES = ("none", "auto", "required")
FALLBACK_INSTRUCTIONS = (
    "You may call functions to answer. The functions, as JSON schemas:\n<tools>\n{tools}\n</tools>\n\nTo call a "
    "function, answer with nothing but\n<tool_call>\n{{\"name\": <the function's name>, \"arguments\": <its "
    "arguments as a JSON object>}}\n</tool_call>\nA function's result comes back in <tool_response></tool_response> "
    "tags.")
_NO_PARAMETERS = {"type": "object", "properties": {}}


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
        opening: the text that starts the calls ("" when a call is the whole answer).
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


def function_names(tools: Sequence[Tool]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def check_tool_choice(tools: Sequence[Tool], choice: str | Mapping[str, Any] | None) -> str | None:
    """`tool_choice` as "none", "auto", "required", or the name of the function a call must be of.

    Raises:
        ConfigError: a choice that is none of these, or names no function of `tools`; "required" or a function
            without tools (field "tool_choice").
    """
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, Mapping):
        name = choice.get("function", {}).get("name")
        if name not in function_names(tools):
            listed = ", ".join(function_names(tools)) or "none"
            raise ConfigError("tool_choice", f"names the function {name!r}, which is not among the tools (the tools' "
                              f"functions: {listed}); name one of them, or send \"auto\"")
        return name
    if choice not in CHOICES:
        raise ConfigError("tool_choice", f"{choice!r} is not a tool choice; send \"none\", \"auto\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if choice == "required" and not tools:
        raise ConfigError("tool_choice", "\"required\" needs tools: send the functions in tools")
    return choice


def render(template: ChatTemplate, messages: Sequence[Message], tools: Sequence[Tool] | None,
           choice: str = "auto") -> str:
    """The conversation, with the tools the model may call (none when `choice` is "none"), as the prompt of the
    assistant's answer: OpenAI's messages (`tool_calls`, `tool` messages with their `tool_call_id`) in the form of
    the template's format.

    Raises:
        ChatTemplateError: the template fails on the conversation.
    """
    form = tool_format(template.source)
    offered = list(tools or []) if choice != "none" else []
    if form.in_template:
        return template.render([_templated(message) for message in messages], True, offered or None)
    return template.render(_fallback(messages, offered), True)


def _templated(message: Message) -> dict[str, Any]:
    """A message as templates read it: each call's arguments an object, not OpenAI's JSON string."""
    calls = message.get("tool_calls")
    if not calls:
        return {key: value for key, value in message.items() if key != "tool_calls"}
    parsed = [{**call, "function": {**call["function"], "arguments": _arguments(call["function"]["arguments"])}}
              for call in calls]
    return {**message, "tool_calls": parsed}


def _arguments(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def _fallback(messages: Sequence[Message], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The messages for a template that knows no tools: the tools in the system message, calls and results as
    text (see the module docstring)."""
    plain = []
    for message in messages:
        if message["role"] == "tool":
            plain.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
        elif message.get("tool_calls"):
            calls = [_hermes_call(call["function"]["name"], _arguments(call["function"]["arguments"]))
                     for call in message["tool_calls"]]
            plain.append({"role": "assistant", "content": "\n".join([message.get("content") or "", *calls]).strip()})
        else:
            plain.append({key: value for key, value in message.items() if key != "tool_calls"})
    if not tools:
        return plain
    listed = FALLBACK_INSTRUCTIONS.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
    if plain and plain[0]["role"] == "system":
        return [{"role": "system", "content": f"{plain[0]['content']}\n\n{listed}"}, *plain[1:]]
    return [{"role": "system", "content": listed}, *plain]


def _hermes_call(name: str, arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"


def parse_calls(text: str, form: ToolFormat, names: Sequence[str]) -> tuple[str | None, list[ToolCall]]:
    """An answer's text and the calls in it, in the format of the model's template.

    Args:
        text: the answer as decoded (special tokens such as [TOOL_CALLS] may have been left out).
        names: the functions the model may call; an answer that calls another is text.

    Returns:
        (the text before the calls, None when blank; the calls), or (text, []) when it holds no valid call.
    """
    start = call_start(text, form)
    if start is None:
        return text, []
    found = _decoded(text[start:], form)
    if not found or any(not _valid(item, form) or item["name"] not in names for item in found):
        return text, []
    calls = [ToolCall(form.call_id(), item["name"], _arguments_text(item[_key(item, form)])) for item in found]
    return text[:start].strip() or None, calls


def call_start(text: str, form: ToolFormat) -> int | None:
    """Where the calls start in `text`, or None when it holds none."""
    if not form.anchored:
        start = text.find(form.opening)
        return None if start < 0 else start
    stripped = text.lstrip()
    opens = (form.opening, "[" if form.as_list else "{")
    return len(text) - len(stripped) if stripped.startswith(opens) else None


def _decoded(text: str, form: ToolFormat) -> list[Any]:
    """The JSON values of the calls that `text` (from the calls' start) holds; [] when one does not parse."""
    if not form.anchored:
        pattern = re.escape(form.opening) + r"(.*?)(?:" + re.escape(form.closing) + "|$)"
        values = [_json(piece) for piece in re.findall(pattern, text, flags=re.DOTALL)]
        return [] if any(value is None for value in values) else values
    rest = text.strip().removeprefix(form.opening).strip()
    if form.as_list:
        value = _json(rest)
        return value if isinstance(value, list) else []
    values = [_json(piece) for piece in _top_level(rest)]
    return [] if any(value is None for value in values) else values


def _top_level(text: str) -> list[str]:
    """Llama's calls: JSON objects one after the other, perhaps separated by ";"."""
    decoder, pieces, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            _, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return [text]  # the remainder does not parse: reported as such by `_json`
        pieces.append(text[at:end])
        at = end
        while at < len(text) and text[at] in " \t\n;":
            at += 1
    return pieces


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _key(item: Mapping[str, Any], form: ToolFormat) -> str:
    return form.arguments_key if form.arguments_key in item else "arguments"


def _valid(item: Any, form: ToolFormat) -> bool:
    return (isinstance(item, dict) and isinstance(item.get("name"), str)
            and isinstance(item.get(_key(item, form)), (dict, str)))


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def call_schema(tools: Sequence[Tool], name: str | None, form: ToolFormat) -> dict[str, Any]:
    """The JSON schema of one call: of the function `name`, or of any of `tools` when None."""
    chosen = [tool["function"] for tool in tools if name is None or tool["function"]["name"] == name]
    each = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                               form.arguments_key: function.get("parameters") or _NO_PARAMETERS},
             "required": ["name", form.arguments_key], "additionalProperties": False} for function in chosen]
    one = each[0] if len(each) == 1 else {"anyOf": each}
    return {"type": "array", "items": one, "minItems": 1, "maxItems": 1} if form.as_list else one


def call_grammar(tools: Sequence[Tool], name: str | None, form: ToolFormat) -> str:
    """The Lark grammar (llguidance's dialect) of an answer that is one call, of `name` or of any of `tools`."""
    schema = json.dumps(call_schema(tools, name, form))
    if form.anchored:  # the opening is a special token, not text
        return f"start: call\ncall: %json {schema}\n"
    return f"start: {json.dumps(form.opening + chr(10))} call {json.dumps(chr(10) + form.closing)}\ncall: %json {schema}\n"


class CallStream:
    """An answer's text as its pieces arrive: the text that can be shown at once, and the calls once it ends.

    Text that may start a call (the format's opening, or its first characters) is held back until the answer ends.
    """

    def __init__(self, form: ToolFormat, names: Sequence[str]) -> None:
        self.form = form
        self.names = list(names)
        self.text = ""
        self.shown = 0

    def push(self, piece: str) -> str:
        """The text of the answer so far that is not (and cannot become) part of a call and was not shown yet."""
        self.text += piece
        shown, self.shown = self.shown, max(self.shown, self._safe())
        return self.text[shown:self.shown]

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(the text held back that is no call, the calls) once the answer ended."""
        _, calls = parse_calls(self.text, self.form, self.names)
        rest = "" if calls else self.text[self.shown:]
        self.shown = len(self.text)
        return rest, calls

    def _safe(self) -> int:
        """How much of the text cannot be part of a call."""
        start = call_start(self.text, self.form)
        if start is not None:
            return start
        if not self.form.anchored:
            held = next((n for n in range(len(self.form.opening) - 1, 0, -1)
                         if self.text.endswith(self.form.opening[:n])), 0)
            return len(self.text) - held
        stripped = self.text.lstrip()
        return 0 if self.shown == 0 and self.form.opening.startswith(stripped) else len(self.text)

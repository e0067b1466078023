"""Tool calling: a conversation with functions a chat model may call, rendered, its calls forced or read.

A model's chat template says how it calls tools; `tool_format` reads which of the formats of
`attn.inference.tool_calls` it writes (Qwen's and Hermes' `<tool_call>`, Llama 3.1's JSON, Mistral's
`[TOOL_CALLS]`). For `FALLBACK`, a template that knows no tools (SmolLM2's ChatML), the tool list and the Hermes
call format go into the system message (`FALLBACK_INSTRUCTIONS`), the `tool` messages that follow one another
become one user message holding each result as `<tool_response>\\n...\\n</tool_response>`, and an assistant's calls
its text in the Hermes format.

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
from collections.abc import Mapping, Sequence
from typing import Any

from attn.artifacts import Bundle
from attn.core.errors import ConfigError, GenerationError
from attn.data.chat_template import ChatTemplate
from attn.decoding import GenerationConfig
from attn.decoding.grammar import JSON_LAYOUT, Grammar
from attn.inference.continuation import continue_texts
from attn.inference.tool_calls import (
    CallStream,
    ToolCall,
    ToolFormat,
    parse_calls,
    tool_format,
)

Tool = Mapping[str, Any]  # OpenAI's {"type": "function", "function": {"name", "description", "parameters"}}
Message = Mapping[str, Any]
CHOICES = ("none", "auto", "required")
FALLBACK_INSTRUCTIONS = (
    "You may call functions to answer. The functions, as JSON schemas:\n<tools>\n{tools}\n</tools>\n\nTo call a "
    "function, answer with nothing but\n<tool_call>\n{{\"name\": <the function's name>, \"arguments\": <its "
    "arguments as a JSON object>}}\n</tool_call>\nA function's result comes back in <tool_response></tool_response> "
    "tags.")
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def function_names(tools: Sequence[Tool]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def check_tool_choice(tools: Sequence[Tool], choice: str | Mapping[str, Any] | None) -> str:
    """`tool_choice` as "none", "auto", "required", or the name of the function a call must be of.

    Raises:
        ConfigError: a choice that is none of these, or names no function of `tools`; "required" or a function
            without tools (field "tool_choice").
    """
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ConfigError("tool_choice", "name a function as {\"type\": \"function\", \"function\": {\"name\": "
                              "...}}, or send \"none\", \"auto\" or \"required\"")
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
    plain: list[dict[str, Any]] = []
    for number, message in enumerate(messages):
        if message["role"] == "tool":
            response = f"<tool_response>\n{message['content']}\n</tool_response>"
            if number and messages[number - 1]["role"] == "tool":  # the results of one turn's calls, together
                plain[-1]["content"] += f"\n{response}"
            else:
                plain.append({"role": "user", "content": response})
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
    schema = json.dumps({**call_schema(tools, name, form), "x-guidance": JSON_LAYOUT})
    if form.anchored:  # the opening is a special token, not text
        return f"start: call\ncall: %json {schema}\n"
    opening, closing = json.dumps(form.opening + "\n"), json.dumps("\n" + form.closing)
    return f"start: {opening} call {closing}\ncall: %json {schema}\n"


@dataclasses.dataclass(frozen=True)
class ToolUse:
    """The tools of one conversation and what its answer does with them.

    Attributes:
        tools: the functions the model may call (OpenAI's tool objects).
        choice: "none" (no calls: the prompt lists no tools and the answer is text), "auto" (the model may call),
            "required" (the answer is one call, of any function) or the name of the function the answer calls.
        form: the format of the model's calls, read from its chat template.
    """

    tools: tuple[Tool, ...]
    choice: str
    form: ToolFormat

    @classmethod
    def of(cls, template: ChatTemplate, tools: Sequence[Tool] | None,
           tool_choice: str | Mapping[str, Any] | None = None) -> ToolUse:
        """The tool use a request asks (`tool_choice` checked by `check_tool_choice`)."""
        tools = tuple(tools or ())
        return cls(tools, check_tool_choice(tools, tool_choice), tool_format(template.source))

    @property
    def calls(self) -> bool:
        """Whether the answer may hold calls."""
        return self.choice != "none" and bool(self.tools)

    def prompt(self, template: ChatTemplate, messages: Sequence[Message]) -> str:
        return render(template, messages, self.tools, self.choice)

    def grammar(self) -> Grammar | None:
        """The grammar of a forced call ("required" or a named function), else None.

        Raises:
            ConfigError: llguidance cannot follow a function's parameter schema (field "tools").
        """
        if self.choice in ("none", "auto"):
            return None
        name = None if self.choice == "required" else self.choice
        try:
            return Grammar("lark", call_grammar(self.tools, name, self.form))
        except GenerationError as error:
            raise ConfigError("tools", f"a call cannot be forced to follow the functions' parameter schemas "
                              f"({error.detail}); correct the schema, or send tool_choice \"auto\"") from None

    def applied(self, config: GenerationConfig) -> GenerationConfig:
        """`config` with the grammar of the call this forces, if it forces one.

        Raises:
            ConfigError: a forced call and another grammar in `config` (field "tool_choice"), or a parameter schema
                llguidance cannot follow (field "tools").
        """
        grammar = self.grammar()
        if grammar is None:
            return config
        if config.grammar is not None:
            raise ConfigError("tool_choice", "a forced call is all the answer holds, so it cannot also follow "
                              "another format (response_format, --json-schema, ...); leave that out, or let the "
                              "model choose (tool_choice \"auto\")")
        return dataclasses.replace(config, grammar=grammar)

    def parsed(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(the answer's text, None when there is none; its calls)."""
        return parse_calls(text, self.form, function_names(self.tools)) if self.calls else (text, [])

    def stream(self) -> CallStream:
        return CallStream(self.form, function_names(self.tools) if self.calls else [])


def tool_answer(bundle: Bundle, messages: Sequence[Message], tools: Sequence[Tool] | None,
                tool_choice: str | Mapping[str, Any] | None = None,
                config: GenerationConfig | None = None) -> dict[str, Any]:
    """The assistant's answer to a conversation with tools, as an OpenAI message (append it to `messages`, then
    the results as `tool` messages, to continue).

    Raises:
        ConfigError: a wrong `tool_choice`; ChatTemplateError: the template fails on the conversation;
        GenerationError: the conversation is too long for the model.
    """
    template = bundle.compiled_chat_template()
    use = ToolUse.of(template, tools, tool_choice)
    config = use.applied(config or GenerationConfig())
    text = continue_texts(bundle, [use.prompt(template, messages)], config, chat=True)[0][0].text
    content, calls = use.parsed(text)
    return {"role": "assistant", "content": content, "tool_calls": [call.openai() for call in calls] or None}

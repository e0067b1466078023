"""Tool calls read from answers written by hand in each format chat templates define (Qwen's and Hermes'
`<tool_call>`, Llama 3.1's JSON, Mistral's `[TOOL_CALLS]`), whole and streamed; the format read from a template's
text; the fallback conversation of a template that knows no tools; `tool_choice` checked; the schema a forced call
follows."""

from __future__ import annotations

import json

import pytest
from chat_models import SMOLLM2_TEMPLATE

from attn.core.errors import ConfigError
from attn.data.chat_template import ChatTemplate
from attn.inference.tools import (
    FALLBACK,
    HERMES,
    LLAMA3,
    MISTRAL,
    CallStream,
    call_schema,
    check_tool_choice,
    parse_calls,
    render,
    tool_format,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMES = ["get_weather", "get_time"]

# (format, answer, the text before the calls, the calls as (name, arguments))
ANSWERS = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None,
     [("get_weather", {"city": "Paris"})]),
    (HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Let me look.",
     [("get_weather", {"city": "Zürich"}), ("get_time", {})]),
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),  # stopped at the end
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", {"city": "Paris"})]),
    (LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", '
             '"parameters": {}}', None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    (MISTRAL, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
              '"arguments": {}}]', None, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (MISTRAL, ' [{"name": "get_time", "arguments": {}}]', None, [("get_time", {})]),  # the special token decoded away
]
# Answers that hold no call: text, a call of an unknown function, JSON that does not parse, a call in the wrong place.
TEXTS = [
    (HERMES, "The weather is fine."),
    (HERMES, '<tool_call>\n{"name": "get_mood", "arguments": {}}\n</tool_call>'),
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {\n</tool_call>'),
    (LLAMA3, 'Sure: {"name": "get_time", "parameters": {}}'),
    (LLAMA3, '{"name": "get_time"}'),
    (MISTRAL, "[1, 2]"),
]


@pytest.mark.parametrize(("form", "answer", "text", "calls"), ANSWERS)
def test_calls_are_read_from_each_format(form, answer: str, text: str | None, calls: list) -> None:
    found_text, found = parse_calls(answer, form, NAMES)
    assert found_text == text
    assert [(call.name, json.loads(call.arguments)) for call in found] == calls
    assert len({call.id for call in found}) == len(found)


@pytest.mark.parametrize(("form", "answer"), TEXTS)
def test_an_answer_without_a_valid_call_is_text(form, answer: str) -> None:
    assert parse_calls(answer, form, NAMES) == (answer, [])


@pytest.mark.parametrize(("form", "answer", "text", "calls"), ANSWERS)
def test_a_streamed_answer_shows_only_the_text_before_its_calls(form, answer: str, text: str | None,
                                                                calls: list) -> None:
    stream = CallStream(form, NAMES)
    shown = "".join(stream.push(answer[i:i + 3]) for i in range(0, len(answer), 3))
    rest, found = stream.finish()
    assert (shown + rest).strip() == (text or "") and [(c.name, json.loads(c.arguments)) for c in found] == calls


@pytest.mark.parametrize(("form", "answer"), TEXTS)
def test_a_streamed_answer_without_calls_is_all_text(form, answer: str) -> None:
    stream = CallStream(form, NAMES)
    shown = "".join(stream.push(character) for character in answer)
    rest, found = stream.finish()
    assert shown + rest == answer and found == []


def test_plain_text_streams_at_once() -> None:
    stream = CallStream(HERMES, NAMES)
    assert stream.push("Hello <tool") == "Hello "  # "<tool" may start a call
    assert stream.push("s are fun") == "<tools are fun"
    llama = CallStream(LLAMA3, NAMES)
    assert (llama.push(" "), llama.push("Hi"), llama.push(" {")) == ("", " Hi", " {")


MISTRAL_TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}[TOOL_CALLS]"
LLAMA_TEMPLATE = ('{% if tools %}Respond as {"name": function name, "parameters": arguments}{% endif %}'
                  "{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.mark.parametrize(("template", "form"), [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>", HERMES), (MISTRAL_TEMPLATE, MISTRAL),
    (LLAMA_TEMPLATE, LLAMA3), ("{{ '<|python_tag|>' }}", LLAMA3), (SMOLLM2_TEMPLATE, FALLBACK)])
def test_the_format_is_read_from_the_template(template: str, form) -> None:
    assert tool_format(template) == form


def test_a_template_without_tools_gets_them_in_a_system_message_and_results_as_text() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = render(ChatTemplate(SMOLLM2_TEMPLATE), messages, [WEATHER])
    tools = json.dumps(WEATHER, ensure_ascii=False)
    assert prompt == (
        f"<|im_start|>system\nYou may call functions to answer. The functions, as JSON schemas:\n<tools>\n{tools}\n"
        "</tools>\n\nTo call a function, answer with nothing but\n<tool_call>\n{\"name\": <the function's name>, "
        "\"arguments\": <its arguments as a JSON object>}\n</tool_call>\nA function's result comes back in "
        "<tool_response></tool_response> tags.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(ChatTemplate(SMOLLM2_TEMPLATE), system, [WEATHER]).startswith(
        "<|im_start|>system\nBe brief.\n\nYou may call functions")
    assert render(ChatTemplate(SMOLLM2_TEMPLATE), system, [WEATHER], "none") == ChatTemplate(SMOLLM2_TEMPLATE).render(
        system, True)


@pytest.mark.parametrize(("choice", "expected"), [
    (None, "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "function": {"name": "get_time"}}, "get_time")])
def test_a_tool_choice_is_read(choice, expected: str) -> None:
    assert check_tool_choice([WEATHER, TIME], choice) == expected


@pytest.mark.parametrize(("tools", "choice", "words"), [
    ([WEATHER], {"type": "function", "function": {"name": "get_mood"}}, "'get_mood', which is not among the tools"),
    ([WEATHER], "always", "'always' is not a tool choice"),
    ([], "required", "needs tools")])
def test_a_wrong_tool_choice_is_refused_by_name(tools: list, choice, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as raised:
        check_tool_choice(tools, choice)
    assert raised.value.field == "tool_choice"


def test_a_forced_call_follows_the_functions_schema() -> None:
    one = call_schema([WEATHER, TIME], "get_weather", HERMES)
    assert one == {"type": "object", "properties": {"name": {"const": "get_weather"},
                                                    "arguments": WEATHER["function"]["parameters"]},
                   "required": ["name", "arguments"], "additionalProperties": False}
    assert [item["properties"]["name"] for item in call_schema([WEATHER, TIME], None, LLAMA3)["anyOf"]] == [
        {"const": "get_weather"}, {"const": "get_time"}]
    assert call_schema([TIME], None, MISTRAL)["items"]["properties"]["arguments"] == TIME["function"]["parameters"]

"""Tool calls read from answers written by hand in each format chat templates define (Qwen's and Hermes'
`<tool_call>`, Llama 3.1's JSON, Mistral's `[TOOL_CALLS]`), whole and streamed; the format read from a template's
text; the fallback conversation of a template that knows no tools; `tool_choice` checked; the schema a forced call
follows."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from chat_models import SMOLLM2_TEMPLATE, tiny_chat_bundle

from attn.core.errors import ConfigError
from attn.data.chat_template import ChatTemplate
from attn.decoding import GenerationConfig
from attn.inference.chat import ChatSession
from attn.inference.tool_calls import (
    FALLBACK,
    HERMES,
    LLAMA3,
    MISTRAL,
    CallStream,
    parse_calls,
    tool_format,
)
from attn.inference.tools import call_schema, check_tool_choice, render, tool_answer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMES = ["get_weather", "get_time"]

# (format, answer, the text before the calls, the calls as (name, arguments))
ANSWERS = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None,
     [("get_weather", {"city": "Paris"})]),
    (HERMES, ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'), "Let me look.",
     [("get_weather", {"city": "Zürich"}), ("get_time", {})]),
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),  # stopped at the end
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", {"city": "Paris"})]),
    (LLAMA3, ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", '
              '"parameters": {}}'), None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    (MISTRAL, ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
               '"arguments": {}}]'), None, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
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


def streamed(form, answer: str, size: int) -> tuple[str, dict[int, dict], bool]:
    """The text shown and the calls sent when `answer` arrives `size` characters at a time, with OpenAI's way of
    adding up streamed calls: the first piece of a call has its id and name, each piece adds to its arguments."""
    stream, shown, calls = CallStream(form, NAMES), [], {}
    pieces = [stream.push(answer[i:i + size]) for i in range(0, len(answer), size)]
    *pieces, (rest, deltas, called) = [*pieces, stream.finish()]
    for text, sent in [*pieces, (rest, deltas)]:
        shown.append(text)
        for delta in sent:
            piece = delta.openai()
            if "id" in piece:
                assert delta.index not in calls and piece["function"]["name"] in NAMES
                calls[delta.index] = {"name": piece["function"]["name"], "arguments": ""}
            calls[delta.index]["arguments"] += piece["function"]["arguments"]
    return "".join(shown), calls, called


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize(("form", "answer", "text", "calls"), ANSWERS)
def test_a_streamed_answer_sends_its_text_then_each_calls_name_and_arguments(form, answer: str, text: str | None,
                                                                             calls: list, size: int) -> None:
    shown, sent, called = streamed(form, answer, size)
    assert shown.strip() == (text or "") and called
    assert [(sent[i]["name"], json.loads(sent[i]["arguments"])) for i in range(len(sent))] == calls
    whole = parse_calls(answer, form, NAMES)[1]
    assert [sent[i]["arguments"] for i in range(len(sent))] == [call.arguments for call in whole]


@pytest.mark.parametrize(("form", "answer"), [*TEXTS[:2], *TEXTS[3:]])
def test_a_streamed_answer_without_calls_is_all_text(form, answer: str) -> None:
    assert streamed(form, answer, 1) == (answer, {}, False)


def test_a_streamed_call_that_turns_out_broken_is_followed_by_its_text() -> None:
    form, answer = TEXTS[2]
    shown, sent, called = streamed(form, answer, 1)
    assert (shown, sent, called) == (answer, {0: {"name": "get_time", "arguments": "{"}}, True)


def test_plain_text_streams_at_once() -> None:
    stream = CallStream(HERMES, NAMES)
    assert stream.push("Hello <tool") == ("Hello ", [])  # "<tool" may start a call
    assert stream.push("s are fun") == ("<tools are fun", [])
    llama = CallStream(LLAMA3, NAMES)
    assert [llama.push(piece)[0] for piece in (" ", "Hi", " {")] == ["", " Hi", " {"]


def test_a_call_is_sent_by_its_name_first_then_its_arguments_as_they_come() -> None:
    stream = CallStream(HERMES, NAMES)
    assert stream.push('<tool_call>\n{"name": "get_wea') == ("", [])
    (first,) = stream.push('ther", "arguments": {"city": "Pa')[1]
    assert (first.index, first.name, first.arguments, first.id.startswith("call_")) == (0, "get_weather",
                                                                                       '{"city": "Pa', True)
    assert [d.openai() for d in stream.push('ris"}}\n</tool_call>')[1]] == [
        {"index": 0, "function": {"arguments": 'ris"}'}}]


HERMES_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}<tool_call>"
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
    two = [*messages[:1], {"role": "assistant", "content": "Both.", "tool_calls": [call, {**call, "id": "call_2"}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
           {"role": "tool", "tool_call_id": "call_2", "content": "windy"}]
    assert render(ChatTemplate(SMOLLM2_TEMPLATE), two, None).endswith(
        "<|im_start|>assistant\nBoth.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwindy\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")
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


NOTHING = {"type": "function", "function": {"name": "get_time"}}  # a function of no arguments
# A function whose arguments are bounded, so that a random model's forced call ends within a few dozen tokens.
BOOKING = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "properties": {"room": {"type": "string", "pattern": "^[a-z]{1,3}$"},
                                     "nights": {"type": "integer", "minimum": 1, "maximum": 9},
                                     "view": {"type": "string", "enum": ["sea", "park"]}},
    "required": ["room", "nights", "view"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def chat_bundle():
    return tiny_chat_bundle()


@pytest.mark.parametrize(("template", "choice"), [
    (HERMES_TEMPLATE, {"type": "function", "function": {"name": "book"}}),
    (LLAMA_TEMPLATE, "required"), (MISTRAL_TEMPLATE, {"type": "function", "function": {"name": "book"}}),
], ids=["hermes", "llama3", "mistral"])
def test_a_forced_call_of_a_random_model_is_a_valid_call(chat_bundle, template: str, choice) -> None:
    bundle = dataclasses.replace(chat_bundle, chat_template=template)
    config = GenerationConfig(max_new_tokens=80, sample=True, seed=0)
    answer = tool_answer(bundle, [{"role": "user", "content": "A room?"}], [NOTHING, BOOKING], choice, config)
    (call,) = answer["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] in (("book", "get_time") if choice == "required"
                                                                       else ("book",))
    arguments = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "book":  # the schema, checked by hand
        assert set(arguments) == {"room", "nights", "view"} and isinstance(arguments["room"], str)
        assert re.fullmatch("[a-z]{1,3}", arguments["room"]) and arguments["nights"] in range(1, 10)
        assert arguments["view"] in ("sea", "park")
    else:
        assert arguments == {}


def test_a_chat_session_calls_a_function_then_answers_its_result(chat_bundle) -> None:
    bundle = dataclasses.replace(chat_bundle, chat_template=HERMES_TEMPLATE)
    session = ChatSession(bundle, GenerationConfig(max_new_tokens=80, sample=True, seed=0), tools=[NOTHING, BOOKING],
                          tool_choice={"type": "function", "function": {"name": "book"}})
    with pytest.raises(ConfigError, match="one result per call"):
        session.answer_calls(["booked"])
    shown = "".join(session.reply("A room?"))
    (call,) = session.calls
    assert shown.startswith('<tool_call>\n{"name": "book", "arguments": {') and call.name == "book"
    answer = "".join(session.answer_calls(["booked"]))
    assert session.messages == [{"role": "user", "content": "A room?"},
                                {"role": "assistant", "content": None, "tool_calls": [call.openai()]},
                                {"role": "tool", "tool_call_id": call.id, "content": "booked"},
                                {"role": "assistant", "content": answer}]
    assert session.calls == [] and "<tool_call>" not in answer

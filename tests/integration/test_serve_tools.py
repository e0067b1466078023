"""Tool calling through `attn serve` and the official `openai` client: the real SmolLM2, whose template knows no
tools (the fallback format), is forced to call a function (one named, and "required"), its call is
sent back with the function's result as a `tool` message, and it answers in text (`tool_choice` "none"); whole and
streamed, the streamed call's pieces adding up to the whole answer's call. A tiny random chat model checks what the
server refuses, each a 422 naming the field."""

from __future__ import annotations

import json

import pytest
from chat_models import tiny_chat_bundle
from fastapi.testclient import TestClient
from reference_imports import require
from serve_models import smollm2_openai

from attn.app.serve import ServedModel, create_app

jsonschema_rs = require("jsonschema_rs")

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                            "parameters": PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = "Sunny, 21 degrees."


@pytest.fixture(scope="module")
def smollm2():
    with smollm2_openai() as client:
        yield client


def streamed(chunks) -> tuple[str, list[dict], str, list]:
    """The text, the calls (added up as OpenAI's clients add them), the finish reason and each call's deltas."""
    text, calls, deltas, finish = "", {}, [], None
    for chunk in chunks:
        (choice,) = chunk.choices
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            deltas.append(delta)
            if delta.id is not None:
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish, deltas


def test_smollm2_calls_the_named_function_then_answers_with_its_result(smollm2) -> None:
    first = smollm2.chat.completions.create(model="smollm2", messages=QUESTION, tools=[TIME, WEATHER],
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            temperature=0, max_tokens=40)
    (answer,) = first.choices
    assert answer.finish_reason == "tool_calls" and answer.message.content is None
    (call,) = answer.message.tool_calls
    assert (call.type, call.function.name, call.id[:5]) == ("function", "get_weather", "call_")
    jsonschema_rs.validate(PARAMETERS, json.loads(call.function.arguments))
    messages = [*QUESTION, answer.message, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    final = smollm2.chat.completions.create(model="smollm2", messages=messages, tools=[TIME, WEATHER],
                                            tool_choice="none", temperature=0, max_tokens=6)
    (reply,) = final.choices
    assert reply.message.tool_calls is None and reply.message.content and reply.finish_reason in ("stop", "length")


def test_a_streamed_call_adds_up_to_the_whole_one(smollm2) -> None:
    asked = {"model": "smollm2", "messages": QUESTION, "tools": [WEATHER], "tool_choice": "required",
             "temperature": 0, "max_tokens": 40}
    whole = smollm2.chat.completions.create(**asked).choices[0].message.tool_calls[0]
    text, calls, finish, deltas = streamed(smollm2.chat.completions.create(**asked, stream=True))
    assert (text, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [(whole.function.name, whole.function.arguments)]
    first, *rest = deltas
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather") and first.id
    assert all(d.id is None and d.function.name is None for d in rest) and len(deltas) > 2  # arguments in pieces
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function", "function": {"name": "get_weather",
                                                                "arguments": calls[0]["arguments"]}}]},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}]
    text, calls, finish, _ = streamed(smollm2.chat.completions.create(
        model="smollm2", messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=6,
        stream=True))
    assert text and calls == [] and finish in ("stop", "length")


@pytest.fixture(scope="module")
def tiny():
    with TestClient(create_app([ServedModel("chat", tiny_chat_bundle(1024))])) as client:
        yield client


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_mood"}}}, "tool_choice",
     "names the function 'get_mood', which is not among the tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "'always' is not a tool choice"),
    ({"tool_choice": "required"}, "tool_choice", "\"required\" needs tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name",
     "Field required"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name", "should match pattern"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type", "Input should be 'function'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools.0.function.parameters", "give a schema of \"type\": \"object\""),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot also follow another format"),
    ({"messages": [*QUESTION, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id",
     "a tool message gives the id of the call it answers"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content", "null only in an assistant message"),
])
def test_a_wrong_tool_request_is_a_422_naming_the_field(tiny: TestClient, fields: dict, param: str,
                                                        words: str) -> None:
    found = tiny.post("/v1/chat/completions", json={"model": "chat", "messages": QUESTION, "max_tokens": 4, **fields})
    assert found.status_code == 422, found.text
    error = found.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_tool_choice_none_and_auto_answer_in_text_with_a_random_model(tiny: TestClient) -> None:
    for choice in ("none", "auto"):
        found = tiny.post("/v1/chat/completions", json={"model": "chat", "messages": QUESTION, "tools": [WEATHER],
                                                         "tool_choice": choice, "max_tokens": 6, "temperature": 0})
        (answer,) = found.json()["choices"]
        assert answer["message"]["tool_calls"] is None and answer["finish_reason"] in ("stop", "length")

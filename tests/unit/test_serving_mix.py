"""The serving soak's structured-output, tool and multi-turn exchanges: what counts as valid, and what is sent."""

import asyncio
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, where benchmarks/ lies
from benchmarks.serving_load import Answered
from benchmarks.serving_mix import TURNS, exchange, tool_result, valid_call, valid_json
from benchmarks.serving_soak import Tally


def call(name, arguments, kind="function"):
    return {"id": "call_1", "type": kind, "function": {"name": name, "arguments": arguments}}


def test_a_structured_answer_is_valid_only_under_its_schema():
    assert valid_json(0, '{"city": "Paris", "country": "France"}')
    assert not valid_json(0, '{"city": "Paris"}')  # a required key missing
    assert not valid_json(0, '{"city": "Paris", "country": "France", "sea": "no"}')  # a key the schema forbids
    assert not valid_json(1, '{"answer": 1001}')  # above its maximum
    assert not valid_json(2, '{"colours": [""]}')  # an empty colour
    assert not valid_json(3, '{"answer": "maybe", "reason": "x"}')  # not among the choices
    assert not valid_json(0, '{"city": "Paris", "country": ')  # cut short


def test_a_forced_call_is_valid_when_it_is_one_call_to_the_named_tool_with_valid_arguments():
    assert valid_call({"tool_calls": [call("add", '{"a": 1, "b": 2}')]}, None)
    assert valid_call({"tool_calls": [call("add", '{"a": 1, "b": 2}')]}, "add")
    assert not valid_call({"tool_calls": [call("add", '{"a": 1, "b": 2}')]}, "get_weather")
    assert not valid_call({"tool_calls": [call("subtract", '{"a": 1, "b": 2}')]}, None)
    assert not valid_call({"tool_calls": [call("add", '{"a": 1}')]}, None)
    assert not valid_call({"tool_calls": [call("get_weather", '{"city": "Oslo", "unit": "kelvin"}')]}, None)
    assert not valid_call({"tool_calls": [call("add", '{"a": 1, "b": 2}')] * 2}, None)
    assert not valid_call({"content": "3", "tool_calls": None}, None)


def test_the_tools_answer_as_written():
    assert tool_result(call("add", '{"a": 12, "b": 30}')) == "42"
    assert json.loads(tool_result(call("get_weather", '{"city": "Oslo", "unit": "fahrenheit"}'))) == {
        "temperature": 21, "unit": "fahrenheit"}


def chat_server(answers):
    """A fake chat route answering the bodies it gets with `answers(body)`, keeping every body."""
    bodies = []

    def handle(request):
        body = json.loads(request.content)
        bodies.append(body)
        message = answers(body)
        return httpx.Response(200, json={"id": f"chatcmpl-{len(bodies)}", "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}]})

    return httpx.MockTransport(handle), bodies


def run(route, i, answers):
    transport, bodies = chat_server(answers)

    async def go():
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await exchange(client, route, i)

    return asyncio.run(go()), bodies


def test_the_tool_round_trip_sends_the_call_and_its_result_back():
    def answers(body):
        if body["tool_choice"] == "none":
            return {"role": "assistant", "content": "It is 42."}
        return {"role": "assistant", "content": None, "tool_calls": [call("add", '{"a": 12, "b": 30}')]}

    found, bodies = run("tool_round", 3, answers)
    assert found.valid and found.status == 200 and found.ids == {"chatcmpl-1", "chatcmpl-2"}
    assert found.answer == ([("add", '{"a": 12, "b": 30}')], "It is 42.")
    assert bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    sent, result = bodies[1]["messages"][-2:]
    assert sent["tool_calls"][0]["id"] == result["tool_call_id"] == "call_1"
    assert result == {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def test_a_forced_tool_request_answered_with_text_is_invalid_and_counted_so():
    found, _ = run("tool", 0, lambda body: {"role": "assistant", "content": "3"})
    assert not found.valid
    tally = Tally(("tool",), {("tool", 0): []})
    assert tally.outcome("tool", 0, found) == "invalid"
    assert tally.figures()["totals"]["invalid"] == 1


def test_a_multi_turn_chat_carries_its_conversation():
    found, bodies = run("multi_turn", 2, lambda body: {"role": "assistant", "content": f"answer {len(body['messages'])}"})
    assert TURNS == 3 and len(bodies) == 3
    assert found.answer == ("answer 1", "answer 3", "answer 5")
    assert [m["role"] for m in bodies[-1]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert bodies[-1]["messages"][1]["content"] == "answer 1"


def test_a_valid_answer_that_differs_from_its_answer_alone_is_different():
    tally = Tally(("json",), {("json", 0): '{"city": "Paris", "country": "France"}'})
    assert tally.outcome("json", 0, Answered(200, 0.1, '{"city": "Lyon", "country": "France"}', ids={"a"})) == "different"
    assert tally.outcome("json", 0, Answered(200, 0.1, '{"city": "Paris", "country": "France"}', ids={"b"})) == "answered"

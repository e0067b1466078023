"""`attn serve` made safe to expose: API keys, request deadlines, caps on what a request asks for, the per-key
concurrency limit and CORS, through the HTTP API (FastAPI's TestClient) on tiny random models."""

from __future__ import annotations

import contextlib
import hmac
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from chat_models import tiny_chat_bundle
from fastapi import FastAPI
from fastapi.testclient import TestClient
from serve_models import app_routes, tiny_bundles

from attn.app.cli import main
from attn.app.serve import ServedModel, ServeOptions, api_keys, create_app
from attn.app.serve.access import needs_key, read_key_file
from attn.artifacts import Bundle
from attn.decoding import RunningBatch
from attn.core.errors import ConfigError

KEY, OTHER = "first-key-3f9c", "second-key-a71d"
HEADERS = {"Authorization": f"Bearer {KEY}"}
# A request each route answers with 200 (the schema's own pages are GETs without a body).
BODIES = {"/v1/completions": {"model": "lm", "prompt": "In", "max_tokens": 2},
          "/v1/chat/completions": {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
          "/v1/translate": {"model": "translator", "input": "In the beginning.", "max_tokens": 3},
          "/v1/embeddings": {"model": "encoder", "input": "Hello"},
          "/v1/classify": {"model": "classifier", "input": "Hello"},
          "/v1/attention": {"model": "lm", "text": "Hello", "layer": 0, "head": 0}}


@pytest.fixture(scope="module")
def bundles() -> dict[str, Bundle]:
    return {**tiny_bundles(), "chat": tiny_chat_bundle(max_positions=64)}


def served(bundles: dict[str, Bundle], *names: str) -> list[ServedModel]:
    return [ServedModel(name, bundle) for name, bundle in bundles.items() if not names or name in names]


@contextlib.contextmanager
def client_of(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as client:  # a 500 is an answer to check, as a client gets it
        yield client


def send(client: TestClient, method: str, path: str, headers: dict[str, str] | None = None):
    return client.request(method, path, json=BODIES.get(path), headers=headers or {})


def check_error(response, status: int, expect: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and expect in error["message"] and set(error) == {"message", "type", "param", "code"}
    return error


# -- keys ---------------------------------------------------------------------------------------


def test_with_a_key_no_guarded_route_answers_without_it(bundles: dict[str, Bundle]) -> None:
    app = create_app(served(bundles), ServeOptions(api_keys=(KEY, OTHER)))
    routes = app_routes(app.routes)  # every route, so that a new one cannot be left open by mistake
    guarded = [(method, path) for method, path in routes if needs_key(path)]
    assert len(guarded) >= 8 and {path for _, path in routes} - {path for _, path in guarded} == {"/", "/health"}
    wrong = [{}, {"Authorization": "Bearer not-a-key"}, {"Authorization": f"Basic {KEY}"},
             {"Authorization": f"Bearer {KEY}x"}, {"Authorization": "Bearer"}, {"X-Api-Key": KEY}]
    with client_of(app) as client:
        for method, path in guarded:
            for headers in wrong:
                response = send(client, method, path, headers)
                error = check_error(response, 401, "API key")
                assert error["type"] == "invalid_request_error" and response.headers["www-authenticate"] == "Bearer"
            for key in (KEY, OTHER):
                assert send(client, method, path, {"Authorization": f"bearer {key}"}).status_code == 200, path
        for method, path in set(routes) - set(guarded):
            assert send(client, method, path).status_code == 200, path
        assert client.get("/v1/no-such-route").status_code == 401  # nothing under /v1/ is told to a stranger


def test_without_a_key_every_route_is_open_as_before(bundles: dict[str, Bundle]) -> None:
    app = create_app(served(bundles))
    with client_of(app) as client:
        for method, path in app_routes(app.routes):
            assert send(client, method, path).status_code == 200, path
        assert "securitySchemes" not in client.get("/openapi.json").json().get("components", {})


def test_the_schema_says_which_routes_need_the_key(bundles: dict[str, Bundle]) -> None:
    with client_of(create_app(served(bundles, "lm"), ServeOptions(api_keys=(KEY,)))) as client:
        schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"] == {"apiKey": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            assert ("security" in operation) == needs_key(path), path
            assert not needs_key(path) or "401" in operation["responses"], path


def test_keys_are_compared_in_constant_time_with_every_key(bundles: dict[str, Bundle],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(given: bytes, key: bytes) -> bool:
        compared.append((given, key))
        return real(given, key)

    monkeypatch.setattr("attn.app.serve.access.hmac.compare_digest", spy)
    with client_of(create_app(served(bundles, "lm"), ServeOptions(api_keys=(KEY, OTHER)))) as client:
        for key, status in ((KEY, 200), (OTHER, 200), ("guess", 401)):
            compared.clear()
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == status
            assert compared == [(key.encode(), KEY.encode()), (key.encode(), OTHER.encode())]


def test_keys_never_reach_logs_errors_or_metrics(bundles: dict[str, Bundle], caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    near = KEY[:-1] + "0"  # a key one character off
    options = ServeOptions(api_keys=(KEY,))
    assert KEY not in repr(options)
    texts = []
    with client_of(create_app(served(bundles, "lm", "encoder"), options)) as client:
        for key in (KEY, near, OTHER):
            for path in BODIES:
                texts.append(send(client, "POST", path, {"Authorization": f"Bearer {key}"}).text)
        monkeypatch.setattr("attn.app.serve.work.embed", lambda *args: 1 / 0)  # an internal error, logged
        texts.append(send(client, "POST", "/v1/embeddings", HEADERS).text)
        metrics = client.get("/metrics", headers=HEADERS).text
    assert 'status="401"' in metrics and 'status="500"' in metrics and "ZeroDivisionError" in caplog.text
    for secret in (KEY, near, OTHER):
        assert secret not in caplog.text and secret not in metrics and not any(secret in text for text in texts)


def test_key_files_and_the_environment(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# the team's keys\n\n{KEY}\n  {OTHER}  \n# old: revoked\n", encoding="utf-8")
    assert read_key_file(keys) == (KEY, OTHER)
    assert api_keys(keys, {"ATTN_API_KEY": "third"}) == (KEY, OTHER, "third")
    assert api_keys(None, {}) == () and api_keys(None, {"ATTN_API_KEY": KEY}) == (KEY,)
    with pytest.raises(ConfigError, match="ATTN_API_KEY: is set but empty"):
        api_keys(None, {"ATTN_API_KEY": " "})
    keys.write_text("# none yet\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"--api-key-file: {keys} holds no key"):
        read_key_file(keys)
    keys.write_text(f"{KEY} {OTHER}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{keys}:1: a key must be printable ASCII without spaces") as found:
        read_key_file(keys)
    assert KEY not in str(found.value)


# -- who may listen where -----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.com"])
def test_an_exposed_host_without_a_key_is_refused_in_one_line(host: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--model", "no-such-model", "--host", host]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"attn: error: --host: {host} lets other machines reach the server, which then "
                                 "needs an API key: give --api-key-file FILE (or set ATTN_API_KEY), or "
                                 "--insecure-no-key to serve without one\n")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_host_needs_no_key(host: str) -> None:
    assert not ServeOptions(host=host).exposed_without_key


def test_an_exposed_host_serves_with_a_key_or_the_explicit_flag() -> None:
    assert not ServeOptions(host="0.0.0.0", api_keys=(KEY,)).exposed_without_key
    assert ServeOptions(host="0.0.0.0", insecure_no_key=True).exposed_without_key


# -- deadlines ----------------------------------------------------------------------------------


def held_embed(release: threading.Event, started: threading.Event):
    """An `embed` that holds the model's thread until `release` (the work of a slow request)."""

    def embed(bundle, texts):
        started.set()
        release.wait(30)
        return torch.zeros(len(texts), 4)

    return embed


def queue_length(client: TestClient, model: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'attn_queue_length{{model="{model}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no queue length of {model}")


def test_a_request_past_its_deadline_is_a_504_and_leaves_the_queue(bundles: dict[str, Bundle],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    release, started = threading.Event(), threading.Event()
    monkeypatch.setattr("attn.app.serve.work.embed", held_embed(release, started))
    options = ServeOptions(request_timeout_s=0.5, max_queue=2)
    with client_of(create_app(served(bundles, "encoder"), options)) as client:
        began = time.monotonic()
        running = client.post("/v1/embeddings", json={"input": "a"})  # its batch runs on until released
        check_error(running, 504, "longer than this server's limit of 0.5 s (--request-timeout) and was stopped")
        assert running.json()["error"]["type"] == "server_error" and time.monotonic() - began < 10
        waiting = client.post("/v1/embeddings", json={"input": "b"})  # queued behind it: leaves the queue at once
        check_error(waiting, 504, "--request-timeout")
        assert queue_length(client, "encoder") == 1
        release.set()
        deadline = time.monotonic() + 10
        while queue_length(client, "encoder") != 0:
            assert time.monotonic() < deadline, "the finished batch did not free its place"
            time.sleep(0.02)
        monkeypatch.undo()
        assert client.post("/v1/embeddings", json={"input": "c"}).status_code == 200


def test_a_completion_past_its_deadline_leaves_the_running_batch(bundles: dict[str, Bundle],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    step = RunningBatch.step

    def slow_step(self):
        time.sleep(0.05)
        return step(self)

    monkeypatch.setattr(RunningBatch, "step", slow_step)
    body = {"prompt": "In", "max_tokens": 40, "temperature": 0}
    with client_of(create_app(served(bundles, "lm"), ServeOptions(request_timeout_s=0.4))) as client:
        check_error(client.post("/v1/completions", json=body), 504, "--request-timeout")
        streamed = client.post("/v1/completions", json={**body, "stream": True})
        assert streamed.status_code == 200  # the status went out with the first token: the error ends the stream
        last = streamed.text.strip().split("\n\n")[-1]
        assert '"code": 504' in last and "--request-timeout" in last and "[DONE]" not in streamed.text
        deadline = time.monotonic() + 5
        while queue_length(client, "lm") != 0:  # the rows left the batch at its next step
            assert time.monotonic() < deadline
            time.sleep(0.02)


# -- caps and the per-key limit -----------------------------------------------------------------


def test_caps_refuse_more_and_hold_the_defaults(bundles: dict[str, Bundle]) -> None:
    options = ServeOptions(max_tokens_cap=3, max_n=2)
    with client_of(create_app(served(bundles, "lm", "chat", "translator"), options)) as client:
        check_error(client.post("/v1/completions", json={"model": "lm", "prompt": "In", "max_tokens": 4}), 422,
                    "max_tokens: 4 is more than this server's cap of 3 new tokens (--max-tokens-cap)")
        chat = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
        error = check_error(client.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 9}), 422,
                            "cap of 3 new tokens")
        assert error["param"] == "max_completion_tokens"
        error = check_error(client.post("/v1/completions", json={"model": "lm", "prompt": "In", "n": 3}), 422,
                            "n: 3 choices are more than this server's cap of 2 (--max-n)")
        assert error["param"] == "n"
        check_error(client.post("/v1/translate", json={"model": "translator", "input": "x", "max_tokens": 5}), 422,
                    "cap of 3")
        unasked = client.post("/v1/completions", json={"model": "lm", "prompt": "In", "temperature": 0}).json()
        assert unasked["usage"]["completion_tokens"] <= 3
        assert client.post("/v1/chat/completions", json=chat).json()["usage"]["completion_tokens"] <= 3
        translated = client.post("/v1/translate", json={"model": "translator", "input": "In the beginning."})
        assert translated.status_code == 200


def test_one_key_over_its_concurrency_limit_gets_429_and_another_key_is_served(
        bundles: dict[str, Bundle], monkeypatch: pytest.MonkeyPatch) -> None:
    release, started = threading.Event(), threading.Event()
    monkeypatch.setattr("attn.app.serve.work.embed", held_embed(release, started))
    options = ServeOptions(api_keys=(KEY, OTHER), max_concurrent_per_key=1)
    with client_of(create_app(served(bundles, "encoder", "classifier"), options)) as client:
        first = threading.Thread(target=client.post, args=("/v1/embeddings",),
                                 kwargs={"json": {"model": "encoder", "input": "a"}, "headers": HEADERS})
        first.start()
        assert started.wait(30)
        refused = client.post("/v1/classify", json={"model": "classifier", "input": "b"}, headers=HEADERS)
        other = client.post("/v1/classify", json={"model": "classifier", "input": "b"},
                            headers={"Authorization": f"Bearer {OTHER}"})
        assert client.get("/metrics", headers=HEADERS).status_code == 200  # metrics are not counted
        release.set()
        first.join(30)
        again = client.post("/v1/classify", json={"model": "classifier", "input": "b"}, headers=HEADERS)
    error = check_error(refused, 429, "this API key has 1 requests in flight, the server's limit "
                                      "(--max-concurrent-per-key)")
    assert error["type"] == "rate_limit_error" and refused.headers["retry-after"] == "1"
    assert other.status_code == 200 and again.status_code == 200


# -- CORS ---------------------------------------------------------------------------------------


def test_cors_answers_only_the_allowed_origin(bundles: dict[str, Bundle]) -> None:
    allowed, stranger = "https://notebook.example", "https://elsewhere.example"
    options = ServeOptions(api_keys=(KEY,), cors_origins=(allowed,))
    with client_of(create_app(served(bundles, "lm"), options)) as client:
        for origin, shown in ((allowed, allowed), (stranger, None)):
            answer = client.get("/v1/models", headers={**HEADERS, "Origin": origin})
            assert answer.status_code == 200 and answer.headers.get("access-control-allow-origin") == shown
            refused = client.get("/v1/models", headers={"Origin": origin})  # a 401 is readable by the allowed page
            assert refused.status_code == 401 and refused.headers.get("access-control-allow-origin") == shown
        preflight = client.options("/v1/completions", headers={
            "Origin": allowed, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})  # a browser sends no key here
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == allowed
    with client_of(create_app(served(bundles, "lm"))) as client:  # no --cors-origin: no origin is allowed
        answer = client.get("/v1/models", headers={"Origin": allowed})
        assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


# -- the page -----------------------------------------------------------------------------------


def test_the_page_keeps_the_key_in_a_variable_and_sends_it_on_every_call() -> None:
    page = (Path(__file__).parents[2] / "src/attn/app/serve/static/index.html").read_text(encoding="utf-8")
    assert "localStorage" not in page and "sessionStorage" not in page and "document.cookie" not in page
    assert page.count("fetch(") == 1 and "Authorization: `Bearer ${apiKey}`" in page  # every call goes through api()
    assert "response.status !== 401" in page and "window.prompt(" in page

"""Generated requests against the OpenAPI schema of `attn serve` (schemathesis), in-process.

Schemathesis reads the app's own /openapi.json and draws requests for every operation in it: bodies that fit the
schema (positive) and bodies that break it (negative), each sent with the API key through the ASGI transport (no
network) to a server of tiny models with keys, caps and a request timeout. Every answer must be no 5xx, have a
status, content type, headers and body that the schema documents, and come back within `REQUEST_LIMIT_S`.
Half the bodies are pointed at a model that serves their route, so that the models run, not only the checks.

The CI variant draws a fixed set of examples (derandomized: the same requests every run), >= 1,000 requests;
the slow one draws ten times as many, at random.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Iterator

import pytest
import schemathesis
from chat_models import tiny_chat_bundle
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from serve_models import app_routes, tiny_bundles

from attn.app.serve import ServedModel, ServeOptions, create_app

KEY = "schema-test-key"
OPTIONS = ServeOptions(api_keys=(KEY,), max_tokens_cap=8, max_n=4, request_timeout_s=30.0)
REQUEST_LIMIT_S = 60.0  # longer than the server's own timeout: a request that outlives both hangs
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
# A model that serves each route, which half the generated bodies name.
SERVING = {"/v1/completions": "lm", "/v1/chat/completions": "chat", "/v1/translate": "translator",
           "/v1/embeddings": "encoder", "/v1/classify": "classifier", "/v1/attention": "lm"}
CI_EXAMPLES = 90  # per operation and generation mode: 6 operations with bodies x 2 modes x 90, and the 4 without
CI_REQUESTS = 1000


@pytest.fixture
def app():  # one per test: schemathesis' pytest plugin ends the lifespans of apps after each test, which drains them
    models = [ServedModel(name, bundle) for name, bundle in tiny_bundles().items()]
    return create_app([*models, ServedModel("chat", tiny_chat_bundle(max_positions=64))], OPTIONS)


@pytest.fixture
def schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def sender() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool


def exercise(schema, app, sender: concurrent.futures.ThreadPoolExecutor, examples: int,
             derandomize: bool) -> collections.Counter[str]:
    """Sends the generated requests of every operation; returns how many each got. Fails on the first check that
    fails, with schemathesis' report and the request to reproduce it."""
    sent: collections.Counter[str] = collections.Counter()
    with asgi.get_client(app) as client:  # entered: the app starts once, not once per request
        for result in schema.get_all_operations():
            send_all(result.ok(), client, sender, sent, examples, derandomize)
    return sent


def send_all(operation, client, sender: concurrent.futures.ThreadPoolExecutor, sent: collections.Counter[str],
             examples: int, derandomize: bool) -> None:
    """Sends the generated requests of one operation, positive and (with a body) negative, counting them in `sent`."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for mode in [GenerationMode.POSITIVE, GenerationMode.NEGATIVE] if operation.body else [GenerationMode.POSITIVE]:

        @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
                  suppress_health_check=list(HealthCheck), print_blob=True)
        @given(case=operation.as_strategy(generation_mode=mode))
        def send(case) -> None:
            if isinstance(case.body, dict) and operation.path in SERVING and sum(sent.values()) % 2 == 0:
                case.body["model"] = SERVING[operation.path]
            answer = sender.submit(case.call, session=client, headers=headers).result(timeout=REQUEST_LIMIT_S)
            sent[operation.label] += 1
            case.validate_response(answer, checks=CHECKS, headers=headers)

        send()


def test_every_route_is_in_the_schema(app, schema) -> None:
    routes = {f"{method} {path}" for method, path in app_routes(app.routes)}
    assert len(routes) >= 10 and {result.ok().label for result in schema.get_all_operations()} == routes


def test_generated_requests_get_documented_answers(app, schema, sender) -> None:
    started = time.monotonic()
    sent = exercise(schema, app, sender, CI_EXAMPLES, derandomize=True)
    elapsed = time.monotonic() - started
    print(f"schemathesis: {sum(sent.values())} requests in {elapsed:.1f} s: {dict(sent)}")
    assert len(sent) == sum(1 for _ in schema.get_all_operations())
    assert sum(sent.values()) >= CI_REQUESTS


@pytest.mark.slow
def test_ten_times_as_many_random_requests_get_documented_answers(app, schema, sender) -> None:
    sent = exercise(schema, app, sender, CI_EXAMPLES * 10, derandomize=False)
    assert sum(sent.values()) >= CI_REQUESTS * 10

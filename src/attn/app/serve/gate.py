"""The door every request passes: body-size limit, shutdown draining, in-flight count, request metrics.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware), so that a streamed answer counts as
in flight until its last byte is sent, and a body is limited while it is read.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attn.app.serve.errors import error_body
from attn.app.serve.prometheus import ServeMetrics

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/translate", "/v1/classify", "/v1/attention",
          "/v1/models", "/health", "/metrics", "/")
_ALWAYS_OPEN = ("/health", "/metrics")  # answered while draining, so that a balancer can see it


@dataclasses.dataclass
class Traffic:
    """Whether the server takes new requests, and how many it is answering."""

    draining: bool = False
    in_flight: int = 0


class RequestGate:
    """ASGI middleware: 413 for a body over `max_body_bytes` (from Content-Length when given, else while reading),
    503 once `traffic.draining` is set, and one count and latency per request."""

    def __init__(self, app: ASGIApp, traffic: Traffic, metrics: ServeMetrics, max_body_bytes: int) -> None:
        self.app = app
        self.traffic = traffic
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in ROUTES else "other"
        started, status = time.monotonic(), [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if self.traffic.draining:
                    message = _closing(message)
            await send(message)

        # The gauge leaves out the scrapes and probes, so that a server at rest reads 0 from its own /metrics.
        gauge = None if path in _ALWAYS_OPEN else self.metrics.in_flight.labels(route=route)
        self.traffic.in_flight += 1
        if gauge is not None:
            gauge.inc()
        try:
            await self._answer(scope, receive, sending, path)
        finally:
            self.traffic.in_flight -= 1
            if gauge is not None:
                gauge.dec()
            model = scope.get("state", {}).get("model", "")
            self.metrics.requests.labels(route=route, model=model, status=str(status[0])).inc()
            self.metrics.latency.labels(route=route, model=model).observe(time.monotonic() - started)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        if self.traffic.draining and path not in _ALWAYS_OPEN:
            await send_error(send, 503, "the server is shutting down and takes no new requests; retry on another "
                              "instance or after it restarts")
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await send_error(send, 413, self._too_large(int(length)))
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:  # FastAPI passes an HTTPException on: the error handlers answer it
                raise HTTPException(413, self._too_large(received))
            return message

        await self.app(scope, limited, send)

    def _too_large(self, size: int) -> str:
        return (f"the request body has {size}+ bytes, more than the server's limit of {self.max_body_bytes} "
                "(--max-body-bytes); send fewer or shorter inputs per request")


def _closing(start: Message) -> Message:
    """A response's start with `Connection: close`: while the server drains, no client sends another request on a
    connection that the server closes when it exits (such a request would be lost unanswered)."""
    headers = [(name, value) for name, value in start.get("headers", []) if name.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


async def send_error(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    """Answers with the contract's JSON error, before the app sees the request."""
    body = json.dumps(error_body(status, message)).encode()
    sent: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       *((name.lower().encode(), value.encode()) for name, value in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": sent})
    await send({"type": "http.response.body", "body": body})

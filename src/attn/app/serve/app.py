"""The FastAPI application of `attn serve`, and the server that runs it until SIGTERM.

`listen` takes the address before any model loads, so a port in use is said at once. On SIGTERM (or Ctrl-C) the
server answers new requests with 503 (/health says "draining"), finishes the ones in flight, stops listening,
answers what its open connections still send, and returns; a second signal stops it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Sequence

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from attn import __version__
from attn.app.serve.access import AccessGate, needs_key
from attn.app.serve.engine import Engine
from attn.app.serve.errors import install_error_handlers
from attn.app.serve.gate import RequestGate, Traffic
from attn.app.serve.prometheus import ServeMetrics
from attn.app.serve.options import ServeOptions
from attn.app.serve.served_models import ServedModel
from attn.app.serve.routes import ServeState, router
from attn.data.grammar_tokens import grammar_matchers
from attn.decoding import PrefixCache, RunningBatch
from attn.core.errors import ConfigError
from attn.models import Decoder

# How long connections accepted before the server stopped listening may still send a request (on loopback or a
# LAN, a request sent before the listening socket closed arrives well within it).
LAST_REQUESTS_S = 0.5


def create_app(models: Sequence[ServedModel], options: ServeOptions = ServeOptions()) -> FastAPI:
    """The application serving `models` by name.

    Example:
        >>> from fastapi.testclient import TestClient
        >>> from attn.app.serve import ServedModel, create_app
        >>> from attn.artifacts import load_model
        >>> app = create_app([ServedModel("minilm", load_model("all-MiniLM-L6-v2", "cpu"))])
        >>> with TestClient(app) as client:
        ...     vector = client.post("/v1/embeddings", json={"input": "Hello"}).json()["data"][0]["embedding"]
        >>> len(vector)
        384
    """
    metrics = ServeMetrics()
    engines = {served.name: _engine(served, options, metrics) for served in models}
    state = ServeState({served.name: served for served in models}, engines, metrics, Traffic(), options)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for engine in engines.values():
            await engine.drain()

    app = FastAPI(title="attn serve", version=__version__, lifespan=lifespan,
                  description="Transformer models of `attn` over HTTP: completions, translation, embeddings, "
                  "classification and attention maps. Every error is `{\"error\": {message, type, param, code}}`. "
                  "When the server has API keys, /v1/* and /metrics need `Authorization: Bearer KEY`.")
    app.state.serve = state
    install_error_handlers(app)
    app.include_router(router)
    _describe_keys(app, bool(options.api_keys))
    # The last one added sees a request first: CORS (a browser's preflight carries no key), then the gate (413,
    # 503 and the metrics, 401s counted too), then the keys.
    app.add_middleware(AccessGate, keys=options.api_keys, max_concurrent_per_key=options.max_concurrent_per_key)
    app.add_middleware(RequestGate, traffic=state.traffic, metrics=metrics, max_body_bytes=options.max_body_bytes)
    if options.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=["Retry-After"])
    return app


def _describe_keys(app: FastAPI, keyed: bool) -> None:
    """With keys, the OpenAPI schema says that every guarded route needs the bearer key (as /docs shows it)."""
    if not keyed:
        return
    make = app.openapi

    def openapi() -> dict:
        schema = make()  # built once and kept by FastAPI: the lines below only set what they set before
        schema.setdefault("components", {})["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        for path, operations in schema["paths"].items():
            for operation in operations.values() if needs_key(path) else ():
                operation["security"] = [{"apiKey": []}]
        return schema

    app.openapi = openapi


def _engine(served: ServedModel, options: ServeOptions, metrics: ServeMetrics) -> Engine:
    bundle = served.bundle
    running = None
    if isinstance(bundle.model, Decoder):
        prefixes = PrefixCache(options.prefix_cache_bytes) if options.prefix_cache_bytes else None
        running = RunningBatch(bundle.model, bundle.eos_id, bundle.tokenizer.decode,
                               grammar_matchers(bundle.tokenizer), prefix_cache=prefixes)
    return Engine(served.name, running, options.batching, options.max_queue, options.max_batch_tokens, metrics,
                  bundle.model)


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM or SIGINT drains (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, traffic: Traffic) -> None:
        super().__init__(config)
        self.traffic = traffic

    def handle_exit(self, sig: int, frame: object) -> None:
        if self.traffic.draining:
            super().handle_exit(sig, frame)
        self.traffic.draining = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then the address it serves (uvicorn names none for a socket it was given)."""
        await super().startup(sockets)
        if sockets and not self.should_exit:
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            logging.getLogger("uvicorn.error").info(
                "attn serve: http://%s:%d (the page at /, the API at /docs; Ctrl-C or SIGTERM stops)", shown, port)

    async def on_tick(self, counter: int) -> bool:
        if self.traffic.draining and self.traffic.in_flight == 0:
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, once the listening sockets are closed and the connections accepted before have had
        `LAST_REQUESTS_S` to send their requests: uvicorn closes an idle connection at once, dropping a request
        on its way."""
        for server in self.servers:
            server.close()
        for bound in sockets or []:
            bound.close()
        if not self.force_exit:
            await asyncio.sleep(LAST_REQUESTS_S)
        await super().shutdown(sockets)


def listen(options: ServeOptions) -> socket.socket:
    """A socket bound to `options.host`:`options.port`, for `run_server`.

    Raises:
        ConfigError: the port is taken or needs privileges (--port), or the host is not of this machine (--host).
    """
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections of a socket that names it, and
    # without it Nagle's algorithm held every small answer back until the client's delayed ACK came.
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    bound = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port left in TIME_WAIT is free
    try:
        bound.bind((options.host, options.port))
    except OSError as error:
        bound.close()
        where = f"{options.host}:{options.port}"
        if error.errno == errno.EADDRINUSE:
            raise ConfigError("--port", f"{where} is already in use (another server?); choose a free port with "
                              "--port, or stop the program that holds it") from None
        if error.errno == errno.EACCES:
            raise ConfigError("--port", f"cannot listen on {where}: permission denied (ports below 1024 need "
                              "privileges); choose a port of 1024 or above") from None
        raise ConfigError("--host", f"cannot listen on {where}: {error.strerror or error}; give an address of "
                          "this machine, such as 127.0.0.1") from None
    return bound


def run_server(models: Sequence[ServedModel], options: ServeOptions, bound: socket.socket) -> None:
    """Serves `models` on the socket `listen` bound until SIGTERM or Ctrl-C, then drains and returns."""
    if options.exposed_without_key:
        logging.getLogger("uvicorn.error").warning(
            "attn serve: WARNING: %s is reachable from other machines and no API key is set (--insecure-no-key): "
            "anyone who reaches it may use the models; give --api-key-file FILE", options.host)
    app = create_app(models, options)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="info", access_log=False)
    with bound:
        DrainingServer(config, app.state.serve.traffic).run(sockets=[bound])

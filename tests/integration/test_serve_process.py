"""A real `attn serve` process on 127.0.0.1: it answers, and on SIGTERM it drains (new requests get
503, /health says "draining"), finishes every request it accepted, and exits with status 0."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from serve_models import TEXTS, tiny_bundles

from attn.inference.classification import embed
from attn.app.serve import ServeOptions, listen
from attn.app.serve import app as serve_app
from attn.artifacts import save_model
from attn.core.errors import ConfigError

READY_S = 120  # the machine may be busy: starting Python and torch can take a while


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_ready(base: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "attn serve exited before it was ready"
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.3)
    raise AssertionError(f"attn serve was not ready within {READY_S} s")


def slow_body(body: dict, sent: threading.Event, finish: threading.Event) -> Iterator[bytes]:
    """The JSON of `body` in two pieces; the second waits for `finish`, so the request stays in flight."""
    data = json.dumps(body).encode()
    yield data[:5]
    sent.set()
    finish.wait(60)
    yield data[5:]


def test_sigterm_drains_then_exits_zero(tmp_path: Path) -> None:
    bundles = tiny_bundles()
    encoder = save_model(bundles["encoder"], tmp_path / "encoder")
    lm = save_model(bundles["lm"], tmp_path / "lm")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "attn.app.cli", "serve", "--model", f"encoder={encoder}", "--model", f"lm={lm}",
         "--port", str(port), "--device", "cpu"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_until_ready(base, server)
        finish = threading.Event()
        requests = [("/v1/embeddings", {"model": "encoder", "input": [text]}) for text in TEXTS[:3]]
        requests.append(("/v1/completions", {"model": "lm", "prompt": "In the", "max_tokens": 20, "temperature": 0,
                                             "stream": True}))
        answers: dict[int, httpx.Response] = {}
        sent = [threading.Event() for _ in requests]

        def send(index: int) -> None:
            route, body = requests[index]
            answers[index] = httpx.post(base + route, content=slow_body(body, sent[index], finish), timeout=120,
                                        headers={"content-type": "application/json"})

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
        for thread in threads:
            thread.start()
        assert all(event.wait(30) for event in sent)
        time.sleep(1.0)  # the server has read the headers: the requests are in flight
        server.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{base}/health", timeout=5)).status_code != 503:
            assert time.monotonic() < deadline, "the server did not start draining"
            time.sleep(0.1)
        assert health.json() == {"status": "draining", "models": ["encoder", "lm"]}
        refused = httpx.post(f"{base}/v1/embeddings", json={"model": "encoder", "input": "late"}, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
        assert server.poll() is None  # still draining: the accepted requests hold it
        finish.set()
        for thread in threads:
            thread.join(120)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
    for index, text in enumerate(TEXTS[:3]):
        assert answers[index].status_code == 200, answers[index].text
        vector = torch.tensor(answers[index].json()["data"][0]["embedding"])
        torch.testing.assert_close(vector, embed(bundles["encoder"], [text])[0], atol=1e-5, rtol=1e-5)
    stream = answers[len(requests) - 1]
    assert stream.status_code == 200
    events = [line.removeprefix("data: ") for line in stream.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_a_port_in_use_is_one_line_before_any_model_loads(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "attn.app.cli", "serve", "--model", str(tmp_path / "no-model"),
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"attn: error: --port: 127.0.0.1:{port} is already in use (another server?); choose a "
                           "free port with --port, or stop the program that holds it\n")


def test_port_zero_serves_on_a_free_port_that_the_log_names(tmp_path: Path) -> None:
    lm = save_model(tiny_bundles()["lm"], tmp_path / "lm")
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "attn.app.cli", "serve", "--model", str(lm), "--port", "0",
                                   "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"attn serve: http://127\.0\.0\.1:(\d+) ", log_path.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        port = int(found.group(1))
        assert port != 0 and httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["models"] == ["lm"]
    finally:
        server.terminate()
        server.wait(30)


@contextlib.contextmanager
def serving_on_every_interface(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`attn serve --host 0.0.0.0 --port 0 FLAGS` of a tiny LM, running while the block runs; yields its address on
    127.0.0.1 once its log names it (the log: tmp_path / "serve.log")."""
    lm = save_model(tiny_bundles()["lm"], tmp_path / "lm")
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "attn.app.cli", "serve", "--model", str(lm), "--host",
                                   "0.0.0.0", "--port", "0", "--device", "cpu", *flags], stdout=log,
                                  stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        deadline = time.monotonic() + READY_S
        while not (found := re.search(r"attn serve: http://0\.0\.0\.0:(\d+) ", log_path.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        server.terminate()
        server.wait(30)


def test_every_interface_without_a_key_serves_with_the_flag_and_a_warning(tmp_path: Path) -> None:
    with serving_on_every_interface(tmp_path, "--insecure-no-key") as base:
        assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 200
    log = (tmp_path / "serve.log").read_text()
    assert "WARNING: 0.0.0.0 is reachable from other machines and no API key is set (--insecure-no-key)" in log
    assert "Traceback" not in log


def test_every_interface_with_a_key_from_the_environment_needs_it(tmp_path: Path) -> None:
    key = "a-key-from-the-environment"
    with serving_on_every_interface(tmp_path, env={"ATTN_API_KEY": key}) as base:
        refused = httpx.get(f"{base}/v1/models", timeout=10)
        answered = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        health = httpx.get(f"{base}/health", timeout=10)
    assert refused.status_code == 401 and answered.status_code == 200 and health.status_code == 200
    log = (tmp_path / "serve.log").read_text()
    assert "WARNING" not in log and key not in log


def test_connections_to_the_bound_socket_send_without_delay() -> None:
    """Small answers go out at once (TCP_NODELAY): with Nagle's algorithm a response written in two parts
    waited for the client's delayed ACK, 40 ms a request."""
    found: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            found.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        bound = listen(ServeOptions(port=0))
        server = await asyncio.get_running_loop().create_server(Probe, sock=bound)
        port = bound.getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            while not found:
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(asyncio.wait_for(accept_one(), 30))
    assert found == [1]


def test_a_port_that_needs_privileges_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user without root meets port 80 (these tests may run as root, where the bind succeeds)."""

    class Refusing(socket.socket):
        def bind(self, address: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(serve_app.socket, "socket", Refusing)
    with pytest.raises(ConfigError, match=r"^--port: cannot listen on 127\.0\.0\.1:80: permission denied \(ports "
                                          r"below 1024 need privileges\); choose a port of 1024 or above$"):
        listen(ServeOptions(port=80))


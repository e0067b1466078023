"""What the serving benchmarks share (`benchmarks.serving`, `benchmarks.serving_soak`): the models and the
requests of each route, a running `attn serve`, and one client request with everything a check needs of it.

Routes: translate, embeddings and classify on the quickstart's models, completions (plain and streamed)
on its language model, and chat (plain and streamed) on SmolLM2-135M-Instruct read from its GGUF file.
Every request is greedy (or beam search), so every answer must equal the one request's answer alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from attn.app.runs import load_run_config, train
from attn.artifacts.loading import packaged_model_dir
from attn.data.readers import load_labelled, load_parallel
from attn.data.text import read_text
from attn.shipped import folder

QUICKSTART = Path("runs/quickstart")
MODEL_DIRS = {"translation": "translation", "lm": "shakespeare", "classifier": "classifier"}
CONFIGS = {"translation": "quickstart-translation.toml", "lm": "quickstart-lm.toml",
           "classifier": "quickstart-classification.toml"}
CHAT_MODEL = "SmolLM2-135M-Instruct"  # served from its GGUF file as the model called "chat"
ROUTES = ("translate", "embeddings", "classify", "completions", "stream")
CHAT_ROUTES = ("chat", "chat_stream")
STREAMED = ("stream", "chat_stream")
TRANSLATE = {"beam_size": 4, "max_tokens": 24}
COMPLETE = {"max_tokens": 32, "temperature": 0}
CHAT = {"max_tokens": 24, "temperature": 0}
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "How many legs has a spider?",
             "Why is the sky blue?", "Write one sentence about the sea.", "What is two plus three?",
             "Give me a word that rhymes with cat.", "Who wrote Romeo and Juliet?"]


# -- models and inputs ----------------------------------------------------------------------------


def models_to_serve(given: dict[str, Path], chat: bool) -> dict[str, Path]:
    """`given` (by name), the quickstart's models it lacks (runs/quickstart when it holds them, else stand-ins of
    the same shapes trained for 3 steps: only speed matters there), and with `chat` SmolLM2's GGUF file."""
    quickstart = {name: QUICKSTART / folder_name for name, folder_name in MODEL_DIRS.items()}
    missing = [name for name in MODEL_DIRS if name not in given]
    if not all(quickstart[name].exists() for name in missing):
        quickstart = stand_in_models(Path(tempfile.gettempdir()) / "attn-serving-bench")
    found = {**{name: quickstart[name] for name in missing}, **given}
    if chat and "chat" not in found:
        found["chat"] = packaged_model_dir(CHAT_MODEL)
    return found


def stand_in_models(root: Path) -> dict[str, Path]:
    """The quickstart's three models, trained for 3 steps at the recipes' shapes (only speed matters here)."""
    found = {}
    for name, config_name in CONFIGS.items():
        run_dir = root / MODEL_DIRS[name]
        if not (run_dir / "checkpoints").exists():
            overrides = [f"run_dir={json.dumps(str(run_dir))}", "train.max_steps=3", "train.max_minutes=0",
                         "optim.warmup_steps=1", "train.quiet=true"]
            if name == "classifier":
                overrides.append("train.eval_interval=0")
            train(load_run_config(folder("configs") / config_name, overrides))
        found[name] = run_dir
    return found


def inputs(count: int) -> dict[str, list[str]]:
    """`count` texts per route from the shipped test sets (and questions for the chat model), in a fixed order."""
    data = folder("data")
    sources = load_parallel(str(data / "bible-en-es/test.tsv")).sources
    fortunes = [text[:300] for text in load_labelled(str(data / "fortunes-topics/test.tsv")).texts]
    plays = read_text(str(data / "shakespeare/test.txt"))
    prompts = [plays[i * 997 : i * 997 + 48] for i in range(count)]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(count)]
    return {"translate": sources[:count], "embeddings": fortunes[:count], "classify": fortunes[:count],
            "completions": prompts, "stream": prompts, "chat": questions, "chat_stream": questions}


def request(route: str, text: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request on `text`."""
    chat = {"model": "chat", "messages": [{"role": "user", "content": text}], **CHAT}
    return {
        "translate": ("/v1/translate", {"model": "translation", "input": text, **TRANSLATE}),
        "embeddings": ("/v1/embeddings", {"model": "classifier", "input": text}),
        "classify": ("/v1/classify", {"model": "classifier", "input": text}),
        "completions": ("/v1/completions", {"model": "lm", "prompt": text, **COMPLETE}),
        "stream": ("/v1/completions", {"model": "lm", "prompt": text, "stream": True, **COMPLETE}),
        "chat": ("/v1/chat/completions", chat),
        "chat_stream": ("/v1/chat/completions", {**chat, "stream": True}),
    }[route]


def answers_of(route: str, body: dict[str, Any]) -> list[Any]:
    """What must not change with batching, one per answer the body holds (a request asks for one): a translation's
    text, an embedding, a label, a completion's or a chat answer's text."""
    if route == "translate":
        return [t["text"] for t in body["translations"]]
    if route == "embeddings":
        return [d["embedding"] for d in body["data"]]
    if route == "classify":
        return [r["label"] for r in body["results"]]
    if route == "chat":
        return [c["message"]["content"] for c in body["choices"]]
    return [c["text"] for c in body["choices"]]


def delta_of(event: dict[str, Any]) -> str:
    """The text one streamed chunk adds (a completion's `text`, a chat chunk's `delta.content`)."""
    choice = event["choices"][0]
    return choice["text"] if "text" in choice else choice["delta"].get("content") or ""


def same(route: str, a: Any, b: Any) -> bool:
    if route == "embeddings":
        return max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    return a == b


# -- the server -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Served:
    """A running `attn serve`: its base URL, its process and the file its log goes to."""

    url: str
    process: subprocess.Popen
    log: Path

    def tracebacks(self) -> int:
        """How many tracebacks the server's log holds (every internal error logs one)."""
        return self.log.read_text(errors="replace").count("Traceback (most recent call last)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(models: dict[str, Path], batching: bool, extra: list[str]) -> Iterator[Served]:
    """A running `attn serve` on a free loopback port, with this process' torch threads; stopped (SIGTERM, then
    killed after a minute) on exit unless it stopped already."""
    port = free_port()
    command = [sys.executable, "-m", "attn.app.cli", "serve", "--port", str(port), "--device", "cpu",
               "--max-queue", "256", "--batching" if batching else "--no-batching", *extra]
    for name, path in models.items():
        command += ["--model", f"{name}={path}"]
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "serve.log"
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start: {log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.5)
            yield Served(url, process, log)
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def resident_mb(pid: int) -> float:
    """The process' resident memory (VmRSS), MB; NaN once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return float("nan")
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), float("nan"))


async def gauges(client: httpx.AsyncClient, names: tuple[str, ...]) -> dict[str, float]:
    """The sum over its labels of each of the server's Prometheus gauges `names` (GET /metrics)."""
    text = (await client.get("/metrics")).text
    found = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in found:
            found[family.name] = sum(sample.value for sample in family.samples)
    return found


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


# -- one request ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Answered:
    """What one request got.

    Attributes:
        status: the HTTP status, or the error code of an error event that ended a stream.
        latency: seconds from sending to the end of the answer (or to leaving it).
        answer: what `answers_of` reads of it (a stream's text so far), None without a 200.
        first: seconds to a stream's first chunk.
        ids: the answer's id (every chunk's, for a stream): no two requests may share one.
        complete: the whole answer came: a body, or a stream that ended with one [DONE].
        duplicated: more than one answer came: several answers in a body, a second [DONE], a chunk after
            [DONE], a choice finished twice.
        left: the client closed the connection before the stream's end (on purpose).
        valid: the answer is what its request asked for (a structured answer's schema, a forced tool call).
    """

    status: int
    latency: float
    answer: Any = None
    first: float | None = None
    ids: set[str] = dataclasses.field(default_factory=set)
    complete: bool = True
    duplicated: bool = False
    left: bool = False
    valid: bool = True


async def one(client: httpx.AsyncClient, route: str, text: str, leave_after: int | None = None) -> Answered:
    """Sends one request and reads its answer; a stream is left after `leave_after` chunks when given.

    Raises:
        httpx.HTTPError: the connection failed (refused, or closed before the answer's end).
    """
    path, body = request(route, text)
    started = time.perf_counter()
    if route not in STREAMED:
        response = await client.post(path, json=body)
        found = Answered(response.status_code, time.perf_counter() - started)
        if response.status_code == 200:
            payload = response.json()
            answers = answers_of(route, payload)
            found.answer, found.duplicated = answers[0], len(answers) != 1
            found.ids = {payload["id"]} if "id" in payload else set()
        return found
    async with client.stream("POST", path, json=body) as response:
        found = Answered(response.status_code, 0.0, complete=False)
        if response.status_code != 200:
            await response.aread()
            found.complete = True
        else:
            await read_stream(response, found, started, leave_after)
    found.latency = time.perf_counter() - started
    return found


async def read_stream(response: httpx.Response, found: Answered, started: float, leave_after: int | None) -> None:
    """Reads a stream's events into `found`: its text, ids, first chunk's time, whether it ended once."""
    pieces, finished, done = [], 0, 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done += 1
            continue
        event = json.loads(line[6:])
        if "error" in event:
            found.status = event["error"]["code"]
            break
        found.first = found.first or time.perf_counter() - started
        found.duplicated |= done > 0
        found.ids.add(event["id"])
        pieces.append(delta_of(event))
        finished += event["choices"][0]["finish_reason"] is not None
        if leave_after is not None and len(pieces) >= leave_after:
            found.left = True
            break
    found.answer = "".join(pieces) if found.status == 200 else None
    found.complete = done == 1 and finished == 1
    found.duplicated |= done > 1 or finished > 1 or len(found.ids) > 1


def quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]

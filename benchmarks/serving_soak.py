"""The mixed soak of `attn serve`: many clients on every route for minutes, every answer checked, then SIGTERM
under load.

Clients (32 by default) each send one request after another, going round the routes: chat on SmolLM2
(whole, and streamed as server-sent events), completions on the quickstart's language model (whole and
streamed), translation, embeddings and classification, and on the chat model the exchanges of
`benchmarks.serving_mix` (structured output whole and streamed, forced tool calls, a tool round trip, a
multi-turn chat that the prefix cache serves). One streamed request in `LEAVE_EVERY` is left after
`LEAVE_AFTER` chunks: the client closes its connection halfway through the answer.

Checks (each a line of `checks`, all must hold):
- every answer that came equals the same request's answer alone, computed before the load (greedy decoding,
  beam search); a stream that was left must have sent the start of it. Not one lost (a connection failed, a
  stream without its end), duplicated (two answers in one, or an id two requests share), different, invalid (a
  structured answer outside its schema, a tool call that is not one valid call), 5xx or 4xx.
- the server's resident memory stays flat: the median of the last `window` seconds' samples within 10 % of the
  median of the first window after the warm-up.
- every request left frees its place: once the clients stop, /metrics reads attn_queue_length and
  attn_requests_in_flight 0.
- SIGTERM while the load runs again: every request sent before the signal that the server accepted (it did not
  answer 503) gets its whole, right answer; later ones get 503 or find the port closed; the server exits 0
  within `drain_limit_s`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serving_load import (
    STREAMED,
    Answered,
    Served,
    gauges,
    inputs,
    one,
    quantile,
    resident_mb,
    same,
    server,
)
from benchmarks.serving_mix import MIX_ROUTES, exchange

LEAVE_EVERY = 5  # one streamed request in 5 is left halfway
LEAVE_AFTER = 3  # chunks read before leaving
INPUTS = 8  # different inputs per route
GAUGES = ("attn_queue_length", "attn_requests_in_flight")
MEMORY_GROWTH_LIMIT = 0.10
SAMPLE_EVERY_S = 2.0
TIMEOUT_S = 300  # a request without its answer this long is lost
DIFFERENCES_KEPT = 20
OUTCOMES = ("left", "lost", "duplicated", "different", "invalid", "5xx", "4xx", "refused")


@dataclasses.dataclass(frozen=True)
class SoakSettings:
    """How the soak runs.

    Attributes:
        routes: the routes the clients go round.
        clients: clients sending at once.
        minutes: how long the checked load runs.
        sigterm_after_s: how long the load runs again before SIGTERM.
        drain_limit_s: how long the server may take to exit after SIGTERM.
    """

    routes: tuple[str, ...]
    clients: int
    minutes: float
    sigterm_after_s: float = 10.0
    drain_limit_s: float = 120.0

    @property
    def warmup_s(self) -> float:
        """The start of the load left out of the memory comparison (allocator and caches filling)."""
        return min(30.0, 15 * self.minutes)

    @property
    def window_s(self) -> float:
        """The span of memory samples compared at either end: a minute, or half of what follows the warm-up."""
        return min(60.0, (60 * self.minutes - self.warmup_s) / 2)


class Tally:
    """The checked outcome of every request, by route."""

    def __init__(self, routes: tuple[str, ...], expected: dict[tuple[str, int], Any]) -> None:
        self.expected = expected
        self.counts = {route: collections.Counter() for route in routes}
        self.latencies: dict[str, list[float]] = {route: [] for route in routes}
        self.firsts: dict[str, list[float]] = {route: [] for route in routes}
        self.ids: set[str] = set()
        self.differences: list[dict[str, Any]] = []  # the first `DIFFERENCES_KEPT` answers unlike their answer alone

    def outcome(self, route: str, i: int, found: Answered) -> str:
        """Counts one request's answer; returns what it was: answered, left, refused (503), different, duplicated,
        invalid, lost (no whole answer), 5xx or 4xx."""
        counts = self.counts[route]
        counts["requests"] += 1
        expected = self.expected[route, i]
        shared = found.ids & self.ids
        self.ids |= found.ids
        if found.left:
            kind = "left" if found.status == 200 and expected.startswith(found.answer) else "different"
        elif found.status == 503:
            kind = "refused"
        elif found.status >= 500:
            kind = "5xx"
        elif found.status != 200:
            kind = "4xx"
        elif not found.complete:
            kind = "lost"
        elif found.duplicated or shared:
            kind = "duplicated"
        elif not found.valid:
            kind = "invalid"
        else:
            kind = "answered" if same(route, found.answer, expected) else "different"
        counts[kind] += 1
        if kind == "different" and len(self.differences) < DIFFERENCES_KEPT:
            self.differences.append({"route": route, "input": i, "alone": expected, "found": found.answer})
        if kind == "answered":
            self.latencies[route].append(found.latency)
            if found.first is not None:
                self.firsts[route].append(found.first)
        return kind

    def lost(self, route: str) -> None:
        """Counts a request whose connection failed before its answer came."""
        self.counts[route]["requests"] += 1
        self.counts[route]["lost"] += 1

    def figures(self) -> dict[str, Any]:
        """Per route: requests, p50/p99 latency of the answered ones (and time to first chunk), every outcome."""
        per_route = {}
        for route, counts in self.counts.items():
            latencies, firsts = sorted(self.latencies[route]), sorted(self.firsts[route])
            per_route[route] = {
                "requests": counts["requests"], "answered": counts["answered"],
                "p50_s": round(quantile(latencies, 0.5), 3) if latencies else None,
                "p99_s": round(quantile(latencies, 0.99), 3) if latencies else None,
                "first_chunk_p50_s": round(quantile(firsts, 0.5), 3) if firsts else None,
                **{kind: counts[kind] for kind in OUTCOMES}}
        totals = {kind: sum(r[kind] for r in per_route.values()) for kind in ("requests", "answered", *OUTCOMES)}
        return {"routes": per_route, "totals": totals, "differences": self.differences}


class Load:
    """`clients` clients going round `routes`, each request checked by `tally`; `stop()` tells when to stop."""

    def __init__(self, url: str, settings: SoakSettings, tally: Tally) -> None:
        self.url = url
        self.settings = settings
        self.tally = tally
        self.texts = inputs(INPUTS)
        self.streams = 0
        self.sent: list[tuple[float, float, str]] = []  # (when sent, when ended, outcome) of every request
        self.errors: list[tuple[float, str]] = []  # (when sent, what failed) of every connection that failed

    async def run(self, stop: Callable[[], bool], gone: asyncio.Event | None = None) -> None:
        """Every client sends until `stop()`; with `gone`, a client also stops once the port is closed, and waits
        a moment after a 503."""
        await asyncio.gather(*[self._client(c, stop, gone) for c in range(self.settings.clients)])

    async def _client(self, c: int, stop: Callable[[], bool], gone: asyncio.Event | None) -> None:
        routes = self.settings.routes
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(base_url=self.url, timeout=TIMEOUT_S, limits=limits) as client:
            n = c
            while not stop() and not (gone is not None and gone.is_set()):
                route, i = routes[n % len(routes)], (n // len(routes)) % INPUTS
                n += self.settings.clients
                leave = None
                if route in STREAMED:
                    self.streams += 1
                    leave = LEAVE_AFTER if self.streams % LEAVE_EVERY == 0 else None
                sent = time.monotonic()
                try:
                    kind = self.tally.outcome(route, i, await ask(client, route, i, self.texts, leave))
                except httpx.HTTPError as error:
                    kind = "closed" if gone is not None and isinstance(error, httpx.ConnectError) else "lost"
                    if kind == "lost":
                        self.tally.lost(route)
                        self.errors.append((sent, f"{route}: {type(error).__name__}: {error}"))
                self.sent.append((sent, time.monotonic(), kind))
                if kind == "closed":  # the port is closed: the server is gone
                    return
                if kind == "refused" and gone is not None:
                    await asyncio.sleep(0.1)


async def ask(client: httpx.AsyncClient, route: str, i: int, texts: dict[str, list[str]],
              leave: int | None = None) -> Answered:
    """Route `route`'s request (or exchange) on input `i`."""
    if route in MIX_ROUTES:
        return await exchange(client, route, i)
    return await one(client, route, texts[route][i], leave)


async def expected_answers(url: str, routes: tuple[str, ...]) -> dict[tuple[str, int], Any]:
    """Each route's answer to each input, one request at a time."""
    texts = inputs(INPUTS)
    found = {}
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
        for route in routes:
            for i in range(INPUTS):
                answered = await ask(client, route, i, texts)
                if answered.status != 200 or not answered.complete or not answered.valid:
                    raise RuntimeError(f"{route} {i} alone: status {answered.status}, complete {answered.complete}, "
                                       f"valid {answered.valid}, answer {answered.answer!r}")
                found[route, i] = answered.answer
    return found


async def settle(url: str, seconds: float = 30.0) -> dict[str, float]:
    """The queue and in-flight gauges once both read 0 (or as they are after `seconds`), and how long that took."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while any((found := await gauges(client, GAUGES)).values()) and time.monotonic() - started < seconds:
            await asyncio.sleep(0.1)
    return {**found, "seconds": round(time.monotonic() - started, 2)}


def memory_figures(samples: list[tuple[float, float]], settings: SoakSettings) -> dict[str, Any]:
    """The medians of the first window after the warm-up and of the last window, the largest sample, the growth."""
    end = samples[-1][0]
    first = [mb for t, mb in samples if settings.warmup_s <= t <= settings.warmup_s + settings.window_s]
    last = [mb for t, mb in samples if t >= end - settings.window_s]
    first_mb, last_mb = statistics.median(first), statistics.median(last)
    return {"first_mb": round(first_mb, 1), "last_mb": round(last_mb, 1),
            "max_mb": round(max(mb for _, mb in samples), 1), "growth": round(last_mb / first_mb - 1, 4),
            "window_s": settings.window_s, "warmup_s": settings.warmup_s}


async def sample_memory(pid: int, samples: list[tuple[float, float]], started: float, stop: Callable[[], bool]) -> None:
    """Appends (seconds since `started`, resident MB of process `pid`) every `SAMPLE_EVERY_S` until `stop()`."""
    while not stop():
        samples.append((round(time.monotonic() - started, 1), resident_mb(pid)))
        await asyncio.sleep(SAMPLE_EVERY_S)


async def sigterm_under_load(served: Served, settings: SoakSettings, tally: Tally) -> dict[str, Any]:
    """Loads the server again, sends SIGTERM after `settings.sigterm_after_s` and waits for it to exit; how every
    request sent before and after the signal ended."""
    load, gone = Load(served.url, settings, tally), asyncio.Event()
    clients = asyncio.ensure_future(load.run(lambda: False, gone))
    await asyncio.sleep(settings.sigterm_after_s)
    served.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        code: int | None = await asyncio.to_thread(served.process.wait, settings.drain_limit_s)
    except subprocess.TimeoutExpired:
        code = None
    drain_s = time.monotonic() - signalled
    gone.set()
    await clients
    before = collections.Counter(kind for sent, _, kind in load.sent if sent < signalled)
    after = collections.Counter(kind for sent, _, kind in load.sent if sent >= signalled)
    accepted = sum(n for kind, n in before.items() if kind not in ("refused", "closed", "left"))
    in_flight = sum(sent < signalled <= ended and kind not in ("refused", "closed", "left")
                    for sent, ended, kind in load.sent)
    return {"accepted_before": accepted, "answered_before": before["answered"], "in_flight_at_sigterm": in_flight,
            "left_before": before["left"],
            "refused_503_before": before["refused"], "refused_503_after": after["refused"],
            "port_closed_after": after["closed"], "answered_after": after["answered"],
            "failed_after": sum(n for kind, n in after.items() if kind not in ("refused", "closed", "answered", "left")),
            "exit_code": code, "drain_s": round(drain_s, 2), "drain_limit_s": settings.drain_limit_s,
            "failed_connections": {"before": dict(collections.Counter(e for sent, e in load.errors if sent < signalled)),
                                   "after": dict(collections.Counter(e for sent, e in load.errors if sent >= signalled))}}


async def soak(models: dict[str, Path], settings: SoakSettings, extra: list[str]) -> dict[str, Any]:
    """The whole soak on a server of its own: its figures and `checks` (what failed is False)."""
    with server(models, True, extra) as served:
        tally = Tally(settings.routes, await expected_answers(served.url, settings.routes))
        samples: list[tuple[float, float]] = []
        started = time.monotonic()
        end = started + 60 * settings.minutes

        def over() -> bool:
            return time.monotonic() >= end

        load = Load(served.url, settings, tally)
        await asyncio.gather(load.run(over), sample_memory(served.process.pid, samples, started, over))
        at_end = await settle(served.url)
        memory = memory_figures(samples, settings)
        load_figures = {**tally.figures(), "failed_connections": dict(collections.Counter(e for _, e in load.errors))}
        shutdown = await sigterm_under_load(served, settings, tally)
        tracebacks = served.tracebacks()
    totals = load_figures["totals"]
    checks = {
        "no_lost_duplicated_different": not (totals["lost"] or totals["duplicated"] or totals["different"]),
        "no_invalid": not totals["invalid"],
        "no_5xx_4xx_503": not (totals["5xx"] or totals["4xx"] or totals["refused"]),
        "memory_flat": abs(memory["growth"]) <= MEMORY_GROWTH_LIMIT,
        "queue_and_in_flight_0_at_end": not (at_end["attn_queue_length"] or at_end["attn_requests_in_flight"]),
        "sigterm_every_accepted_answered": shutdown["accepted_before"] == shutdown["answered_before"]
        and not shutdown["failed_after"],
        "sigterm_exit_0_within_drain_limit": shutdown["exit_code"] == 0,
        "no_traceback_in_server_log": tracebacks == 0,
    }
    return {"settings": dataclasses.asdict(settings), **load_figures, "memory": memory, "memory_samples": samples,
            "at_end": at_end, "sigterm": shutdown, "server_tracebacks": tracebacks, "checks": checks,
            "passed": all(checks.values())}


def soak_markdown(result: dict[str, Any]) -> list[str]:
    """The soak's figures as Markdown lines."""
    lines = [("| route | requests | answered | p50 s | p99 s | first chunk p50 s | left | lost | duplicated | different "
             "| invalid | 5xx | 4xx | 503 |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for route, r in [*result["routes"].items(), ("all", result["totals"])]:
        lines.append(f"| {route} | {r['requests']} | {r['answered']} | {r.get('p50_s') or '-'} | {r.get('p99_s') or '-'} "
                     f"| {r.get('first_chunk_p50_s') or '-'} | {r['left']} | {r['lost']} | {r['duplicated']} | "
                     f"{r['different']} | {r['invalid']} | {r['5xx']} | {r['4xx']} | {r['refused']} |")
    memory, at_end, shutdown = result["memory"], result["at_end"], result["sigterm"]
    lines += ["", (f"resident memory: first {memory['first_mb']} MB, last {memory['last_mb']} MB (medians of "
              f"{memory['window_s']} s after a {memory['warmup_s']} s warm-up, and at the end), max {memory['max_mb']} "
              f"MB, growth {memory['growth']:+.2%}"),
              (f"at the end: attn_queue_length {at_end['attn_queue_length']:g}, attn_requests_in_flight "
              f"{at_end['attn_requests_in_flight']:g} ({at_end['seconds']} s after the clients stopped)"),
              (f"SIGTERM under load: {shutdown['accepted_before']} accepted before it ({shutdown['in_flight_at_sigterm']} "
              f"of them in flight at the signal), {shutdown['answered_before']} answered whole; {shutdown['left_before']} left by their clients; 503: {shutdown['refused_503_before']} "
              f"sent before, {shutdown['refused_503_after']} after; port closed: {shutdown['port_closed_after']}; "
              f"answered after: {shutdown['answered_after']}; failed after: {shutdown['failed_after']}; exit code "
              f"{shutdown['exit_code']} after {shutdown['drain_s']} s (limit {shutdown['drain_limit_s']} s)"),
              f"tracebacks in the server's log: {result['server_tracebacks']}", "",
              *(f"different: {d['route']} input {d['input']}: alone `{d['alone']!r}`, found `{d['found']!r}`"
                for d in result["differences"]), "",
              "checks: " + ", ".join(f"{name} {'ok' if ok else 'FAILED'}" for name, ok in result["checks"].items()),
              f"**{'passed' if result['passed'] else 'FAILED'}**", ""]
    return lines

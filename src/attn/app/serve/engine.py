"""The engine behind `attn serve`: one worker thread per model, running the requests that wait together.

Routes hand the engine jobs; the model runs on the engine's own thread (torch releases the GIL), never
on the event loop. Two kinds of job:

- A `BatchJob` (translate, classify, embed, attention) runs with the other waiting jobs of the same `group`:
  the oldest waiting job, then others of its group, shortest first, while the batch's padded size (rows x
  longest row) stays within `max_batch_tokens`. A batch that fails is run again job by job, so a bad request
  fails alone.
- A `RowsJob` (completions) decodes its rows in the model's `RunningBatch` (continuous batching): between two
  decode steps, waiting rows join within `max_batch_tokens` and finished rows leave. Each new token goes to the
  job's stream at once.

At most `max_queue` jobs wait or run; one more raises `QueueFull` with a retry time (the recent mean job
latency). A caller that stops waiting cancels its job: a waiting job is dropped at once, a decoding one leaves
the batch at the next step, and a running batch finishes with the job's result dropped. Times to first token
are the routes' to measure: they start the clock when the request arrives.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import Any, Protocol

from torch import nn

from attn.decoding import GenerationConfig, RowToken, RunningBatch
from attn.core.errors import AttnError
from attn.core.linear import inference

_END = object()  # closes a stream
_LATENCY_MEMORY = 0.9  # weight of the past in the mean job latency behind Retry-After


class QueueFull(Exception):
    """The model's queue holds `max_queue` jobs already; `retry_after_s` says when a retry may find room."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"queue full; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class Closed(AttnError):
    """The engine is draining or drained and takes no new job."""


class EngineMetrics(Protocol):
    """The Prometheus instruments the engine updates (the server's `ServeMetrics` has them)."""

    queue_length: Any  # Gauge{model}
    batch_size: Any  # Histogram{model, route}


@dataclasses.dataclass(eq=False)
class BatchJob:
    """Work that runs in one call with the other waiting jobs of its group.

    Attributes:
        route: the route it serves (a metrics label).
        group: jobs of equal groups may run together (e.g. the route and its decoding settings).
        sizes: the token count of each of its input rows (what the batch budget counts).
        run: computes the results of several jobs of one group in one call, one result per job, in order.
    """

    route: str
    group: Hashable
    sizes: Sequence[int]
    run: Callable[[list[BatchJob]], list[Any]]


@dataclasses.dataclass(eq=False)
class RowsJob:
    """Rows for the running batch of a decoder-only model: a completion's prompts and their settings.

    Attributes:
        configs: each row's decoding settings, each with its `max_new_tokens` set.
        chunk: turns row i's new token into what the stream yields; called on the model's thread, in token order
            per row.
    """

    route: str
    prompts: Sequence[Sequence[int]]
    configs: Sequence[GenerationConfig]
    chunk: Callable[[int, RowToken], Any]

    @property
    def size(self) -> int:
        """Cache columns the rows may need: every prompt and every new token."""
        return sum(len(p) + (c.max_new_tokens or 0) for p, c in zip(self.prompts, self.configs, strict=True))


@dataclasses.dataclass(eq=False)
class _Job:
    """A submitted piece of work and the way back to the event loop that waits for it."""

    work: BatchJob | RowsJob
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue  # a BatchJob's one result (or exception); a RowsJob's chunks, an exception, then _END
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    cancelled: bool = False
    rows_left: int = 0

    def send(self, item: Any) -> None:
        """Puts `item` on the job's queue from the worker thread (dropped once the job is cancelled)."""
        if not self.cancelled:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Engine:
    """Runs one model's jobs on its own thread, together when `batching`, one at a time otherwise.

    Args:
        running: the model's `RunningBatch` (decoder-only models), None for models without `RowsJob` jobs.
        batching: run waiting jobs together (False: one job at a time, the comparison baseline).
        max_batch_tokens: the budget of one batch: padded input tokens of a `BatchJob` group, prompt plus
            new-token room of the rows in the running batch. A job larger than the budget runs alone.
        model: the model the jobs run, whose linear weights stay packed while the engine runs (served weights
            never change).
    """

    def __init__(self, name: str, running: RunningBatch | None, batching: bool, max_queue: int,
                 max_batch_tokens: int, metrics: EngineMetrics | None = None, model: nn.Module | None = None) -> None:
        self.name = name
        self.model = model
        self.running = running
        self.batching = batching
        self.max_queue = max_queue
        self.max_batch_tokens = max_batch_tokens
        self.metrics = metrics
        self._lock = threading.Condition()
        self._waiting: collections.deque[_Job] = collections.deque()
        self._decoding: dict[_Job, None] = {}  # RowsJobs in the running batch, in arrival order
        self._admitted = 0
        self._closing = False
        self._mean_latency = 1.0
        self._thread = threading.Thread(target=self._serve, name=f"attn-engine-{name}", daemon=True)
        self._thread.start()

    async def submit(self, work: BatchJob) -> Any:
        """Runs a `BatchJob` job and returns its result (or raises its error).

        Raises:
            QueueFull: `max_queue` jobs wait or run already.
            Closed: the engine is draining.
        """
        job = self._admit(work)
        try:
            result = await job.out.get()
        except asyncio.CancelledError:
            self._withdraw(job)
            raise
        if isinstance(result, BaseException):
            raise result
        return result

    def submit_stream(self, work: RowsJob) -> AsyncIterator[Any]:
        """The chunks of a `RowsJob` job as its tokens are chosen, every row's in token order.

        Raises (at once, before anything is iterated):
            QueueFull: `max_queue` jobs wait or run already.
            Closed: the engine is draining.
        """
        return self._chunks(self._admit(work))

    async def drain(self) -> None:
        """Takes no new job, and returns once every admitted job is done and the worker thread stopped."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        await asyncio.to_thread(self._thread.join)

    async def _chunks(self, job: _Job) -> AsyncIterator[Any]:
        try:
            while (item := await job.out.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._withdraw(job)  # a no-op after the end; else the rows leave the batch at the next step

    def _admit(self, work: BatchJob | RowsJob) -> _Job:
        if isinstance(work, RowsJob) and self.running is None:
            raise TypeError(f"model {self.name!r} has no running batch: only decoder-only models decode rows")
        with self._lock:
            if self._closing:
                raise Closed(f"model {self.name!r} is shutting down and takes no new requests")
            if self._admitted >= self.max_queue:
                raise QueueFull(retry_after_s=self._mean_latency)
            job = _Job(work, asyncio.get_running_loop(), asyncio.Queue())
            self._waiting.append(job)
            self._admitted += 1
            self._lock.notify()
        self._count()
        return job

    def _withdraw(self, job: _Job) -> None:
        """Cancels a job whose caller stopped waiting (see the module docstring)."""
        with self._lock:
            job.cancelled = True
            if job in self._waiting:
                self._waiting.remove(job)
                self._admitted -= 1
        self._count()

    def _done(self, job: _Job, item: Any) -> None:
        """Sends the job's last item and frees its place in the queue."""
        job.send(item)
        with self._lock:
            self._admitted -= 1
            latency = time.monotonic() - job.submitted
            self._mean_latency = _LATENCY_MEMORY * self._mean_latency + (1 - _LATENCY_MEMORY) * latency
        self._count()

    def _count(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_length.labels(model=self.name).set(self._admitted)

    def _observe_batch(self, route: str, size: int) -> None:
        if self.metrics is not None:
            self.metrics.batch_size.labels(model=self.name, route=route).observe(size)

    # -- the worker thread ------------------------------------------------------------------------

    def _serve(self) -> None:
        with inference(self.model):
            self._loop()

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._waiting or self._decoding or self._closing)
                if self._closing and not self._waiting and not self._decoding:
                    return
                batch = self._take_batch()
                joining = self._take_rows()
            if batch:
                self._run_batch(batch)
            if joining or self._decoding:
                self._step(joining)

    def _take_batch(self) -> list[_Job]:
        """The oldest waiting `BatchJob` job and, when batching, others of its group within the budget."""
        first = next((t for t in self._waiting if isinstance(t.work, BatchJob)), None)
        if first is None:
            return []
        chosen, rows, longest = [first], len(first.work.sizes), max(first.work.sizes, default=0)
        if self.batching:
            same = [t for t in self._waiting if t is not first and isinstance(t.work, BatchJob)
                    and t.work.group == first.work.group]
            for job in sorted(same, key=lambda t: max(t.work.sizes, default=0)):
                more, longer = rows + len(job.work.sizes), max([longest, *job.work.sizes])
                if more * longer > self.max_batch_tokens:
                    break
                chosen.append(job)
                rows, longest = more, longer
        for job in chosen:
            self._waiting.remove(job)
        return chosen

    def _take_rows(self) -> list[_Job]:
        """The waiting `RowsJob` jobs that join the running batch now, in arrival order, within the budget."""
        if self.running is None or (not self.batching and self._decoding):
            return []
        used = sum(t.work.size for t in self._decoding)
        joining = []
        for job in [t for t in self._waiting if isinstance(t.work, RowsJob)]:
            if (self._decoding or joining) and (not self.batching or used + job.work.size > self.max_batch_tokens):
                break
            joining.append(job)
            used += job.work.size
            self._waiting.remove(job)
        return joining

    def _run_batch(self, jobs: list[_Job]) -> None:
        work = jobs[0].work
        self._observe_batch(work.route, len(jobs))
        try:
            results = work.run([t.work for t in jobs])
        except Exception as error:  # one bad request must not fail the others: run each alone
            if len(jobs) == 1:
                self._done(jobs[0], error)
                return
            for job in jobs:
                self._run_batch([job])
            return
        for job, result in zip(jobs, results, strict=True):
            self._done(job, result)

    def _step(self, joining: list[_Job]) -> None:
        for job in joining:
            self._join(job)
        for job in [t for t in self._decoding if t.cancelled]:
            self._leave(job, _END)
        if not self._decoding:
            return
        try:
            tokens = self.running.step()
        except Exception as error:  # the batch is lost: fail its jobs, start afresh
            for job in list(self._decoding):
                self._leave(job, error)
            return
        routes = collections.Counter(t.work.route for t in self._decoding)
        for route, count in routes.items():
            self._observe_batch(route, count)
        for token in tokens:
            self._emit(token)

    def _join(self, job: _Job) -> None:
        work = job.work
        try:
            for row, (prompt, config) in enumerate(zip(work.prompts, work.configs, strict=True)):
                self.running.add((job, row), prompt, config)
        except Exception as error:
            for row in range(len(work.prompts)):
                self.running.remove((job, row))
            self._done(job, error)
            return
        job.rows_left = len(work.prompts)
        self._decoding[job] = None

    def _leave(self, job: _Job, item: Any) -> None:
        for row in range(len(job.work.prompts)):
            self.running.remove((job, row))
        del self._decoding[job]
        self._done(job, item)

    def _emit(self, token: RowToken) -> None:
        job, row = token.key
        if job not in self._decoding:  # an earlier row of the job failed in this step
            return
        try:
            job.send(job.work.chunk(row, token))
        except Exception as error:
            self._leave(job, error)
            return
        if token.finish is not None:
            job.rows_left -= 1
            if job.rows_left == 0:
                del self._decoding[job]
                self._done(job, _END)

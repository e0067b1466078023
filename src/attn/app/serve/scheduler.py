"""Running jobs off the event loop: the `Scheduler` the routes submit to.

This is the simple scheduler: every model has one worker thread that runs its jobs one at a
time, in arrival order, through `attn.app.serve.work`. At most `max_queue` jobs per model wait
or run; one more raises `QueueFull`, which the server answers with 429 and a Retry-After. A
stream's tokens are computed one at a time on the worker thread, so a client that goes away
stops its decode at the next token.

The interface (`submit`, `submit_stream`, `QueueFull`, the job classes of `work`) is what a
batching scheduler implements too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from attn.app.serve.metrics import ServeMetrics
from attn.app.serve.work import Chunk, Job, run_job, stream_job

_END = object()


class QueueFull(Exception):
    """The model's queue holds `max_queue` jobs already.

    Attributes:
        retry_after_s: when a retry may find room, in seconds.
    """

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"queue full; retry after {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


class Scheduler:
    """One worker thread per model, one job at a time.

    Args:
        models: the names of the served models.
        max_queue: the most jobs per model waiting or running.
        metrics: where the queue lengths and batch sizes go.
    """

    def __init__(self, models: list[str], max_queue: int, metrics: ServeMetrics) -> None:
        self.max_queue = max_queue
        self.metrics = metrics
        self._workers = {name: ThreadPoolExecutor(1, thread_name_prefix=f"attn-{name}") for name in models}
        self._queued = dict.fromkeys(models, 0)

    async def submit(self, job: Job) -> Any:
        """Runs `job` on its model's thread and returns what `work.run_job` returns for it.

        Raises:
            QueueFull: the model's queue is full.
        """
        self._admit(job)
        try:
            return await self._on_worker(job, run_job, job)
        finally:
            self._leave(job)

    def submit_stream(self, job: Job) -> AsyncIterator[Chunk]:
        """The chunks of a streaming job, computed one at a time on its model's thread.

        Raises:
            QueueFull: the model's queue is full (at once, before anything is iterated).
        """
        self._admit(job)
        return self._stream(job)

    async def _stream(self, job: Job) -> AsyncIterator[Chunk]:
        try:
            chunks: Iterator[Chunk] = await self._on_worker(job, stream_job, job)
            while (chunk := await self._on_worker(job, next, chunks, _END)) is not _END:
                yield chunk
        finally:
            self._leave(job)

    def close(self) -> None:
        """Stops the worker threads once their current jobs are done."""
        for worker in self._workers.values():
            worker.shutdown(wait=True, cancel_futures=True)

    async def _on_worker(self, job: Job, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._workers[job.model.name], function, *args)

    def _admit(self, job: Job) -> None:
        name = job.model.name
        if self._queued[name] >= self.max_queue:
            raise QueueFull(retry_after_s=1.0)
        self._queued[name] += 1
        self.metrics.queue_length.labels(model=name).set(self._queued[name])
        self.metrics.batch_size.labels(model=name, route=job.route).observe(1)

    def _leave(self, job: Job) -> None:
        name = job.model.name
        self._queued[name] -= 1
        self.metrics.queue_length.labels(model=name).set(self._queued[name])

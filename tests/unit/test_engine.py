"""The serving engine: waiting jobs run together (within the token budget, by group), one at a time without
batching; a full queue raises QueueFull with a retry time; a cancelled job's work is dropped; drain finishes
what was admitted; completions decode in a continuous batch that gives each request its tokens alone."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from prometheus_client import CollectorRegistry, Gauge, Histogram

from attn.app.serve.engine import BatchJob, Closed, Engine, QueueFull, RowsJob
from attn.decoding import GenerationConfig, RunningBatch, generate
from attn.models import build_model
from attn.core.presets import preset


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue_length = Gauge("q", "", ["model"], registry=self.registry)
        self.batch_size = Histogram("b", "", ["model", "route"], registry=self.registry)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"model": "m", **labels})


class Recorder:
    """A `BatchJob.run` that records the jobs of each call; the first call waits for `release`."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, works: list[BatchJob]) -> list[str]:
        self.calls.append([w.group_name for w in works])
        self.started.set()
        self.release.wait(10)
        return [f"done {w.group_name}" for w in works]

    def work(self, name: str, group: str = "g", sizes: tuple[int, ...] = (3,)) -> BatchJob:
        work = BatchJob("embeddings", group, sizes, self)
        work.group_name = name  # what the recorder reports
        return work


async def _submit_while_busy(engine: Engine, recorder: Recorder, works: list[BatchJob]) -> list[str]:
    """Submits a blocker, then `works` while the blocker runs; every result."""
    blocker = asyncio.ensure_future(engine.submit(recorder.work("blocker", group="other")))
    await asyncio.to_thread(recorder.started.wait, 10)
    pending = [asyncio.ensure_future(engine.submit(w)) for w in works]
    await asyncio.sleep(0.05)
    recorder.release.set()
    return await asyncio.gather(blocker, *pending)


@pytest.mark.parametrize("batching", [True, False])
def test_waiting_tasks_of_one_group_run_together_within_the_budget(batching: bool) -> None:
    recorder, metrics = Recorder(), Metrics()
    engine = Engine("m", None, batching, max_queue=10, max_batch_tokens=12, metrics=metrics)
    works = [recorder.work("a1", sizes=(3,)), recorder.work("b1", group="h"), recorder.work("a2", sizes=(2, 2)),
             recorder.work("a3", sizes=(4,)), recorder.work("a4", sizes=(5,))]
    results = asyncio.run(_submit_while_busy(engine, recorder, works))
    assert results == ["done blocker", "done a1", "done b1", "done a2", "done a3", "done a4"]
    if batching:  # a1 (oldest), then the shortest of its group while rows x longest <= 12: a2 (3 x 3), not a3 (4 x 4)
        assert recorder.calls == [["blocker"], ["a1", "a2"], ["b1"], ["a3", "a4"]]
        assert metrics.value("b_count", route="embeddings") == 4
        assert metrics.value("b_sum", route="embeddings") == 6
    else:
        assert recorder.calls == [["blocker"], ["a1"], ["b1"], ["a2"], ["a3"], ["a4"]]
    assert metrics.value("q") == 0


def test_a_failing_batch_is_run_again_task_by_task_so_only_the_bad_one_fails() -> None:
    def run(works: list[BatchJob]) -> list[int]:
        if any(w.sizes == (0,) for w in works):
            raise ValueError("bad input")
        return [w.sizes[0] for w in works]

    async def main() -> list[object]:
        engine = Engine("m", None, True, max_queue=10, max_batch_tokens=100)
        return await asyncio.gather(*[engine.submit(BatchJob("classify", "g", (n,), run)) for n in (1, 0, 2)],
                                    return_exceptions=True)

    first, bad, last = asyncio.run(main())
    assert (first, last) == (1, 2) and isinstance(bad, ValueError)


def test_a_full_queue_raises_queue_full_with_a_retry_time() -> None:
    recorder = Recorder()

    async def main() -> None:
        engine = Engine("m", None, True, max_queue=2, max_batch_tokens=100)
        admitted = [asyncio.ensure_future(engine.submit(recorder.work(n))) for n in ("x", "y")]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as full:
            await engine.submit(recorder.work("z"))
        assert full.value.retry_after_s > 0
        recorder.release.set()
        assert await asyncio.gather(*admitted) == ["done x", "done y"]
        assert await engine.submit(recorder.work("z")) == "done z"  # room again

    asyncio.run(main())


def test_a_cancelled_waiting_task_is_never_run() -> None:
    recorder = Recorder()

    async def main() -> None:
        engine = Engine("m", None, True, max_queue=5, max_batch_tokens=100)
        blocker = asyncio.ensure_future(engine.submit(recorder.work("blocker", group="other")))
        await asyncio.to_thread(recorder.started.wait, 10)
        gone = asyncio.ensure_future(engine.submit(recorder.work("gone")))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0.01)
        recorder.release.set()
        assert await blocker == "done blocker"
        assert await engine.submit(recorder.work("next")) == "done next"

    asyncio.run(main())
    assert recorder.calls == [["blocker"], ["next"]]


def test_drain_finishes_what_was_admitted_and_refuses_new_tasks() -> None:
    recorder = Recorder()

    async def main() -> None:
        engine = Engine("m", None, False, max_queue=5, max_batch_tokens=100)
        admitted = [asyncio.ensure_future(engine.submit(recorder.work(n))) for n in ("x", "y")]
        await asyncio.to_thread(recorder.started.wait, 10)
        draining = asyncio.ensure_future(engine.drain())
        await asyncio.sleep(0.01)
        with pytest.raises(Closed):
            await engine.submit(recorder.work("late"))
        recorder.release.set()
        await draining
        assert [a.result() for a in admitted] == ["done x", "done y"]

    asyncio.run(main())


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return build_model(preset("gpt2-tiny").replace(dropout=0.0)).eval()


def _rows(prompts: list[list[int]], config: GenerationConfig) -> RowsJob:
    return RowsJob("completions", prompts, [config] * len(prompts), lambda row, token: (row, token.token, token.finish))


async def _collect(engine: Engine, work: RowsJob, stop_after: int | None = None) -> list[tuple]:
    chunks = []
    stream = engine.submit_stream(work)
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == stop_after:
            await stream.aclose()
            break
    return chunks


def test_streams_decoded_in_one_continuous_batch_get_their_tokens_alone(lm) -> None:
    config = GenerationConfig(max_new_tokens=6)
    requests = [[[5, 6, 7]], [[8, 9, 10, 11, 12], [13]], [[14, 15]]]
    metrics = Metrics()

    async def main() -> list[list[tuple]]:
        engine = Engine("m", RunningBatch(lm, eos_id=None), True, max_queue=8, max_batch_tokens=1000, metrics=metrics)
        return await asyncio.gather(*[_collect(engine, _rows(prompts, config)) for prompts in requests])

    for prompts, chunks in zip(requests, asyncio.run(main())):
        for row, prompt in enumerate(prompts):
            assert [token for r, token, _ in chunks if r == row] == generate(lm, [prompt], config)[0]
            assert [finish for r, _, finish in chunks if r == row][-1] == "length"
    assert metrics.value("b_sum", route="completions") > metrics.value("b_count", route="completions")


def test_a_stream_that_stops_listening_leaves_the_batch_and_the_others_go_on(lm) -> None:
    long, short = GenerationConfig(max_new_tokens=40), GenerationConfig(max_new_tokens=8)
    running = RunningBatch(lm, eos_id=None)

    async def main() -> list[list[tuple]]:
        engine = Engine("m", running, True, max_queue=8, max_batch_tokens=1000)
        found = await asyncio.gather(_collect(engine, _rows([[5, 6]], long), stop_after=2),
                                     _collect(engine, _rows([[7, 8, 9]], short)))
        await engine.drain()
        return found

    gone, kept = asyncio.run(main())
    assert len(gone) == 2 and len(running) == 0
    assert [token for _, token, _ in kept] == generate(lm, [[7, 8, 9]], short)[0]


def test_a_bad_row_fails_its_own_stream_only(lm) -> None:
    async def main() -> tuple[object, list[tuple]]:
        engine = Engine("m", RunningBatch(lm, eos_id=None), True, max_queue=8, max_batch_tokens=1000)
        too_long = _rows([[5] * lm.max_positions], GenerationConfig(max_new_tokens=4))
        return await asyncio.gather(_collect(engine, too_long), _collect(engine, _rows([[5]], GenerationConfig(
            max_new_tokens=3))), return_exceptions=True)

    bad, good = asyncio.run(main())
    assert "max_positions" in str(bad) and len(good) == 3


def test_rows_for_a_model_without_a_running_batch_are_refused_at_once() -> None:
    async def main() -> None:
        engine = Engine("m", None, True, max_queue=2, max_batch_tokens=100)
        with pytest.raises(TypeError, match="decoder-only"):
            engine.submit_stream(_rows([[5]], GenerationConfig(max_new_tokens=1)))

    asyncio.run(main())

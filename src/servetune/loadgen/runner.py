"""Run one load level: warm-up requests, then the timed requests on vLLM's arrival schedule."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from collections.abc import Awaitable, Callable, Sequence
from time import perf_counter_ns

from servetune.loadgen.arrival import ArrivalProcess, schedule_ns
from servetune.loadgen.client import Client, Target
from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.workload.request import RequestSpec


async def run_load(
    target: Target,
    requests: Sequence[RequestSpec],
    *,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    warmup_requests: int = 0,
    seed: int = 0,
    request_timeout_s: float = 600.0,
    on_record: Callable[[RequestRecord], None] | None = None,
    should_stop: Callable[[Sequence[RequestRecord]], bool] | None = None,
) -> LoadResult:
    """Send `requests` to `target` the way `vllm bench serve` does and record every one.

    The first `warmup_requests` are sent at once (at most `max_concurrency` in flight), awaited,
    and recorded with `warmup=True`. The rest are due on the seeded gamma/Poisson schedule of
    `schedule_ns`; each is sent when due, or, with `max_concurrency`, as soon as a slot frees up
    after that. `on_record` gets each finished record; `should_stop` gets the finished timed
    records after each completion, and when it returns True sending stops and requests in flight
    are cancelled (recorded with error "cancelled"; those still waiting for a slot are not sent).
    Automatic garbage collection is paused during the timed part.
    """
    warmup, timed = requests[:warmup_requests], requests[warmup_requests:]
    due_ns = schedule_ns(ArrivalProcess(request_rate, burstiness, seed), len(timed))
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    records: list[RequestRecord] = []
    finished: list[RequestRecord] = []
    stop = asyncio.Event()

    async with Client(target, request_timeout_s) as client:

        async def send_one(index: int, spec: RequestSpec, scheduled_ns: int, is_warmup: bool) -> None:
            async with slots:
                record = RequestRecord(index, spec.prompt_len, spec.output_len, is_warmup, scheduled_ns)
                records.append(record)
                await client.send(spec, record)
            if on_record is not None:
                on_record(record)
            if not is_warmup:
                finished.append(record)
                if should_stop is not None and should_stop(finished):
                    stop.set()

        now = perf_counter_ns()
        await asyncio.gather(*(send_one(i, spec, now, True) for i, spec in enumerate(warmup)))
        with _collector_paused():
            start_ns = perf_counter_ns()
            first = len(warmup)
            schedule = [(start_ns + due, first + i, spec) for i, (spec, due) in enumerate(zip(timed, due_ns))]
            sender = asyncio.create_task(_send_on_schedule(schedule, send_one))
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait((sender, stopper), return_when=asyncio.FIRST_COMPLETED)
            stopped_early = not sender.done()
            stopper.cancel()
            sender.cancel()
            await asyncio.gather(stopper, sender, return_exceptions=True)
            end_ns = perf_counter_ns()
        if not stopped_early:
            sender.result()  # re-raise an exception from on_record or should_stop

    records.sort(key=lambda r: r.index)
    return LoadResult(records, request_rate, burstiness, max_concurrency, start_ns, end_ns, stopped_early)


def run_load_sync(target: Target, requests: Sequence[RequestSpec], **options) -> LoadResult:
    """`run_load` on a new event loop: uvloop's when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run_load(target, requests, **options))
    return uvloop.run(run_load(target, requests, **options))


async def _send_on_schedule(
    schedule: Sequence[tuple[int, int, RequestSpec]],
    send_one: Callable[[int, RequestSpec, int, bool], Awaitable[None]],
) -> None:
    """Start `send_one` for each (due_ns, index, spec) when it is due and wait for them all; if
    cancelled, cancel those in flight and wait until they have recorded it."""
    tasks = []
    try:
        for due_ns, index, spec in schedule:
            await _sleep_until(due_ns)
            tasks.append(asyncio.create_task(send_one(index, spec, due_ns, False)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _collector_paused():
    """Collect garbage now and pause automatic collection until the block ends: a full collection
    of a big heap stalls the loop for tens of ms, and a request's normal path makes no cycles."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def _sleep_until(deadline_ns: int) -> None:
    """Return at `deadline_ns` (`perf_counter_ns` clock), never before.

    uvloop's timers tick in whole ms and may fire early, so sleep again for what is left (under
    0.5 ms that is a bare yield to the loop). Spinning harder costs a core and, on a shared
    machine, makes the scheduler run us later, not sooner."""
    while (left := deadline_ns - perf_counter_ns()) > 0:
        await asyncio.sleep(left / 1e9)

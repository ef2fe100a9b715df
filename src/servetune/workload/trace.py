"""Trace replay: a production trace's arrival times and token counts, with prompts built to those counts.

Layouts, told apart by their column names (CSV with a header row, or JSON Lines):

- servetune: `timestamp` (s), `input_tokens`, `output_tokens`, optional `prefix_group` (requests of one
  group start with the same `trace.block_tokens` tokens);
- Azure LLM inference trace (CSV): `TIMESTAMP` (ISO date and time; with a UTC offset such as `+05:00` it is
  honoured, rows with different offsets included; without one it is taken as UTC), `ContextTokens`,
  `GeneratedTokens`;
- Mooncake (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one id per
  `trace.block_tokens`-token block of the prompt; requests with the same leading ids share those blocks).

Other columns are ignored. Arrivals are taken relative to the first one and replayed in time order; a timestamp
must be a finite number >= 0 (a `nan`, `inf` or negative one is refused naming its file:line), and no arrival may
come more than MAX_GAP_S after the one before it (a replay would wait that long).
"""

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from servetune.workload.request import RequestSpec
from servetune.workload.spec import TraceSpec, WorkloadError

MAX_GAP_S = 86_400  # a day

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from servetune.workload.text import TextSampler


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One traced request: its arrival (s after the trace's first), token counts, and the ids of the prefix
    blocks it shares with others (empty when none)."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[str, ...] = ()


def _timestamp(value) -> float:
    """A numeric timestamp as a float; WorkloadError unless it is finite and >= 0."""
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise WorkloadError(f"timestamp {value!r} is not a finite number >= 0")
    return number


def _servetune(row: dict) -> TraceRow:
    group = row.get("prefix_group")
    blocks = () if group in (None, "") else (str(group),)
    return TraceRow(_timestamp(row["timestamp"]), int(row["input_tokens"]), int(row["output_tokens"]), blocks)


def _azure(row: dict) -> TraceRow:
    """A `TIMESTAMP` with a UTC offset keeps it; one without is UTC."""
    moment = datetime.fromisoformat(row["TIMESTAMP"].strip())
    arrival = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
    return TraceRow(arrival, int(row["ContextTokens"]), int(row["GeneratedTokens"]))


def _mooncake(row: dict) -> TraceRow:
    blocks = tuple(str(h) for h in row.get("hash_ids") or ())
    return TraceRow(_timestamp(row["timestamp"]) / 1000, int(row["input_length"]), int(row["output_length"]),
                    blocks)


def _layout(row: dict):
    """The parser for a row's layout, told by its column names."""
    if "input_length" in row:
        return _mooncake
    if "TIMESTAMP" in row:
        return _azure
    if "timestamp" in row:
        return _servetune
    raise WorkloadError(f"unknown trace layout with columns {sorted(row)}: see servetune.workload.trace")


def read_trace(path: Path) -> tuple[TraceRow, ...]:
    """The trace's rows in arrival order, arrivals relative to the first (s)."""
    try:
        return _read(Path(path), Path(path).stat().st_mtime_ns)
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text") from None


@lru_cache(maxsize=2)
def _read(path: Path, mtime_ns: int) -> tuple[TraceRow, ...]:
    with path.open(encoding="utf-8", newline="") as f:
        lines: Iterable[tuple[int, Any]]  # (line number, a CSV row's dict or a JSON line)
        if path.suffix == ".csv":
            lines = enumerate(csv.DictReader(f), start=2)
        else:
            lines = ((n, line) for n, line in enumerate(f, start=1) if line.strip())
        rows = []  # (row, its line)
        for number, line in lines:
            try:
                row = line if isinstance(line, dict) else json.loads(line)
                parsed = _layout(row)(row)
            except WorkloadError as e:
                raise WorkloadError(f"{path}:{number}: {e}") from None
            except (ValueError, KeyError, TypeError) as e:
                raise WorkloadError(f"{path}:{number}: not a trace row ({type(e).__name__}: {e})") from None
            if parsed.input_tokens < 1 or parsed.output_tokens < 1:
                raise WorkloadError(f"{path}:{number}: input and output tokens must be >= 1")
            rows.append((parsed, number))
    if not rows:
        raise WorkloadError(f"{path}: no rows")
    rows.sort(key=lambda pair: pair[0].arrival_s)
    for (before, _), (row, number) in zip(rows, rows[1:]):
        if (gap := row.arrival_s - before.arrival_s) > MAX_GAP_S:
            shown = f"{gap:,.0f}" if gap < 1e12 else f"{gap:g}"
            raise WorkloadError(f"{path}:{number}: arrives {shown} s after the request before it: a replay would wait "
                                f"that long (at most {MAX_GAP_S:,} s, a day, between arrivals): cut the trace there")
    first = rows[0][0].arrival_s
    return tuple(TraceRow(r.arrival_s - first, r.input_tokens, r.output_tokens, r.blocks) for r, _ in rows)


def build_trace_requests(
    spec: TraceSpec, tokenizer: "PreTrainedTokenizerBase", texts: "TextSampler", count: int
) -> list[RequestSpec]:
    """The trace's first `count` rows (all of them when it has fewer) as requests with their `arrival_s`.

    Each block id gets its own random `block_tokens` tokens, so requests share exactly the prefixes the trace
    says they share, and another seed (`texts`) gives other blocks. `prompt_len` counts the special tokens
    the tokenizer adds, as the completions endpoint does."""
    added = tokenizer.num_special_tokens_to_add()
    blocks: dict[str, list[int]] = {}
    requests = []
    for row in read_trace(spec.path)[:count]:
        if row.input_tokens - added < 2:
            raise WorkloadError(
                f"{spec.path}: a {row.input_tokens}-token prompt leaves no text after the special tokens")
        for block in row.blocks:
            if block not in blocks:
                blocks[block] = texts.random_ids(spec.block_tokens)
        head = [token for block in row.blocks for token in blocks[block]]
        text = cast(str, tokenizer.decode(head[: row.input_tokens - added - 1]))  # token ids in: a str out
        prompt = texts.exact(row.input_tokens - added, head=text)
        requests.append(RequestSpec(prompt, row.input_tokens, row.output_tokens, arrival_s=row.arrival_s))
    return requests


def trace_rate(requests: Sequence[RequestSpec]) -> float | None:
    """The mean arrival rate [req/s] of trace requests as recorded (speed-up 1); None when they are not from
    a trace or arrive all at once."""
    arrivals = [r.arrival_s for r in requests if r.arrival_s is not None]
    if len(arrivals) < 2 or arrivals[-1] <= arrivals[0]:
        return None
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])

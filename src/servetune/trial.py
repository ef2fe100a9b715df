"""One trial: launch vLLM with a config, measure its capacity and goodput rate over load levels, stop it.

Before the first level the running server is checked against the workload (`preflight`): a config that
would refuse or cut short part of the workload is not measured. A head-to-head trial measures fixed
(rate, seed) levels instead of searching. Each level at a finite rate sends until its statistical verdict
is final (`servetune.verdict`). A deadline stops the trial where it is, keeping what it measured. A trial that fails (OOM, bad config, a server that dies, a
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
from servetune.loadgen import LoadShape, RequestRecord, Target
from servetune.metrics import tpot_ms, ttft_ms
from servetune.outcome import Failure, LevelName, LevelOutcome, TrialOutcome, TrialStatus
from servetune.search.objective import RateSearch, keeping_up_unshown, level_verdict, rejected_requests
from servetune.slo import TPOT, TTFT
from servetune.verdict import Decision, LevelTest, SloTest
from servetune.workload import RequestSpec, WorkloadSpec
from servetune.workload.trace import trace_rate

SATURATION_MIN_FINISHED = 20


@dataclass(frozen=True)
class LevelOptions:
    """How load levels are sized and decided, the same for every trial of a study. A level at a finite rate
    sends until its statistical verdict is final (`servetune.verdict`), at most `requests`."""

    requests: int = 600  # most requests a level sends (and the size of each prompt set)
    min_requests: int = 40  # fewest requests a verdict rests on
    max_levels: int = 6  # levels per trial in the rate search
    warmup_requests: int = 8
    resolution: float = 0.05
    confidence: float = 0.95  # of each level's verdict, pass and fail alike
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
    fixed_levels: list[tuple[float, int]] = field(default_factory=list)  # a head-to-head: (rate, seed) each


def requests_per_s(plan: TrialPlan, rate: float) -> float:
    """A level's rate in req/s: `rate` itself, or for a trace (whose rates are speed-up factors) `rate` times
    the trace's recorded rate."""
    return rate * (trace_rate(plan.level_sets[0]) or 1.0)


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
        if TTFT.slo in slo and statistics.median(map(ttft_ms, recent)) > 4 * slo[TTFT.slo]:
            return True
        tpots = [t for t in map(tpot_ms, recent) if t is not None]
        return TPOT.slo in slo and bool(tpots) and statistics.median(tpots) > 2 * slo[TPOT.slo]

    return should_stop


class LevelStop:
    """A level's `should_stop`: its verdict is final (`test`), it is saturated, or the deadline (epoch s)
    passed. `why` says which stopped it: "decided", "saturated" or "time limit"."""

    def __init__(self, test: LevelTest | None, saturated: Callable[[Sequence[RequestRecord]], bool] | None,
                 deadline: float | None):
        self.test, self.saturated, self.deadline = test, saturated, deadline
        self.seen = 0
        self.why: str | None = None

    def __call__(self, finished: Sequence[RequestRecord]) -> bool:
        if self.test is not None:
            for record in finished[self.seen:]:
                self.test.add(record)
            self.seen = len(finished)
        if self.test is not None and self.test.decision != Decision.UNDECIDED:
            self.why = "decided"
        elif self.saturated is not None and self.saturated(finished):
            self.why = "saturated"
        elif self.deadline is not None and time.time() >= self.deadline:
            self.why = "time limit"
        return self.why is not None


def run_trial(
    plan: TrialPlan,
    engine_args: dict[str, Any],
    out_dir: Path,
    *,
    deadline: float | None = None,
    on_level: Callable[[str, float, int], None] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> TrialOutcome:
    """Launch, measure, stop. The outcome's paths are relative to `out_dir`. At `deadline` (epoch s) the
    level running is stopped and the trial ends with what it measured (`cut_short`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    startup_timeout_s = plan.levels.startup_timeout_s
    if deadline is not None:
        startup_timeout_s = max(1.0, min(startup_timeout_s, deadline - time.time()))
    engine = Engine(plan.model, engine_args, out_dir / "server.log", startup_timeout_s=startup_timeout_s,
                    extra_env=plan.engine_env)
    facts: dict[str, Any] = {"rate_unit": plan.workload.rate_unit}
    try:
        facts["startup"] = engine.start()
    except EngineFailed as e:
        if deadline is not None and time.time() >= deadline:
            facts["cut_short"] = "time limit"
        failure = Failure(kind=e.failure.kind, reason=e.failure.reason, log=engine.log_path.name)
        return TrialOutcome.failed(engine.engine_args, failure, wall_s=time.monotonic() - started, **facts)
    levels: list[LevelOutcome] = []
    search, cut = None, False
    try:
        refusal = preflight(engine.base_url, plan)
        if refusal is None:
            search, cut = _measure(plan, engine, out_dir, levels, deadline, on_level, on_record)
    finally:
        alive = engine.alive()
        engine.stop()
    facts["wall_s"] = time.monotonic() - started
    if refusal is not None:
        return TrialOutcome.failed(engine.engine_args, refusal, **facts)
    if cut or any(lv.stopped == "time limit" for lv in levels):
        facts["cut_short"] = "time limit"
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


def _measure(plan: TrialPlan, engine: Engine, out_dir: Path, levels: list[LevelOutcome], deadline: float | None,
             on_level: Callable | None, on_record: Callable | None) -> tuple[RateSearch | None, bool]:
    """Run the plan's levels, appending each to `levels`: its fixed ones (a head-to-head), or capacity, the
    workload's target rate and the rate search (goodput) while the server lives and the deadline allows.
    Returns the rate search and whether the deadline left a level of the plan unmeasured (a search that ended
    by itself just before the deadline was not cut short)."""
    target = Target(engine.base_url, plan.model, plan.workload.endpoint)
    warmup_requests = plan.levels.warmup_requests

    def level(name: LevelName, rate: float, warmup: int = 0, seed: int | None = None) -> LevelOutcome:
        index = len(levels)
        seed = index if seed is None else seed
        requests = plan.level_sets[index % len(plan.level_sets)]
        n = min(plan.levels.requests, len(requests) - warmup)
        if name == LevelName.CAPACITY and plan.objective == "goodput":  # only an upper bound for the rate search
            n = min(n, 3 * plan.levels.min_requests)
        for attempt in range(2):  # a level the client could not send on time is sent once more
            if on_level:
                on_level(name, rate, n + warmup)
            reset_prefix_cache(engine.base_url)
            test = (LevelTest(plan.slo, first=min(plan.levels.min_requests, n), cap=n, first_index=warmup,
                              confidence=plan.levels.confidence)
                    if plan.slo and math.isfinite(rate) else None)
            saturated = saturation_check(plan.slo, requests_per_s(plan, rate), n) if math.isfinite(rate) else None
            stop = LevelStop(test, saturated, deadline)
            shape = LoadShape(request_rate=rate, burstiness=plan.workload.burstiness,
                              max_concurrency=plan.workload.max_concurrency, warmup_requests=warmup, seed=seed,
                              request_timeout_s=plan.levels.request_timeout_s)
            result = measure_level(target, requests[: n + warmup], shape, on_record=on_record, should_stop=stop)
            if not result.metrics.client_lagging or stop.why == "time limit":
                break
        records = out_dir / f"level-{index:02d}.records.jsonl"
        result.load.save(records)
        levels.append(_level_outcome(name, rate, seed, result, stop, plan.slo, records.name, attempt + 1))
        return levels[-1]

    def time_left() -> bool:
        return deadline is None or time.time() < deadline

    if plan.fixed_levels:  # a head-to-head: every (rate, seed) as given, the first with warm-up requests
        for i, (rate, seed) in enumerate(plan.fixed_levels):
            if not engine.alive():
                break
            if not time_left():
                return None, True
            level(LevelName.CONFIRM, rate, warmup=warmup_requests if i == 0 else 0, seed=seed)
        return None, False
    capacity = level(LevelName.CAPACITY, math.inf, warmup=warmup_requests)
    if plan.objective != "goodput":
        return None, False
    search = RateSearch(capacity.metrics.request_throughput / requests_per_s(plan, 1.0), plan.levels.resolution,
                        plan.levels.max_levels)
    if math.isfinite(plan.workload.request_rate):
        if not time_left():
            return search, True
        at_target = level(LevelName.TARGET, plan.workload.request_rate)
        search.tell(at_target.rate, at_target.passed)
    while (rate := search.next_rate()) is not None and engine.alive():
        if not time_left():
            return search, True
        search.tell(rate, level(LevelName.SEARCH, rate).passed)
    return search, False


def _level_outcome(name: LevelName, rate: float, seed: int, result, stop: LevelStop, slo: dict[str, float],
                   records: str, attempts: int) -> LevelOutcome:
    """A measured level with its verdict: fail on any hard reason (an SLO's test failed, errors, rejected or
    short replies, a lagging client, saturation, falling behind), pass when every test passed and the level
    showed it keeps up, else undecided (a test still open at the cap or at the time limit, keeping up not
    shown)."""
    short = result.metrics.errors.get("short", 0)
    if stop.test is not None:
        stop.test.finish()
    tests = list(stop.test.tests.values()) if stop.test is not None else None
    hard = level_verdict(result.metrics, slo, short, tests=[t for t in tests or [] if t.decision == Decision.FAIL]
                         if tests is not None else None)
    if stop.why == "saturated":
        hard.append("cut short: saturated")
    open_tests = [t for t in tests or [] if t.decision == Decision.UNDECIDED] + [
        name for name in slo if tests is not None and name not in {t.slo for t in tests}]
    unshown = (keeping_up_unshown(result.metrics.keep_up_ratio, result.metrics.keep_up_se)
               if math.isfinite(result.metrics.offered_request_rate) else None)
    if hard:
        verdict, reasons = Decision.FAIL, hard
    elif open_tests or unshown:
        verdict = Decision.UNDECIDED
        reasons = [f"undecided: {t}" if isinstance(t, SloTest) else f"undecided: {t}: no request counted"
                   for t in open_tests] + ([f"undecided: {unshown}"] if unshown else [])
        if stop.why == "time limit":
            reasons.append("stopped by the time limit")
    else:
        verdict, reasons = Decision.PASS, []
    return LevelOutcome(name=name, rate=rate, seed=seed, verdict=verdict, passed=verdict == Decision.PASS,
                        reasons=reasons, tests=tests or [], stopped=stop.why, metrics=result.metrics,
                        server=result.server, records=records,
                        rejected=rejected_requests(result.metrics) + short, attempts=attempts)


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


def reset_prefix_cache(base_url: str) -> None:
    """Empty the prefix cache (needs VLLM_SERVER_DEV_MODE=1, which the launcher sets) so no level is
    helped by the prompts of another; the levels also send fresh prompts."""
    try:
        httpx.post(base_url + "/reset_prefix_cache", timeout=30)
    except httpx.HTTPError:
        pass

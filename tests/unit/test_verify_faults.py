"""`servetune verify` reading a tune that did not end well: it refuses a tune that holds no rate in one line saying
so, and says when the tune it reads was interrupted or is still running. Stopped mid-run, with tests/fake_engine.py
standing in for vLLM: tests/integration/test_verify_faults_integration.py."""

import threading
from pathlib import Path

import pytest

from servetune.options import UsageError, VerifyArgs
from servetune.study.record import TuneState
from servetune.study.results import Summary
from servetune.study.storage import StudyLock, default_storage
from servetune.tuner.loop import tune
from servetune.verify import read_tune
from support.standins import Held, StandIn, options


def a_tune(tiny_model, out: Path, rate: float = 5.0, **kw) -> None:
    """A finished one-trial tune in `out` whose pick holds `rate`."""
    tune(options(tiny_model, out, None, **kw), executor=StandIn({0: rate}, out))


def test_a_tune_recommends_the_rate_its_summary_holds(tiny_model, tmp_path):
    a_tune(tiny_model, tmp_path / "searched", confirm=False)
    pick = read_tune(tmp_path / "searched")
    assert (pick.rate, pick.slo.as_dict(), pick.note, pick.workload.num_requests) == (5.0, {"tpot_p99_ms": 25}, None,
                                                                                      20)
    a_tune(tiny_model, tmp_path / "confirmed", confirm=True)  # the head-to-head's recommendation (StandIn: 5.0)
    assert read_tune(tmp_path / "confirmed").rate == 5.0


def test_a_tune_that_holds_no_rate_is_refused_in_one_line_saying_so(tiny_model, tmp_path):
    a_tune(tiny_model, tmp_path / "out", rate=0.0)
    assert read_tune(tmp_path / "out").rate is None
    with pytest.raises(UsageError, match=rf"^--out: the tune in {tmp_path / 'out'} holds no rate \(no config held "
                                         r"the SLOs at a rate it measured, or it tuned throughput\): give --rate"):
        VerifyArgs(out=tmp_path / "out").resolve()
    assert VerifyArgs(out=tmp_path / "out", rate=2.0).resolve()[0].workload.request_rate == 2.0


def test_verify_says_when_the_tune_it_reads_was_interrupted_stopped_or_is_still_running(tiny_model, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # stopped in its head-to-head
        tune(options(tiny_model, out, None, confirm=True, budget=2),
             executor=StandIn({0: 5.0, 1: 10.0}, out, interrupt_head_to_head=True))
    plan, _ = VerifyArgs(out=out).resolve()
    assert plan.tune_note == f"the tune in {out} was interrupted: its pick is interim (`tune --resume` continues it)"

    summary = Summary.model_validate_json((out / "summary.json").read_text())
    (out / "summary.json").write_text(summary.model_copy(update={"state": TuneState.RUNNING}).model_dump_json())
    assert read_tune(out).note == (f"the tune in {out} stopped without saying so (killed?): its pick is interim "
                                   "(`tune --resume` continues it)")  # as a tune killed mid-trial leaves it
    held = StudyLock(out, default_storage(out)).acquire()
    try:
        assert read_tune(out).note.startswith(f"the tune in {out} is still running (pid ")
    finally:
        held.release()


def test_verify_of_a_tune_mid_trial_says_it_is_still_running_and_of_the_finished_tune_nothing(tiny_model, tmp_path):
    out = tmp_path / "out"
    first = Held(out)
    thread = threading.Thread(target=lambda: tune(options(tiny_model, out, None), executor=first))
    thread.start()
    try:
        assert first.running.wait(120)
        assert (out / "summary.json").exists()
        with pytest.raises(UsageError, match="recommends no config"):  # nothing measured yet
            VerifyArgs(out=out).resolve()
    finally:
        first.go.set()
        thread.join(120)
    assert read_tune(out).note is None

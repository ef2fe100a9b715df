"""`servetune verify` against faults: it writes its JSON as it goes, servetune's client first, and
on a stop (SIGTERM, or SIGINT with SIGINT ignored by its parent) marks it interrupted with what was measured; it
refuses a tune that holds no rate in one line saying so, and says when the tune it reads was interrupted or is still
running. tests/fake_engine.py stands in for vLLM."""

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_for
from servetune.options import UsageError, VerifyArgs
from servetune.study.record import TuneState
from servetune.study.results import Summary
from servetune.study.storage import StudyLock, default_storage
from servetune.tuner.loop import tune
from servetune.verify import VerifyResult, read_tune
from test_study_lock import Held, options
from test_tune_stops import StandIn

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
WORKLOAD = "num_requests: 40\ninput_len: {type: fixed, value: 16}\noutput_len: {type: fixed, value: 16}\n"


def a_tune(tiny_model, out: Path, rate: float = 5.0, **kw) -> None:
    """A finished one-trial tune in `out` whose pick holds `rate`."""
    tune(options(tiny_model, out, None, **kw), executor=StandIn({0: rate}, out))


def test_a_tune_recommends_the_rate_its_summary_holds(tiny_model, tmp_path):
    a_tune(tiny_model, tmp_path / "searched", confirm=False)
    pick = read_tune(tmp_path / "searched")
    assert (pick.rate, pick.slo, pick.note, pick.workload.num_requests) == (5.0, {"tpot_p99_ms": 25}, None, 20)
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


def verify_argv(tiny_model, tmp_path: Path, prompts: int) -> tuple[list[str], Path]:
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    (tmp_path / "best.yaml").write_text(f"model: {tiny_model}\n")
    json_out = tmp_path / "v" / "v.json"
    return [sys.executable, str(FAKE_ENGINE), "verify", "--config", str(tmp_path / "best.yaml"), "--model",
            str(tiny_model), "--workload", str(tmp_path / "w.yaml"), "--rate", "20", "--num-prompts", str(prompts),
            "--json", str(json_out)], json_out


def fake_requests(json_out: Path) -> int:
    """The requests the fake server behind the verify writing `json_out` has had (0 before it is up)."""
    log = json_out.with_suffix(".server.log")
    if not log.exists():
        return 0
    with urllib.request.urlopen(f"http://127.0.0.1:{log.read_text().split()[-1]}/stats") as stats:
        return json.load(stats)["requests"]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.integration
def test_a_stop_during_servetunes_client_keeps_its_finished_requests_marked_interrupted(tiny_model, tmp_path, sig,
                                                                                        code):
    argv, json_out = verify_argv(tiny_model, tmp_path, prompts=400)
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert wait_for(lambda: fake_requests(json_out) >= 8 + 40 or proc.poll() is not None, 120)  # warm-up, then 40
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    result = VerifyResult.model_validate_json(json_out.read_text())
    assert result.state == "interrupted" and result.vllm is None
    assert 10 < result.servetune.metrics.completed < 400
    records = json_out.with_suffix(".records.jsonl").read_text().splitlines()
    assert len(records) - 1 == result.servetune.metrics.completed + result.servetune.metrics.failed
    assert f"what was measured before the stop is in {json_out} (interrupted)" in " ".join(stderr.split())


@pytest.mark.integration
def test_the_json_is_written_once_servetunes_client_is_done_and_a_stop_in_vllms_keeps_it(tiny_model, tmp_path):
    argv, json_out = verify_argv(tiny_model, tmp_path, prompts=20)
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FAKE_VLLM_CLIENT_S": "60", "FAKE_TOKEN_DELAY_MS": "1"})
    assert wait_for(lambda: json_out.exists() or proc.poll() is not None, 120)
    measuring = VerifyResult.model_validate_json(json_out.read_text())
    assert measuring.state == "measuring" and measuring.servetune.metrics.completed == 20 and measuring.vllm is None
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    stopped = VerifyResult.model_validate_json(json_out.read_text())
    assert stopped.state == "interrupted" and stopped.servetune == measuring.servetune
    assert stopped.vllm_failure == "interrupted before vLLM's client was done"

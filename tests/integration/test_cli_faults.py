"""`servetune bench` and `tune` against faults (tests/fake_server.py, no vLLM): bad options are refused before
any load, a silent server and a short stream are failures in the records, Ctrl-C keeps what was measured, no
secret is printed."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from support.paths import FAKE_SERVER, ROOT

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.fixture
def fake(request):
    """A fake server (one token per 20 ms tick; indirect parametrization adds its options) and a function
    returning how many requests it has had."""
    proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms", "20",
                             *getattr(request, "param", [])], stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"

    def requests() -> int:
        with urllib.request.urlopen(url + "/stats") as resp:
            return json.load(resp)["requests"]

    yield url, requests
    proc.kill()
    proc.wait()


def bench(url: str, tiny_model, out: Path, *args: str, prompts: list[str] | None = None, max_tokens: int = 8):
    """`servetune bench` argv against `url`: a JSONL dataset of `prompts` when given, else random prompts."""
    if prompts is None:
        load = ["--input-len", "8", "--output-len", str(max_tokens), "--num-prompts", "4"]
    else:
        data = out.with_suffix(".data.jsonl")
        data.write_text("".join(json.dumps({"prompt": p, "max_tokens": max_tokens}) + "\n" for p in prompts))
        spec = out.with_suffix(".workload.yaml")
        spec.write_text(f"num_requests: {len(prompts)}\ndataset: {{path: {data}, format: jsonl}}\n")
        load = ["--workload", str(spec)]
    return [*SERVETUNE, "bench", "--base-url", url, "--model", "fake", "--tokenizer", str(tiny_model), *load,
            "--json", str(out), *args]


def last_line(proc) -> str:
    return [line for line in proc.stderr.splitlines() if line.strip()][-1]


@pytest.mark.parametrize(("args", "names"), [
    (["--goodput", "foo=1"], "--goodput: unknown metric 'foo'"),
    (["--goodput", "ttft_ms"], "--goodput: 'ttft_ms' is not key=value"),
    (["--request-rate", "-1"], "--request-rate: "),
    (["--burstiness", "0"], "--burstiness: "),
    (["--endpoint", "foo"], "--endpoint: "),
    (["--request-timeout", "0"], "--request-timeout: "),
])
@pytest.mark.integration
def test_a_bad_option_is_one_line_naming_it_before_any_request(fake, tiny_model, tmp_path, args, names):
    url, requests = fake
    proc = subprocess.run(bench(url, tiny_model, tmp_path / "o.json", *args), capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [last_line(proc)]
    assert last_line(proc).startswith(f"error: {names}")
    assert requests() == 0 and not (tmp_path / "o.json").exists()


@pytest.mark.integration
def test_a_bad_goodput_with_launch_is_refused_before_launching(tiny_model, tmp_path):
    out = tmp_path / "o.json"
    proc = subprocess.run([*SERVETUNE, "bench", "--launch", "--model", str(tiny_model), "--input-len", "8",
                           "--output-len", "4", "--num-prompts", "2", "--goodput", "foo=1", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--goodput: unknown metric 'foo'" in last_line(proc)
    assert "launching" not in proc.stderr and not out.with_suffix(".server.log").exists()


@pytest.mark.integration
def test_tune_names_the_slo_option(tiny_model, tmp_path):
    proc = subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml",
                           "--out", str(tmp_path), "--slo", "tpot_p99_ms"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 2 and last_line(proc) == "error: --slo: 'tpot_p99_ms' is not key=value"


@pytest.mark.integration
def test_a_study_password_is_never_printed(tiny_model, tmp_path):
    proc = subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml",
                           "--out", str(tmp_path), "--slo", "tpot_p99_ms=50", "--study",
                           "postgresql+psycopg://alice:S3cretPW@127.0.0.1:9/db"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 2
    assert "S3cretPW" not in proc.stderr + proc.stdout
    assert last_line(proc).startswith("error: cannot open study storage postgresql+psycopg://alice:***@127.0.0.1:9")


@pytest.mark.integration
@pytest.mark.parametrize("fake", [["--max-model-len", "4096"]], indirect=True)
def test_bench_refuses_prompts_longer_than_the_servers_context_before_any_request(fake, tiny_model, tmp_path):
    url, requests = fake
    out = tmp_path / "o.json"
    proc = subprocess.run(bench(url, tiny_model, out, "--input-len", "8522", "--num-prompts", "3"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"error: 3 of 3 requests are longer than the max-model-len of the server at {url} (4096 tokens): the longest "
        "(8522 prompt + 8 output tokens) needs 8530; vLLM would refuse them or cut their replies short: shorten the "
        "workload"]
    assert requests() == 0 and not out.exists()
    ok = subprocess.run(bench(url, tiny_model, out, "--input-len", "4000", "--num-prompts", "2"), capture_output=True,
                        text=True, timeout=120)  # what fits is sent
    assert ok.returncode == 0, ok.stderr
    assert requests() == 2


@pytest.mark.integration
def test_bench_launch_refuses_prompts_longer_than_the_models_context_before_launching(tiny_model, tmp_path):
    out = tmp_path / "o.json"
    proc = subprocess.run([*SERVETUNE, "bench", "--launch", "--model", str(tiny_model), "--input-len", "8522",
                           "--output-len", "8", "--num-prompts", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert last_line(proc).startswith(f"error: 2 of 2 requests are longer than the max-model-len of the model "
                                      f"{tiny_model.resolve()} (4096 tokens): the longest (8522 prompt + 8 output")
    assert "launching" not in proc.stderr and not out.with_suffix(".server.log").exists()
    proc = subprocess.run([*SERVETUNE, "bench", "--launch", "--model", str(tiny_model), "--engine-arg",
                           "max-model-len=512", "--input-len", "600", "--output-len", "8", "--num-prompts", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "(512 tokens): the longest (600 prompt + 8 output tokens)" in last_line(proc)


@pytest.mark.integration
def test_a_server_that_never_answers_fails_each_request_after_the_request_timeout(fake, tiny_model, tmp_path):
    url, _ = fake
    out = tmp_path / "o.json"
    started = time.monotonic()
    proc = subprocess.run(bench(url, tiny_model, out, "--request-timeout", "2", prompts=["fake:hang=1"] * 3),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "requests failed" in last_line(proc)
    assert time.monotonic() - started < 30
    result = json.loads(out.read_text())
    assert result["errors"] == {"timeout": 3}
    assert len(out.with_suffix(".records.jsonl").read_text().splitlines()) == 4


@pytest.mark.integration
def test_a_stream_that_ends_short_fails_the_run(fake, tiny_model, tmp_path):
    url, _ = fake
    out = tmp_path / "o.json"
    proc = subprocess.run(bench(url, tiny_model, out, prompts=["fake:end_after=3"] * 2 + ["ba be"] * 2),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(out.read_text())
    assert result["completed"] == 2 and result["errors"] == {"short": 2}


@pytest.mark.integration
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_keeps_the_finished_requests(fake, tiny_model, tmp_path, sig, code):
    """SIGINT (to a bench started with SIGINT ignored, as a script's `cmd &` starts it) or SIGTERM mid-run: exit
    130 / 143 and the requests finished so far in the JSON (interrupted) and the records."""
    url, requests = fake
    out = tmp_path / "o.json"
    argv = bench(url, tiny_model, out, "--request-rate", "20", "--num-prompts", "400", max_tokens=20)
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while requests() < 40 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and 10 < result["completed"] < 400
    records = out.with_suffix(".records.jsonl").read_text().splitlines()
    assert len(records) - 1 == result["completed"] + result["failed"]
    assert f"the {result['completed']} requests that finished before the interrupt" in stderr


@pytest.mark.integration
def test_an_unwritable_json_path_is_refused_before_any_request(fake, tiny_model, tmp_path):
    url, requests = fake
    (tmp_path / "a-file").write_text("")
    for where, why in ((tmp_path, "it is a directory"), (tmp_path / "a-file" / "o.json", "a-file is a file, not a")):
        proc = subprocess.run(bench(url, tiny_model, where), capture_output=True, text=True)
        assert proc.returncode == 2 and f"--json: cannot write {where}" in last_line(proc), proc.stderr
        assert why in last_line(proc)
    assert requests() == 0


@pytest.mark.integration
@pytest.mark.parametrize("fake", [["--metrics", "<html>not Prometheus</html>"]], indirect=True)
def test_a_metrics_page_that_is_not_prometheus_text_leaves_the_servers_counters_out(fake, tiny_model, tmp_path):
    """A 200 /metrics that is not Prometheus text was a ValueError traceback; bench against an
    OpenAI-compatible server that is not vLLM measures it all the same, without vLLM's counters."""
    url, requests = fake
    proc = subprocess.run(bench(url, tiny_model, tmp_path / "o.json"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["completed"] == 4 and result["server_metrics"] is None


@pytest.mark.integration
def test_a_server_that_does_not_answer_tokenize_as_vllm_fails_the_trial_as_data(fake, tiny_model):
    """A /tokenize answer without `max_model_len` (here the fake server's 404) was a KeyError
    traceback out of the trial; it is the trial's failure, saying what the server answered."""
    from servetune.trial.server import preflight
    from servetune.workload import WorkloadSpec, build_requests, load_tokenizer

    url, requests = fake
    spec = WorkloadSpec.random(8, 4, 2)
    failure = preflight(url, "fake", "completions", build_requests(spec, load_tokenizer(str(tiny_model)), count=2))
    assert failure.kind == "not_vllm"
    assert failure.reason == ('the server does not answer as vLLM does: /tokenize gave HTTP 404 without '
                              'max_model_len: {"error": "not found"}')
    assert requests() == 0

"""`servetune verify` stopped mid-run, with tests/fake_engine.py standing in for vLLM: it writes its JSON as it goes,
servetune's client first, and on a stop (SIGTERM, or SIGINT with SIGINT ignored by its parent) marks it interrupted
with what was measured."""

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_for
from servetune.verify import VerifyResult
from support.verify import verify_argv


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

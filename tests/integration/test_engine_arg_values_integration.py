"""A bad engine-arg value in the CLI: `servetune tune` and `bench --launch` say it in one line before vLLM is probed
or launched."""

import subprocess
import sys

import pytest

from support.paths import ROOT

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.mark.integration
@pytest.mark.parametrize("command", ["tune", "bench"])
def test_a_bad_engine_arg_is_one_line_before_anything_is_probed_or_launched(tiny_model, tmp_path, command):
    """Refused in `resolve`, before vLLM is probed: with vLLM hidden (SERVETUNE_NO_VLLM=1), a probe would fail
    with another message."""
    where = {"tune": ["--workload", "examples/chat.yaml", "--out", str(tmp_path / "out"), "--slo", "tpot_p99_ms=50"],
             "bench": ["--launch", "--json", str(tmp_path / "b.json")]}[command]
    proc = subprocess.run([*SERVETUNE, command, "--model", str(tiny_model), *where, "--engine-arg",
                           "max-model-len=abc"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --engine-arg: max-model-len=abc: not a whole number above 0")
    assert list(tmp_path.iterdir()) == []

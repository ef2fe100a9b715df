"""`servetune verify`'s command line: against a real server, and with tests/fake_engine.py standing in for vLLM;
the workload of conftest's `options` (verify's options for vLLM's defaults)."""

import sys
from pathlib import Path

from support.paths import FAKE_ENGINE

SERVETUNE = [sys.executable, "-m", "servetune", "verify"]
WORKLOAD = ("num_requests: 40\ninput_len: {type: uniform, min: 64, max: 128}\n"
            "output_len: {type: uniform, min: 8, max: 16}\n")
FAKE_WORKLOAD = "num_requests: 40\ninput_len: {type: fixed, value: 16}\noutput_len: {type: fixed, value: 16}\n"


def argv(options: dict[str, str | None], *more: str) -> list[str]:
    """verify's command line: `options` (those set to None left out), then `more`."""
    return [*SERVETUNE, *(a for name, value in options.items() if value is not None for a in (name, value)), *more]


def verify_argv(tiny_model, tmp_path: Path, prompts: int) -> tuple[list[str], Path]:
    """`servetune verify` of the tiny model's defaults at 20 req/s, FAKE_WORKLOAD's `prompts` requests, through
    tests/fake_engine.py: its command line and its --json."""
    (tmp_path / "w.yaml").write_text(FAKE_WORKLOAD)
    (tmp_path / "best.yaml").write_text(f"model: {tiny_model}\n")
    json_out = tmp_path / "v" / "v.json"
    return [sys.executable, str(FAKE_ENGINE), "verify", "--config", str(tmp_path / "best.yaml"), "--model",
            str(tiny_model), "--workload", str(tmp_path / "w.yaml"), "--rate", "20", "--num-prompts", str(prompts),
            "--json", str(json_out)], json_out

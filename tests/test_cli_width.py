"""The CLI fits any terminal: at 80 columns, in a terminal or in a log file, the tune's answer prints every config and
the command to run whole (never cut to fit a table's column)."""

import io
import json
import re
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from rich.console import Console

import servetune.console
from servetune.cli import _tune
from servetune.engine.args import to_argv
from servetune.options import TuneArgs
from servetune.study.results import Summary

ROOT = Path(__file__).resolve().parents[1]
# A real tune's answer (H200, heavy-tailed prompts, two SLOs, 15 minutes): a long model path and a best config of
# seven flags, whose table cut them to "--max-num-…" before.
HEAVY = ROOT / "docs" / "results" / "h200-matrix" / "heavy-15m" / "summary.json"


def committed_summary(path: Path = HEAVY) -> Summary:
    return Summary.model_validate(json.loads(path.read_text()))


@contextmanager
def printed(width: int, terminal: bool):
    """What servetune's console prints meanwhile, at `width` columns, to a terminal or to a file (a log)."""
    out = io.StringIO()
    with mock.patch.object(servetune.console, "console", Console(file=out, width=width, force_terminal=terminal,
                                                                 color_system=None)):
        yield out


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log file"])
def test_the_answer_at_80_columns_prints_each_config_and_the_command_whole(terminal):
    summary = committed_summary()
    with printed(80, terminal) as out:
        servetune.console.show_answer(summary, Path("out/heavy"))
    lines = out.getvalue().splitlines()
    assert f"run it: {summary.best_command}" in lines  # one line: a terminal wraps it, a log file keeps it whole
    assert summary.best_command.endswith(" ".join(to_argv(summary.best.config)))
    assert f"best (trial 2): {' '.join(to_argv(summary.best.config))}" in lines
    assert "default (trial 0): --load-format dummy" in lines
    assert "outputs: out/heavy/ (state: time-limit)" in lines and "report: out/heavy/report.html" in lines
    table = lines[:lines.index("default (trial 0): --load-format dummy")]
    assert all(len(line) <= 80 for line in table) and "…" not in out.getvalue()
    assert "p99 TTFT <= 1500 ms, p99 ITL <= 35 ms" in table[0]
    assert any(re.match(r"│ best \(trial 2\) +│ 9\.26 +│ 13\.19 +│ 244\.1 +│ 30\.6 +│$", line) for line in table), table


def test_the_cli_tune_ends_with_the_answer_whole_in_a_log_file(tiny_model, tmp_path):
    """The command's own path from the tuner's summary to the console, the tuner stood in for."""
    summary = committed_summary()
    opts = TuneArgs(model=str(tiny_model), workload=ROOT / "examples" / "chat.yaml", out=tmp_path / "out",
                    slo=["itl_p99_ms=35"]).resolve()
    with printed(80, terminal=False) as out, mock.patch("servetune.tuner.loop.tune", return_value=summary):
        _tune(opts)
    lines = out.getvalue().splitlines()
    assert f"run it: {summary.best_command}" in lines and f"outputs: {opts.out}/ (state: time-limit)" in lines
    assert " ".join(summary.answer.split()) in " ".join(out.getvalue().split())

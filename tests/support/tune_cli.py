"""A short `servetune tune` command line that the tests stop, resume and refuse."""

import sys
from pathlib import Path

SERVETUNE = [sys.executable, "-m", "servetune"]
WORKLOAD = """\
num_requests: 60
seed: 1
input_len: {type: uniform, min: 64, max: 128}
output_len: {type: uniform, min: 8, max: 16}
"""


def tune_args(model: Path, workload: Path, out: Path, *extra: str) -> list[str]:
    """A short tune the tests stop and resume: up to 4 rates (on a busy 2-core VM two levels in a row were undecided,
    keeping up with 96-98% of arrivals, which left the defaults with no rate: 2026-12-03, --max-levels 2), windows
    of 5 s (the default 20 s made each level at ~230 req/s count ~4,600 requests)."""
    return [*SERVETUNE, "tune", "--model", str(model), "--workload", str(workload), "--out", str(out),
            "--slo", "tpot_p99_ms=500", "--strategy", "seed", "--budget", "2", "--level-requests", "320",
            "--min-level-requests", "20", "--max-levels", "4", "--level-window", "5", "--no-confirm", *extra]

"""Looking for a study in the CLI writes nothing: `servetune report` leaves a zero-byte study untouched, and a
--resume that finds none leaves an empty directory empty."""

import subprocess
import sys

import pytest

from servetune.report import write_report
from servetune.study.storage import StudyError, default_storage
from support.paths import ROOT

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.mark.integration
def test_report_leaves_a_zero_byte_study_untouched(tmp_path):
    (tmp_path / "study.db").touch()
    proc = subprocess.run([*SERVETUNE, "report", "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: no servetune study in {default_storage(tmp_path)}: the file is empty"
    assert (tmp_path / "study.db").stat().st_size == 0
    with pytest.raises(StudyError, match="the file is empty"):
        write_report(default_storage(tmp_path), tmp_path)
    assert (tmp_path / "study.db").stat().st_size == 0


@pytest.mark.integration
def test_a_failed_resume_in_an_empty_directory_leaves_nothing(tiny_model, tmp_path):
    proc = subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml",
                           "--out", str(tmp_path), "--slo", "tpot_p99_ms=50", "--resume"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --resume: no study to resume in {default_storage(tmp_path)}"
    assert list(tmp_path.iterdir()) == []

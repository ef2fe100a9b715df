"""No password printed or written: a tune of a real PostgreSQL study with an awkward password leaves it in no
output, and the CLI prints it nowhere."""

import subprocess
import sys

import pytest

from conftest import postgres_server
from servetune.study.storage import StudyLock
from servetune.tuner.loop import tune
from support.passwords import PASSWORDS, forms
from support.paths import ROOT
from support.standins import StandIn, options

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.mark.integration
def test_a_tune_of_a_postgresql_study_leaves_its_password_nowhere(tiny_model, tmp_path, capfd):
    password = PASSWORDS[3]
    with postgres_server(password) as (storage, _):
        out = tmp_path / "out"
        summary = tune(options(tiny_model, out, storage), executor=StandIn({0: 5.0}, out))
        assert summary.trials == 1 and (out / "best_command.sh").exists() and (out / "report.html").exists()
        cli = [subprocess.run([*SERVETUNE, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
               for args in (["report", "--study", storage, "--out", str(tmp_path / "report")],
                            ["tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml", "--out",
                             str(tmp_path / "again"), "--slo", "tpot_p99_ms=50", "--study", storage])]
        held = StudyLock(tmp_path, storage).acquire()
        try:
            cli.append(subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload",
                                       "examples/chat.yaml", "--out", str(tmp_path / "again"), "--slo",
                                       "tpot_p99_ms=25", "--study", storage, "--resume"],
                                      capture_output=True, text=True, timeout=300, cwd=ROOT))
        finally:
            held.release()
    report, exists, locked = cli
    assert report.returncode == 0 and (tmp_path / "report" / "summary.json").exists(), report.stderr
    assert exists.returncode == 2 and "postgresql+psycopg://postgres:***@127.0.0.1:" in exists.stderr
    assert "already holds a study" in exists.stderr
    assert locked.returncode == 2 and "is being tuned by pid" in locked.stderr, locked.stderr
    printed = capfd.readouterr()
    texts = [printed.out, printed.err, *(p.stdout + p.stderr for p in cli)]
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert len(texts) > 10
    for form in forms(password) | forms("p@ss"):
        assert not any(form in text for text in texts), form

"""`servetune tune`'s refusals, before anything launches: a --resume without a study, a second study in the same
place, an unknown strategy, an unknown SLO."""

import subprocess

import optuna
import pytest

from servetune.study.storage import STUDY_NAME
from support.tune_cli import WORKLOAD, tune_args

pytestmark = pytest.mark.integration  # starts processes


def test_resume_without_a_study_and_a_second_study_in_the_same_place_are_refused(tiny_model, tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "out"
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--resume"), capture_output=True, text=True)
    assert proc.returncode == 2 and "no study to resume" in proc.stderr.strip().splitlines()[-1]
    optuna.create_study(study_name=STUDY_NAME, storage=f"sqlite:///{tmp_path / 'taken.db'}")
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--study", f"sqlite:///{tmp_path / 'taken.db'}"),
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "already holds a study" in proc.stderr.strip().splitlines()[-1]
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--strategy", "annealing"),
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown strategy" in proc.stderr.strip().splitlines()[-1]
    proc = subprocess.run(tune_args(tiny_model, workload, out, "--slo", "ttft_ms=3"), capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown SLO ttft_ms" in proc.stderr.strip().splitlines()[-1]

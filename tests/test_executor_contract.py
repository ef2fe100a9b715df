"""The executor contract suite (`servetune.testing.executors`) run against servetune's executors: `Inline`,
`LocalPool` on CPU cores and `RayCluster` on a local Ray (started once for this module), the way Optuna runs one
suite against every sampler. LocalPool's own packing onto GPUs and cores, and its workers dying with the tuner,
are in tests/test_executors.py; tests/test_parallel_e2e.py runs real trials.

`-k "not RayCluster"` leaves Ray out, and its start-up (~15 s here) with it."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import wait_for
from servetune.engine import InstalledVllm
from servetune.engine.launcher import free_port
from servetune.executors import Inline, LocalPool
from servetune.testing import executors as contract
from servetune.testing.executors import ExecutorContract

CPU = InstalledVllm("0.0", "cpu", {})
RAY_GPUS = 2  # the local Ray head declares two GPUs (none are needed: a task only gets CUDA_VISIBLE_DEVICES)


@pytest.mark.timeout(60)
class TestInline(ExecutorContract):
    no_devices = "Inline launches whatever it is given; vLLM says whether a config starts"
    no_worker = ("Inline runs the work inside submit, in the tuner's own process: a work that dies takes the tuner "
                 "with it, and when submit returns its one slot is free again")

    @pytest.fixture
    def executor_factory(self):
        return lambda slots, work: Inline(work=work)


@pytest.mark.timeout(60)
class TestLocalPool(ExecutorContract):
    no_devices = ("on CPU cores a trial's ranks share its slot's cores: any size runs (the GPU case is in "
                  "test_executors.py)")

    @pytest.fixture
    def executor_factory(self):
        return lambda slots, work: LocalPool(slots, CPU, work=work)


@pytest.mark.timeout(120)  # the first test starts Ray
class TestRayCluster(ExecutorContract):
    devices = RAY_GPUS

    @pytest.fixture
    def executor_factory(self, ray_head):
        from servetune.executors.cluster import RayCluster

        return lambda slots, work: RayCluster(ray_head, slots, work=work)


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head (2 CPUs, 2 declared GPUs) in its own session, for this module; its address. Token
    authentication is off: `ray start` turns it on when ~/.ray/auth_token exists, and a driver given an address
    sends no token unless RAY_AUTH_MODE=token. The stand-in goes to Ray's workers by value: they import servetune
    as installed in the venv, which need not be this checkout (nor hold `servetune.testing`). Every process of the
    session is killed at the end (`ray stop` stops every Ray on the host)."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(contract)
    port, temp = free_port(), tempfile.mkdtemp(prefix="/tmp/ray-")
    head = subprocess.Popen([Path(sys.executable).with_name("ray"), "start", "--head", "--port", str(port),
                             "--num-cpus", "2", "--num-gpus", str(RAY_GPUS), "--include-dashboard", "false",
                             "--disable-usage-stats", "--temp-dir", temp],
                            env=os.environ | {"RAY_AUTH_MODE": "disabled"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = head.communicate(timeout=90)
        assert head.returncode == 0, err.decode()[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        cloudpickle.unregister_pickle_by_value(contract)
        head.kill()
        head.wait()
        for pid in _session(head.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        gone = wait_for(lambda: not _session(head.pid), 30)
        shutil.rmtree(temp, ignore_errors=True)
        assert gone, f"Ray processes left behind: {_session(head.pid)}"


def _session(sid: int) -> list[int]:
    """The live processes of session `sid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except OSError:
            continue
        if int(session) == sid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids

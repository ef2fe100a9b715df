"""The executor contract suite (`servetune.testing.executors`) run against servetune's executors that start
processes: `LocalPool` on CPU cores and `RayCluster` on a local Ray (started once for this module), the way Optuna
runs one suite against every sampler (against `Inline`: tests/unit/executors/test_executor_contract_unit.py).
LocalPool's own packing onto GPUs and cores, and its workers dying with the tuner, are in
tests/integration/test_executors.py; tests/e2e/test_parallel_e2e.py runs real trials.

`-k "not RayCluster"` leaves Ray out, and its start-up (~15 s here) with it."""

import pytest

from conftest import listening, loopback_only, ray_head, session_pids
from servetune.engine import InstalledVllm
from servetune.executors import LocalPool
from servetune.testing import executors as contract
from servetune.testing.executors import ExecutorContract

CPU = InstalledVllm("0.0", "cpu", {})
RAY_GPUS = 2  # the local Ray head declares two GPUs (none are needed: a task only gets CUDA_VISIBLE_DEVICES)


@pytest.mark.integration
@pytest.mark.timeout(60)
class TestLocalPool(ExecutorContract):
    no_devices = ("on CPU cores a trial's ranks share its slot's cores: any size runs (the GPU case is in "
                  "tests/integration/test_executors.py)")

    @pytest.fixture
    def executor_factory(self):
        return lambda slots, work: LocalPool(slots, CPU, work=work)


@pytest.mark.integration
@pytest.mark.timeout(120)  # the first test starts Ray
class TestRayCluster(ExecutorContract):
    devices = RAY_GPUS

    @pytest.fixture
    def executor_factory(self, ray_head_address):
        from servetune.executors.cluster import RayCluster

        return lambda slots, work: RayCluster(ray_head_address, slots, work=work)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray head (2 CPUs, 2 declared GPUs) on loopback only, for this module (conftest's `ray_head`): (its
    address, its session id). The stand-in goes to Ray's workers by value: they import servetune as installed in
    the venv, which need not be this checkout (nor hold `servetune.testing`)."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(contract)
    try:
        with ray_head(num_gpus=RAY_GPUS) as head:
            yield head
    finally:
        cloudpickle.unregister_pickle_by_value(contract)


@pytest.fixture(scope="module")
def ray_head_address(ray_session) -> str:
    return ray_session[0]


@pytest.mark.integration
def test_the_test_ray_cluster_listens_on_loopback_only(ray_session):
    address, sid = ray_session
    addresses = listening(set(session_pids(sid)))
    assert any(a.endswith(f":{address.split(':')[1]}") for a in addresses), addresses  # GCS among them
    assert loopback_only(addresses), addresses

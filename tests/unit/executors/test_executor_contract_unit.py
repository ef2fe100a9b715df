"""The executor contract suite (`servetune.testing.executors`) run against `Inline`, which runs each trial inside
submit, in the test's own process. Against `LocalPool` and `RayCluster`: tests/integration/test_executor_contract.py."""

import pytest

from servetune.executors import Inline
from servetune.testing.executors import ExecutorContract


@pytest.mark.timeout(60)
class TestInline(ExecutorContract):
    no_devices = "Inline launches whatever it is given; vLLM says whether a config starts"
    no_worker = ("Inline runs the work inside submit, in the tuner's own process: a work that dies takes the tuner "
                 "with it, and when submit returns its one slot is free again")

    @pytest.fixture
    def executor_factory(self):
        return lambda slots, work: Inline(work=work)

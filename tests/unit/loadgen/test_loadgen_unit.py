"""The load generator in the test's own process: a refused connection is recorded, and its arrival process on its
own. Against tests/fake_server.py: tests/integration/test_loadgen.py."""

import math
import socket

import numpy as np
import pytest

from servetune.loadgen import ArrivalProcess, Target, run_load_sync, schedule_ns
from support.loadgen import specs


def test_connection_refused_is_recorded():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_load_sync(Target(f"http://127.0.0.1:{port}", "m"), specs(2))
    assert [r.error_kind for r in result.records] == ["connect", "connect"]
    assert all(r.http_status is None and r.end_ns >= r.start_ns for r in result.records)


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_gamma_intervals_have_the_right_mean_and_spread(burstiness):
    process = ArrivalProcess(rate=50, burstiness=burstiness, seed=1)
    intervals = np.array([process.next_interval() for _ in range(40_000)])
    assert intervals.mean() == pytest.approx(1 / 50, rel=0.03)
    cv = intervals.std() / intervals.mean()
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.03)  # Poisson: 1; burstier: more


def test_poisson_counts_per_window():
    process = ArrivalProcess(rate=200, seed=7)
    arrivals = np.cumsum([process.next_interval() for _ in range(40_000)])
    counts = np.bincount(arrivals.astype(int))[:-1]  # arrivals per 1 s window
    assert counts.mean() == pytest.approx(200, rel=0.02)
    assert counts.var() == pytest.approx(200, rel=0.35)  # Poisson: variance = mean


def test_constant_and_infinite_rates():
    assert {ArrivalProcess(rate=20, burstiness=math.inf).next_interval() for _ in range(5)} == {0.05}
    assert schedule_ns(ArrivalProcess(rate=math.inf), 4) == [0, 0, 0, 0]


def test_schedule_is_seeded_and_ends_at_n_over_rate():
    due = schedule_ns(ArrivalProcess(rate=8, seed=3), 100)
    assert due == schedule_ns(ArrivalProcess(rate=8, seed=3), 100)
    assert due != schedule_ns(ArrivalProcess(rate=8, seed=4), 100)
    assert due == sorted(due) and due[0] > 0
    assert due[-1] == pytest.approx(100 / 8 * 1e9, abs=1)

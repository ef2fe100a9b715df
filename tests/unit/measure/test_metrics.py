"""Metrics on synthetic records in integer ns, against answers worked out by hand."""

import math

import pytest

from servetune.errors import ServetuneError
from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.measure.metrics import (
    LATE_MS,
    SCHEDULE_LAG_BOUND_MS,
    schedule_lag_ms,
    summarize,
)
from servetune.measure.slo import GOODPUT_KEYS, good_request, parse_goodput

MS = 1_000_000


def rec(index, start_ms, chunks_ms=(), end_ms=None, tokens=None, prompt_tokens=None, *,
        lag_ms=0, slot_freed_ms=None, error=None, warmup=False, prompt_len=7):
    """A record whose times are given in ms from the level's origin."""
    chunk_ns = [round(c * MS) for c in chunks_ms]
    end = end_ms if end_ms is not None else (chunks_ms[-1] if chunks_ms else start_ms)
    return RequestRecord(
        index=index, prompt_len=prompt_len, expected_output_len=16, warmup=warmup,
        scheduled_ns=round((start_ms - lag_ms) * MS), start_ns=round(start_ms * MS), chunk_ns=chunk_ns,
        slot_freed_ns=0 if slot_freed_ms is None else round(slot_freed_ms * MS),
        end_ns=round(end * MS), output_tokens=tokens, prompt_tokens=prompt_tokens, error=error,
        http_status=None if error and error.startswith("connect") else 200)


def level(records, rate=10.0, start_ms=0, end_ms=2000, stopped_early=False):
    return LoadResult(records, rate, 1.0, None, round(start_ms * MS), round(end_ms * MS), stopped_early)


@pytest.fixture
def mixed():
    return level([
        rec(0, 0, (9000, 9001), tokens=2, warmup=True),  # warm-up: never counted
        rec(1, 0, (100, 120, 150), 151, tokens=3, prompt_tokens=10, lag_ms=1),
        rec(2, 500, (700, 710, 720, 730, 740), 741, tokens=5, prompt_tokens=20, lag_ms=2),
        rec(3, 600, (), 610, lag_ms=3, error="http_500: Internal Server Error"),
        rec(4, 1000, (1050,), 1051, tokens=1, lag_ms=5),  # no usage prompt_tokens: prompt_len 7 counts
        rec(5, 1800, (1850,), 1900, lag_ms=4, error="cancelled"),
    ])


def test_counts_totals_and_throughput(mixed):
    s = summarize(mixed)
    assert s.duration == 2.0
    assert (s.completed, s.failed) == (3, 1)
    assert s.errors == {"http_500": 1, "cancelled": 1}
    assert s.total_input_tokens == 10 + 20 + 7
    assert s.total_output_tokens == 3 + 5 + 1
    assert s.request_throughput == 1.5
    assert s.output_throughput == 4.5
    assert s.total_token_throughput == 23.0
    assert s.request_goodput is None
    assert s.max_output_tokens_per_s == 8  # 3 + 5 token chunks in the first second
    assert s.max_concurrent_requests == 2  # requests 1 and 2 are both active in second 0


def test_latency_distributions(mixed):
    s = summarize(mixed, percentiles=(50, 90, 99, 99.9))
    # TTFT 100, 200, 50 ms
    assert s.mean_ttft_ms == pytest.approx(350 / 3)
    assert s.median_ttft_ms == pytest.approx(100)
    mean = 350 / 3
    assert s.std_ttft_ms == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in (100, 200, 50)) / 3))
    assert s.p90_ttft_ms == pytest.approx(180)  # linear between 100 and 200 at 0.8
    assert s.p99_ttft_ms == pytest.approx(198)
    assert getattr(s, "p99.9_ttft_ms") == pytest.approx(199.8)
    # TPOT (e2el - ttft)/(n - 1): (150-100)/2 = 25, (240-200)/4 = 10; the 1-token request has none
    assert s.mean_tpot_ms == pytest.approx(17.5)
    assert s.p90_tpot_ms == pytest.approx(23.5)
    # ITL: 20, 30 and 10, 10, 10, 10
    assert s.mean_itl_ms == pytest.approx(15)
    assert s.median_itl_ms == pytest.approx(10)
    assert s.p90_itl_ms == pytest.approx(25)
    # E2EL to the last token chunk: 150, 240, 50
    assert s.mean_e2el_ms == pytest.approx(440 / 3)
    assert s.median_e2el_ms == pytest.approx(150)
    # schedule lag over every sent timed request: 1, 2, 3, 5, 4 ms
    assert s.p99_schedule_lag_ms == pytest.approx(4.96)
    assert (s.late_requests, s.client_lagging) == (0, False)


def test_waiting_for_a_concurrency_slot_is_not_lag():
    # due at 0, slot freed at 700, sent at 703: 3 ms late; no wait, due at 100, sent at 100.5: 0.5 ms;
    # a slot freed before the due time does not count: due at 200, freed at 150, sent at 260: 60 ms
    records = [rec(0, 703, (800,), tokens=1, lag_ms=703, slot_freed_ms=700),
               rec(1, 100.5, (200,), tokens=1, lag_ms=0.5),
               rec(2, 260, (300,), tokens=1, lag_ms=60, slot_freed_ms=150)]
    assert [schedule_lag_ms(r) for r in records] == pytest.approx([3, 0.5, 60])
    s = summarize(level(records))
    assert s.p99_schedule_lag_ms == pytest.approx(58.86)  # rank 0.99 * 2 = 1.98: 3 + 0.98 * (60 - 3)
    assert s.late_requests == 0


def test_late_requests_and_a_lagging_client():
    assert (LATE_MS, SCHEDULE_LAG_BOUND_MS) == (100, 50)
    # lags 0, 1, ..., 99 ms and one of 100 ms (exactly LATE_MS: not late), 101 and 250 ms (late), and a
    # cancelled request 400 ms late (sent, so it counts)
    lags = [*range(100), 100, 101, 250]
    records = [rec(i, 1000 + i, (1100 + i,), tokens=1, lag_ms=lag) for i, lag in enumerate(lags)]
    records.append(rec(103, 1500, (), 1510, lag_ms=400, error="cancelled"))
    s = summarize(level(records))
    assert s.late_requests == 3
    # 104 lags, p99 at rank 0.99 * 103 = 101.97: between 101 (rank 101) and 250 (rank 102)
    assert s.p99_schedule_lag_ms == pytest.approx(101 + 0.97 * 149)
    assert s.client_lagging is True
    on_time = summarize(level([rec(i, 1000 + i, (1100 + i,), tokens=1, lag_ms=i % 50) for i in range(100)]))
    assert on_time.p99_schedule_lag_ms == pytest.approx(49)
    assert (on_time.late_requests, on_time.client_lagging) == (0, False)


def test_goodput_needs_every_slo(mixed):
    # good: #1 (ttft 100, tpot 25) and #4 (ttft 50, one token so tpot 0); #2 has ttft 200
    assert summarize(mixed, good_request({"ttft_ms": 150, "tpot_ms": 30})).request_goodput == 1.0
    assert summarize(mixed, good_request({"ttft_ms": 150, "tpot_ms": 20})).request_goodput == 0.5
    assert summarize(mixed, good_request({"e2el_ms": 240})).request_goodput == 1.5
    assert summarize(mixed).request_goodput is None


def test_goodputs_keys_are_the_slo_vocabularys():
    """`servetune bench --goodput` takes vLLM's keys for the latencies slo.py names, and nothing else."""
    assert GOODPUT_KEYS == ("ttft_ms", "tpot_ms", "e2el_ms")
    assert parse_goodput({"ttft_ms": 500, "e2el_ms": 2000.0}) == {"ttft_ms": 500.0, "e2el_ms": 2000.0}
    with pytest.raises(ServetuneError, match="unknown metric 'ttft'; use ttft_ms, tpot_ms, e2el_ms"):
        parse_goodput({"ttft": 100})
    with pytest.raises(ServetuneError, match="itl_ms"):
        parse_goodput({"itl_ms": 100})
    for bad in (0, -1, True, "fast"):
        with pytest.raises(ServetuneError, match="is not a positive number of ms"):
            parse_goodput({"tpot_ms": bad})


def test_ttft_slope_over_prompt_length_separates_prefill_from_the_fixed_part():
    # TTFT = 20 ms (HTTP, scheduling: no growth with the prompt) + 0.05 ms per prompt token, +-1 ms alternating
    prompts = [64 + 8 * i for i in range(25)]
    s = summarize(level([rec(i, 10 * i, (10 * i + 20 + 0.05 * p + (-1) ** i,), tokens=1, prompt_tokens=p)
                         for i, p in enumerate(prompts)]))
    assert s.ttft_ms_per_prompt_token == pytest.approx(0.05, abs=0.003) and 0 < s.ttft_ms_per_prompt_token_se < 0.01
    # TTFT / prompt would read 3x that cost (the fixed 20 ms counted as prefill)
    assert s.mean_ttft_ms / (s.total_input_tokens / s.completed) > 3 * 0.05
    # prompts all of one length, or fewer than 3 requests: no slope to measure
    same = summarize(level([rec(i, 10 * i, (10 * i + 20 + i,), tokens=1, prompt_tokens=100) for i in range(5)]))
    few = summarize(level([rec(i, 10 * i, (10 * i + 20,), tokens=1, prompt_tokens=100 + i) for i in range(2)]))
    assert same.ttft_ms_per_prompt_token is None is few.ttft_ms_per_prompt_token is few.ttft_ms_per_prompt_token_se


def test_no_successful_request_gives_zeros():
    s = summarize(level([rec(0, 0, (), 5, error="connect: refused")]))
    assert (s.completed, s.failed, s.mean_ttft_ms, s.p99_e2el_ms) == (0, 1, 0.0, 0.0)
    assert s.errors == {"connect": 1} and s.steady_request_rate is None

"""Level verdicts by statistics: known counts over the SLO give pass / fail / undecided at the stated confidence,
the whole sequence of looks keeps its error rates, ITL's correlated gaps widen the bounds, and requests count
in send order (synthetic records in integer ns, no server)."""

import math

import numpy as np

from servetune.loadgen.records import RequestRecord
from servetune.measure.verdict import (RAMP_SAMPLE, Boundaries, Decision, LevelTest, binomial_cdf, clopper_pearson,
                               itl_bounds, passes)

MS = 1_000_000


def record(index: int, ttft_ms: float = 10.0, gaps_ms: list[float] | None = None, error: str | None = None,
           every_ms: int = 100) -> RequestRecord:
    """A request sent at index x `every_ms`: first token after `ttft_ms`, then tokens `gaps_ms` apart (8 of 5 ms).
    Its end-to-end latency (45 ms by default) is under `every_ms`: a level of them fills up after the first."""
    start = index * every_ms * MS
    chunks = [start + round(ttft_ms * MS)]
    for gap in gaps_ms if gaps_ms is not None else [5.0] * 7:
        chunks.append(chunks[-1] + round(gap * MS))
    return RequestRecord(index=index, prompt_len=10, expected_output_len=len(chunks), warmup=False, scheduled_ns=start,
                         start_ns=start, chunk_ns=chunks, end_ns=chunks[-1], output_tokens=len(chunks), error=error,
                         http_status=200 if error is None else 500)


def test_binomial_tail_and_clopper_pearson_bounds_match_their_closed_forms():
    assert math.isclose(binomial_cdf(0, 299, 0.01), 0.99 ** 299)
    assert math.isclose(binomial_cdf(2, 40, 0.01), sum(math.comb(40, k) * 0.01**k * 0.99 ** (40 - k) for k in range(3)))
    low, high = clopper_pearson(0, 299, 0.95)
    assert low == 0.0 and math.isclose(high, 1 - 0.05 ** (1 / 299), rel_tol=1e-6)  # just under 1%
    low, high = clopper_pearson(3, 40, 0.95)
    assert low > 0.01  # 3 of 40 over already refutes a p99 at 95%
    assert math.isclose(binomial_cdf(2, 40, low), 0.95, rel_tol=1e-6)


def test_known_counts_pass_fail_or_stay_undecided():
    # the pass side is one look at the end of the level, at the stated 95%
    assert passes(0, 299, 0.95) and not passes(0, 298, 0.95)  # 298 requests cannot show a p99 at 95%
    assert not passes(1, 299, 0.95) and passes(1, 473, 0.95) and passes(2, 628, 0.95)
    # the fail side looks after every request; a single look would fail 3 of 40
    single = Boundaries(first=40, cap=40, alpha=0.05)
    assert single.fail_confidence == 0.95 and single.fails(3, 40) and not single.fails(2, 40)


def test_the_fail_looks_together_keep_their_error_rate():
    b = Boundaries(first=40, cap=600, alpha=0.05)
    # more looks than one: each look is stricter than 95% so that all of them together are not
    assert b.fail_confidence > 0.95 and b._fail_error(b.fail_min) <= 0.05
    assert b._fail_error(b._fail_min(0.05)) > 0.05  # a plain 95% at every look would fail too often
    assert b.fails(4, 50) and not b.fails(3, 50)
    # the same by simulation: a server exactly at the SLO (1% over) fails <= 5% of its levels
    rng = np.random.default_rng(0)
    wrong = sum(any(b.fails(int(k), n) for n, k in enumerate(np.cumsum(rng.random(600) < 0.01), start=1))
                for _ in range(400))
    assert wrong / 400 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 400)


def test_a_level_passes_only_at_its_end_and_fails_as_soon_as_it_shows():
    test = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=400)
    for i in range(400):
        assert test.add(record(i)) == Decision.UNDECIDED  # however clean, no pass before the level's end
    assert test.finish() == Decision.PASS and test.skipped == 1  # the first request was the fill
    t = test.tests["ttft_p99_ms"]
    assert (t.over, t.counted, t.requests) == (0, 399, 399) and t.high <= 0.01
    short = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=400)
    for i in range(250):  # stopped early (a deadline): 249 clean requests cannot show a p99
        short.add(record(i))
    assert short.finish() == Decision.UNDECIDED


def test_the_requests_sent_while_a_level_fills_up_are_not_counted():
    # one every 10 ms; the first 5 are the level's only slow ones (95 ms end to end, the rest 45), which puts the
    # p90 of the first 20 at 95 ms: the 10 requests due in those 95 ms are the fill, and without them it passes
    test = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=600)
    for i in range(600):
        test.add(record(i, ttft_ms=60.0 if i < 5 else 10.0, every_ms=10))
    assert test.finish() == Decision.PASS and test.fill_end_ns == 95 * MS and test.skipped == 10
    assert test.tests["ttft_p99_ms"].over == 0


def test_a_level_fails_early_on_slow_requests_and_at_once_on_an_error():
    test = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=600)
    for i in range(60):
        if test.add(record(i, ttft_ms=80.0 if i % 10 == 5 else 10.0)) != Decision.UNDECIDED:
            break
    # 10% over: the fail side looks from FIRST_FAIL_LOOK counted requests, below the 40 a pass rests on
    assert test.decision == Decision.FAIL and test.tests["ttft_p99_ms"].over == 3 and test.requests < 30
    assert test.tests["ttft_p99_ms"].low > 0.01
    mostly = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=600)
    for i in range(60):
        if mostly.add(record(i, ttft_ms=80.0)) != Decision.UNDECIDED:
            break
    # all over: decided as soon as the fill is known (from the first RAMP_SAMPLE requests), not at the 40th
    assert mostly.decision == Decision.FAIL and mostly.requests < RAMP_SAMPLE
    failing = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=600)
    assert failing.add(record(0, error="http_500: boom")) == Decision.FAIL


def test_requests_count_in_send_order_so_a_slow_one_in_flight_holds_back_the_verdict():
    test = LevelTest({"e2el_p99_ms": 100.0}, first=40, cap=400)
    for i in [*range(5), *range(6, 346)]:  # request 5 (the slow one) has not finished yet
        test.add(record(i))
    assert test.decision == Decision.UNDECIDED and test.requests == 0  # nothing counts past it
    test.add(record(5, ttft_ms=500.0))  # it arrives, over the bound: 1 of 345 does not show a p99
    assert test.requests == 345 and test.tests["e2el_p99_ms"].over == 1 and test.finish() == Decision.UNDECIDED


def test_the_warm_up_requests_are_not_counted():
    test = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=400, first_index=8)
    for i in range(8, 8 + 300):
        test.add(record(i))
    assert test.finish() == Decision.PASS and test.requests == 299 and test.skipped == 1


def test_an_undecided_level_at_its_end_stays_undecided():
    test = LevelTest({"ttft_p99_ms": 50.0}, first=40, cap=400)
    for i in range(400):
        test.add(record(i, ttft_ms=80.0 if i == 7 else 10.0))  # 1 of 400: under 1%, not shown at 95%
    assert test.finish() == Decision.UNDECIDED


def test_itl_bounds_count_a_requests_gaps_together():
    # 300 requests of 30 gaps; 3 requests have every gap slow (90 of 9,000 gaps, exactly 1%): as independent
    # gaps the binomial bound is tight, but they come from 3 requests, and the cluster-robust bound says so
    gaps = [[5.0] * 30 for _ in range(297)] + [[50.0] * 30 for _ in range(3)]
    over, counted, low, high = itl_bounds(gaps, 30.0, 0.95)
    assert (over, counted) == (90, 9000)
    binomial_low, binomial_high = clopper_pearson(90, 9000, 0.95)
    assert high > binomial_high + 0.005 and low < binomial_low
    # the same 1% spread over 90 requests (one slow gap each) is close to independent gaps
    spread = [[5.0] * 29 + [50.0] for _ in range(90)] + [[5.0] * 30 for _ in range(210)]
    _, _, _, spread_high = itl_bounds(spread, 30.0, 0.95)
    assert spread_high < high


def test_an_itl_slo_passes_only_when_enough_gaps_are_clear_and_fails_on_a_stall_pattern():
    quiet = LevelTest({"itl_p99_ms": 30.0}, first=40, cap=100)
    for i in range(100):
        quiet.add(record(i))
    assert quiet.finish() == Decision.PASS and quiet.tests["itl_p99_ms"].counted == 99 * 7  # gaps, not requests
    stalled = LevelTest({"itl_p99_ms": 30.0}, first=40, cap=400)
    for i in range(400):
        gaps = [5.0] * 6 + [60.0] if i % 4 == 0 else [5.0] * 7  # a stall in every fourth reply: 3.6% of gaps
        if stalled.add(record(i, gaps_ms=gaps)) != Decision.UNDECIDED:
            break
    assert stalled.decision == Decision.FAIL

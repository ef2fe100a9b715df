"""The server's latency histograms: read from a Prometheus text exposition, differenced between two scrapes, and
their quantiles estimated from the buckets; each expected value is worked out by hand in the comments."""

import pytest

from servetune.engine.histograms import Histogram, Quantile, parse, since

BOUNDS = ("0.1", "0.25", "0.5", "1.0", "+Inf")


def exposition(family: str, engines: dict[str, tuple[list[int], float]], kind: str = "histogram") -> str:
    """A Prometheus text exposition of `family` with one label set per engine: (cumulative counts at BOUNDS, sum)."""
    lines = [f"# HELP {family} latency", f"# TYPE {family} {kind}"]
    for engine, (counts, total) in engines.items():
        labels = f'engine="{engine}",model_name="tiny"'
        lines += [f'{family}_bucket{{{labels},le="{le}"}} {n}' for le, n in zip(BOUNDS, counts)]
        lines += [f"{family}_count{{{labels}}} {counts[-1]}", f"{family}_sum{{{labels}}} {total}"]
    return "\n".join(lines) + "\n"


GAUGE = "# HELP vllm:num_requests_running running\n# TYPE vllm:num_requests_running gauge\n" \
        'vllm:num_requests_running{engine="0",model_name="tiny"} 7.0\n'
TTFT = "vllm:time_to_first_token_seconds"


def test_two_scrapes_give_the_runs_counts_summed_over_engines():
    before = parse(GAUGE + exposition(TTFT, {"0": ([2, 2, 3, 3, 3], 0.5)}))
    after = parse(GAUGE + exposition(TTFT, {"0": ([32, 52, 63, 65, 65], 8.5), "1": ([10, 30, 36, 37, 38], 7.0)}))
    run = since(before, after)["ttft"]
    # after, summed: 42, 82, 99, 102, 103 (sum 15.5 s); less before's 2, 2, 3, 3, 3 (0.5 s)
    assert run == Histogram(family=TTFT, bounds_s=(0.1, 0.25, 0.5, 1.0), cumulative=(40, 80, 96, 99), count=100,
                            sum_s=15.0)
    assert run.mean_ms == pytest.approx(150.0)  # 15 s / 100


def test_quantiles_are_linear_inside_the_bucket_with_the_range_the_sample_quantile_lies_in():
    run = Histogram(family=TTFT, bounds_s=(0.1, 0.25, 0.5, 1.0), cumulative=(40, 80, 96, 99), count=100, sum_s=15.0)
    # p50: rank 50 lies in (0.1, 0.25] (40 < 50 <= 80): 0.1 + 0.15 x (50 - 40) / (80 - 40) = 0.1375 s; the sample
    # median interpolates the 50th and 51st of 100 (0.5 x 99 = 49.5), both in that bucket
    assert run.quantile(0.5).model_dump() == {"estimate_ms": pytest.approx(137.5), "low_ms": 100.0, "high_ms": 250.0}
    # p90: rank 90 in (0.25, 0.5] (80 < 90 <= 96): 0.25 + 0.25 x 10 / 16 = 0.40625 s; the 90th and 91st there too
    assert run.quantile(0.9).model_dump() == {"estimate_ms": pytest.approx(406.25), "low_ms": 250.0, "high_ms": 500.0}
    # p99: rank 99 in (0.5, 1.0] (96 < 99 <= 99): 0.5 + 0.5 x 3 / 3 = 1.0 s; 0.99 x 99 = 98.01: between the 99th
    # (in (0.5, 1.0]) and the 100th, which lies above the last finite bound: no upper end
    assert run.quantile(0.99) == Quantile(estimate_ms=1000.0, low_ms=500.0, high_ms=None)


def test_a_quantile_in_the_inf_bucket_is_the_last_finite_bound_and_nothing_counted_has_none():
    run = Histogram(family="itl", bounds_s=(0.01,), cumulative=(10,), count=20, sum_s=1.0)
    # p90: rank 18 > 10: the +Inf bucket; Prometheus answers its lower end, 10 ms; the 18th and 19th of 20 lie there
    assert run.quantile(0.9) == Quantile(estimate_ms=10.0, low_ms=10.0, high_ms=None)
    assert run.model_copy(update={"cumulative": (0,), "count": 0, "sum_s": 0.0}).quantile(0.5) is None


def test_older_vllms_per_step_histogram_is_read_as_itl_and_other_families_are_left_out():
    text = exposition("vllm:time_per_output_token_seconds", {"0": ([1, 2, 3, 4, 5], 0.9)}) + exposition(
        "vllm:request_prompt_tokens", {"0": ([1, 1, 1, 1, 1], 100.0)})
    assert list(parse(text)) == ["itl"]
    assert parse(text)["itl"].family == "vllm:time_per_output_token_seconds"


def test_scrapes_of_different_buckets_do_not_difference():
    one = Histogram(family=TTFT, bounds_s=(0.1,), cumulative=(1,), count=1, sum_s=0.05)
    with pytest.raises(ValueError, match="buckets changed"):
        one.since(one.model_copy(update={"bounds_s": (0.2,)}))


@pytest.mark.parametrize(("value_ms", "holds"), [
    (89.0, False), (91.0, True), (250.0, True), (274.0, True), (276.0, False),  # 100 - max(10, 10) .. 250 + 25
])
def test_a_client_value_holds_inside_the_range_give_or_take_its_own_path(value_ms, holds):
    assert Quantile(estimate_ms=137.5, low_ms=100.0, high_ms=250.0).holds(value_ms) is holds


def test_a_small_range_allows_the_clients_10_ms():
    assert Quantile(estimate_ms=30.0, low_ms=20.0, high_ms=40.0).holds(49.9)  # 40 + max(10, 4)
    assert not Quantile(estimate_ms=30.0, low_ms=20.0, high_ms=40.0).holds(50.1)
    assert Quantile(estimate_ms=1000.0, low_ms=500.0, high_ms=None).holds(1e6)

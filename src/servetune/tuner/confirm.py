"""The head-to-head: before a searched config is recommended over vLLM's defaults, the defaults must be shown to
fail at the pick's goodput rate, with the same statistical test as every search level.

The pick's own rate needs no second measurement: its highest passing level already holds its SLOs at the
stated confidence (`servetune.measure.verdict`), and that level is its confirmation. What remains is whether the
defaults fail where the pick holds. Where their own search failed at a rate at or below the pick's, it has
shown that (latency grows with load: the rate search rests on the same order), and nothing runs (method
`search`). Otherwise the defaults are launched again and one level at the pick's rate decides (method
`head-to-head`). The pick stands when the defaults fail there. When they hold it too, they are recommended at
that rate (it is theirs now, as soundly measured); when their level stays undecided, or the head-to-head could
not run, the pick is recommended at its own rate and the record says the gain is not shown.
"""

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from servetune.executors import Job
from servetune.measure.slo import latency
from servetune.measure.verdict import Decision
from servetune.study.outcome import LevelOutcome, TrialOutcome
from servetune.study.record import HeadToHead, HeadToHeadMethod, HeadToHeadVerdict, LevelRecord, Role
from servetune.study.results import TrialRow
from servetune.timelimit import TrialTime
from servetune.trial.hooks import Hooks
from servetune.trial.run import Latency, TrialPlan
from servetune.tuner.dispatch import Dispatch
from servetune.workload import RateUnit

HEAD_TO_HEAD_SEED = 1_000  # arrival order of the head-to-head level, apart from the search's seeds


def candidates_of(rows: list[TrialRow], default: TrialRow | None,
                  significant: Callable[[TrialRow, TrialRow], bool]) -> list[TrialRow]:
    """Measured configs that beat the defaults in the search beyond resolution, best first."""
    if default is None:
        return []
    ok = [r for r in rows if r.ok and r.role != Role.DEFAULT and r.value is not None and math.isfinite(r.value)
          and significant(r, default)]
    return sorted(ok, key=lambda r: r.value or 0.0, reverse=True)


def head_to_head_job(default: TrialRow, rate: float, plan: TrialPlan, level_set: list, out: Path,
                     trial_time: TrialTime | None, latency: Latency) -> Job:
    """The defaults at `rate`: one level with a fresh prompt set (`level_set`, warm-up requests included), its fill
    and tail sized on `latency` (the pick's at that rate)."""
    plan = replace(plan, level_sets=[level_set], fixed_levels=[(rate, HEAD_TO_HEAD_SEED)], latency=latency)
    return Job(default.trial, default.config, plan, out / "confirm" / "default", trial_time)


def level_record(level: LevelOutcome, trial: int | None = None) -> LevelRecord:
    """What the summary keeps of a level that decided a verdict (the pick's: with its trial)."""
    fields = {} if trial is None else {"trial": trial}
    return LevelRecord(**fields, rate=level.rate, verdict=str(level.verdict), reasons=level.reasons,
                       requests=level.metrics.completed, tests=level.tests,
                       p99={t.slo: latency(t.slo).p99(level.metrics) for t in level.tests})


def deciding_level(outcome: TrialOutcome, rate: float | None) -> LevelOutcome | None:
    """The passing search level that gave a trial its goodput rate."""
    return next((lv for lv in outcome.levels if lv.passed and lv.rate == rate), None)


def failed_at_or_below(outcome: TrialOutcome, rate: float) -> LevelOutcome | None:
    """The defaults' own level that failed at the highest rate at or below `rate`, if any: a load that failed
    there fails at `rate` too."""
    failed = [lv for lv in outcome.levels if lv.verdict == Decision.FAIL and math.isfinite(lv.rate) and lv.rate <= rate]
    return max(failed, key=lambda lv: lv.rate, default=None)


def decide(pick: TrialRow | None, default: TrialRow, level: LevelOutcome | None, pick_level: LevelOutcome | None,
           rate_unit: RateUnit = RateUnit.REQUESTS_PER_S, *,
           method: HeadToHeadMethod = HeadToHeadMethod.HEAD_TO_HEAD,
           missing: str | None = None) -> HeadToHead:
    """The recommendation from the search rows (`pick`: the best candidate, None when none beat the defaults) and
    the defaults' level that decides it (`level`: their own search's failure at or below the pick's rate, method
    `search`, or the head-to-head's level, method `head-to-head`; None: not measured, `missing` says why), its
    reason in the study's `rate_unit`."""
    base = default.goodput_rate
    if pick is None:
        return HeadToHead(method=method, pick=None, head_to_head=None, verdict=HeadToHeadVerdict.DEFAULTS,
                          recommended_trial=default.trial, recommended_goodput_rate=base,
                          default_goodput_rate=base, reason="no searched config beat them")
    rate = pick.goodput_rate
    decided = HeadToHead(
        method=method,
        pick=level_record(pick_level, pick.trial) if pick_level else LevelRecord(trial=pick.trial, rate=rate),
        head_to_head=level_record(level) if level is not None else None, verdict=HeadToHeadVerdict.NOT_RUN,
        recommended_trial=pick.trial, recommended_goodput_rate=rate, default_goodput_rate=base, reason="")
    name = f"trial {pick.trial}"
    if level is None:
        return decided.model_copy(update={
            "reason": f"{name} holds {rate:.2f} {rate_unit}; the defaults were not measured at that rate"
                      + (f" ({missing})" if missing else "")})
    why = "; ".join(level.reasons[:2])
    if level.verdict == Decision.FAIL:
        where = (f"at {rate:.2f} {rate_unit}" if method == HeadToHeadMethod.HEAD_TO_HEAD
                 else f"at {level.rate:.2f} {rate_unit} in their own search, at or below {name}'s {rate:.2f}")
        return decided.model_copy(update={"verdict": HeadToHeadVerdict.CONFIRMED,
                                          "reason": f"the defaults fail {where} ({why})"})
    if level.verdict == Decision.PASS:
        return decided.model_copy(update={
            "verdict": HeadToHeadVerdict.NOT_CONFIRMED, "recommended_trial": default.trial,
            "default_goodput_rate": rate,
            "reason": f"the defaults hold {rate:.2f} {rate_unit} too, where {name} holds it: keep the defaults"})
    return decided.model_copy(update={
        "verdict": HeadToHeadVerdict.UNDECIDED,
        "reason": f"{name} holds {rate:.2f} {rate_unit}; at that rate the defaults were undecided ({why}): the gain "
                  "is not shown"})


def run_head_to_head(job: Job, running: Dispatch, hooks: Hooks) -> TrialOutcome:
    """Run the head-to-head job (the search is over: a slot is free), again when its worker is lost, as a search
    trial is (`Dispatch.wait` gives up after a few in a row)."""
    hooks.confirm_started(job.number, job.config, [rate for rate, _ in job.plan.fixed_levels])
    while True:
        if not running.submit(job, job):
            raise RuntimeError(f"the executor took no head-to-head with nothing else running: {job.config}")
        for finished in running.wait():
            if finished.outcome is not None:
                hooks.confirm_finished(job.number, finished.outcome)
                return finished.outcome
            assert finished.lost is not None  # no outcome: why the worker was lost
            hooks.confirm_lost(job.number, finished.lost)

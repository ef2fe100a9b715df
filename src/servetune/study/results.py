"""What a study recommends, read once into one typed object (`Results`): a row per measured trial, the trials never
measured, and the summary (the best config against vLLM's defaults, or the head-to-head's pick; the rate it holds;
where the budget went). Every output reads that object: the files a user runs and reads here (best.yaml,
best_command.sh, trials.csv, summary.json), the report's page and exports (`servetune.report`), the CLI's lines.
Depends only on the study's record (`servetune.study.record`)."""

import csv
import io
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from servetune.engine import serve_command
from servetune.engine.args import CPU_KVCACHE_SPACE, to_argv
from servetune.engine.roofline import cost_per_million_tokens, gpus_of
from servetune.jsonio import write_atomic, write_json
from servetune.measure.slo import Objective, Slos, headline_latencies, parse_slo
from servetune.study.limits import NO_LIMIT, Limit, Limits, Roofline
from servetune.study.outcome import LevelOutcome, TrialStatus, headline_level, said_at
from servetune.study.record import (
    HeadToHead,
    Progress,
    RecordedTrial,
    Role,
    StudyMeta,
    StudyRecord,
    TrialRole,
    TuneState,
)
from servetune.timelimit import duration
from servetune.workload import RateUnit
from servetune.workload.fit import refused_beyond


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TrialRow(_Frozen):
    """A measured trial: one row of trials.csv (its dump) and of the report's table; `params`, `levels` and
    `log_path` (a failed trial's server log) are what the report draws beside it, not columns."""

    trial: int
    role: TrialRole
    status: TrialStatus
    config: dict[str, Any]  # as launched
    goodput_rate: float | None
    goodput_bracket: list[float | None] | None  # the search's highest passed and lowest not passed (None: none) rates
    request_throughput: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    slo_p99: dict[str, float | None]  # the p99 (ms) of each latency the SLOs bound, keyed as `slo` (headline level)
    preemptions: float | None
    kv_cache_tokens: int | None
    ready_s: float | None
    failure: str | None
    rejected_requests: int | None
    why: str | None
    value: float | None  # the objective's value told to the study (None unless it completed)
    limit: Limit = NO_LIMIT  # against its devices' limit (`study.limits`): columns of their own in trials.csv
    params: dict[str, Any] = Field(default={}, exclude=True)  # the searched knobs' values
    levels: list[LevelOutcome] = Field(default=[], exclude=True)
    log_path: str | None = Field(default=None, exclude=True)
    model_len_reason: str | None = Field(default=None, exclude=True)

    @property
    def ok(self) -> bool:
        return self.status == TrialStatus.OK

    def rate(self, objective: Objective) -> float | None:
        """The objective's rate: the goodput rate, or the throughput at full load."""
        return self.goodput_rate if objective == Objective.GOODPUT else self.request_throughput

    @property
    def headline_level(self) -> LevelOutcome | None:
        """The level its p99s come from (`outcome.headline_level`)."""
        return headline_level(self.levels)

    @property
    def said_above(self) -> str | None:
        """What its levels said of the upper end of its goodput bracket (`outcome.said_at`); None without one."""
        high = self.goodput_bracket[1] if self.goodput_bracket else None
        return said_at(self.levels, high) if high is not None else None


def trial_row(t: RecordedTrial, slo: Slos, out_dir: Path | None = None, limits: Limits | None = None) -> TrialRow:
    """A measured trial's row, with the p99s of the latencies `slo` bounds; `out_dir`: the study's output directory,
    for the path of a failed trial's log; `limits`: the study's roofline, to place the config against."""
    out = t.outcome
    assert out is not None  # a measured trial's
    startup = out.startup
    log = out.failure.log if out.failure else None
    headline = headline_level(out.levels)
    return TrialRow(
        trial=t.number, role=t.record.role, status=out.status, config=out.config, goodput_rate=out.goodput_rate,
        goodput_bracket=list(out.goodput_bracket) if out.goodput_bracket else None,
        request_throughput=out.request_throughput, p99_ttft_ms=out.p99_ttft_ms, p99_tpot_ms=out.p99_tpot_ms,
        slo_p99={lat.slo: lat.p99(headline.metrics) if headline else None for lat in headline_latencies(slo)},
        preemptions=out.preemptions, kv_cache_tokens=startup.kv_cache_tokens if startup else None,
        ready_s=startup.ready_s if startup else None, failure=str(out.failure) if out.failure else None,
        rejected_requests=out.rejected_requests, why=t.record.why, value=t.objective_value,
        limit=limits.of(out.config, startup.kv_cache_tokens if startup else None, out.goodput_rate, out.levels)
        if limits else NO_LIMIT, params=t.params,
        levels=out.levels, log_path=str(out_dir / (out.artifacts or "") / log) if log and out_dir else None,
        model_len_reason=t.record.model_len_reason)


class Unmeasured(_Frozen):
    """A trial that never ran a server: skipped (infeasible or a duplicate), interrupted, or still pending."""

    trial: int
    role: TrialRole
    params: dict[str, Any]
    reason: str


def unmeasured(trials: list[RecordedTrial]) -> list[Unmeasured]:
    result = []
    for t in trials:
        if t.measured:
            continue
        reason = (t.record.skipped if t.record.skipped is not None else "interrupted; queued again"
                  if t.record.interrupted else t.state.name.lower())
        result.append(Unmeasured(trial=t.number, role=t.record.role, params=t.params, reason=reason))
    return result


class BudgetEntry(_Frozen):
    """A proposal, launched or skipped: why it was proposed, and what it measured or why it was never launched."""

    trial: int
    launched: bool
    why: str | None
    config: dict[str, Any]
    result: str


def budget_spent(trials: list[RecordedTrial]) -> list[BudgetEntry]:
    """Where the budget went and why: every launched trial (why it was proposed, what it measured) and every
    proposal skipped before launching (why), in order."""
    entries = []
    for t in trials:
        if t.record.skipped is not None:
            entries.append(BudgetEntry(trial=t.number, launched=False, why=t.record.why or "TPE's proposal",
                                       config=t.params, result=f"skipped: {t.record.skipped}"))
        elif (out := t.outcome) is not None:
            entries.append(BudgetEntry(trial=t.number, launched=True, why=t.record.why, config=out.config,
                                       result=out.describe()))
    return entries


class SummaryEntry(_Frozen):
    """vLLM's defaults or the recommended config in summary.json."""

    config: dict[str, Any]
    goodput_rate: float | None
    request_throughput: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    slo_p99: dict[str, float | None]  # the p99 (ms) of each latency the SLOs bound, keyed as `slo`
    trial: int
    goodput_bracket: list[float | None] | None
    limit: Limit = NO_LIMIT  # its own goodput rate's (the head-to-head's decided rates: `Summary.limit_line`)

    @classmethod
    def of(cls, row: TrialRow | None) -> "SummaryEntry | None":
        return None if row is None else cls(**row.model_dump(include=set(cls.model_fields)))

    def rate(self, objective: Objective) -> float | None:
        return self.goodput_rate if objective == Objective.GOODPUT else self.request_throughput


class Headroom(_Frozen):
    """What a config launched with a max-model-len below the model's context refuses."""

    max_model_len: int
    context: int | None
    reason: str
    comment: str  # best.yaml's, best_command.sh's and the report's


def beats(row: TrialRow, default: TrialRow, objective: Objective) -> bool:
    """Whether a measured row beats the default's beyond the measurement's resolution: for goodput, it holds a rate
    at or above the lowest rate the defaults did not pass (their brackets do not overlap; where every rate they were
    measured at passed, 5% above their highest), or any rate where the defaults hold none; for throughput, by more
    than 5%."""
    if objective == Objective.GOODPUT:
        if not row.goodput_rate:
            return False
        return not default.goodput_rate or row.goodput_rate >= not_passed(default)
    return (row.request_throughput or 0.0) > 1.05 * (default.request_throughput or 0.0)


def not_passed(row: "TrialRow | SummaryEntry") -> float:
    """The lowest rate a config's search did not pass, or 5% above its goodput rate where it passed every rate it
    measured (that is where a rate would first count as higher than its own)."""
    bracket = row.goodput_bracket
    if bracket and bracket[1] is not None:
        return bracket[1]
    return 1.05 * (row.goodput_rate or 0.0)


def choose_best(rows: list[TrialRow], objective: Objective) -> tuple[TrialRow | None, TrialRow | None, bool]:
    """(default, best, significant). The best must beat the default (`beats`); otherwise the default is
    recommended."""
    ok = [r for r in rows if r.ok]
    default = next((r for r in ok if r.role == Role.DEFAULT), None)
    best = max(ok, key=lambda r: r.value or 0.0, default=None)
    if best is None or default is None or best is default:
        return default, best or default, False
    significant = beats(best, default, objective)
    return default, best if significant else default, significant


def vllm_config_yaml(model: str, config: dict, comment: str | None = None) -> str:
    """A file `vllm serve --config` accepts: kebab-case flag names, as launched; `comment` on top."""
    flags: dict[str, Any] = {"model": model}
    for key, value in config.items():
        if key != CPU_KVCACHE_SPACE and value is not None:
            flags[key.replace("_", "-")] = value
    return (f"# {comment}\n" if comment else "") + yaml.safe_dump(flags, sort_keys=False)


def headroom(meta: StudyMeta, config: dict, reason: str | None) -> Headroom | None:
    """What a config launched with a max-model-len below the model's context refuses (summary.json
    `headroom`): its max-model-len, the context, why it was tightened (`reason`, the trial's
    `model_len_reason`) and the comment best.yaml and the report carry. None when the config launches with
    the model's context (no max-model-len, or one at least the context)."""
    mml = config.get("max_model_len")
    context = meta.context
    if mml is None or (context and mml >= context):
        return None
    why = reason or "sized to the workload's longest request"
    refused = refused_beyond(mml, meta.max_chars_per_token, meta.vllm_version)
    known = f"the model's context is {context}" if context else "the model's context is unknown"
    return Headroom(max_model_len=mml, context=context or None, reason=why,
                    comment=f"max-model-len {mml} ({known}; tightened because {why}): {refused}")


class TimeSpent(_Frozen):
    """How a tune's time went (s): launching servers (to ready, or to failing), load levels (and stopping), the
    head-to-head, the rest (proposing, writing outputs, waiting), and what was left of the time limit. Trials run
    in parallel add up to more than the time that passed."""

    elapsed_s: float
    launches_s: float
    levels_s: float
    head_to_head_s: float
    other_s: float
    unused_s: float | None  # None: no time limit
    next_trial_s: float | None = None  # the least another trial needed (a launch, a deciding level); None unless the
    # time limit left trials of the budget unlaunched
    more_s: float | None = None  # what the time limit left undone needed (its cut levels, trials not launched)

    def __str__(self) -> str:
        of = f" of {duration(self.elapsed_s + self.unused_s)}" if self.unused_s is not None else ""
        unused = f"; {duration(self.unused_s)} unused" if self.unused_s is not None else ""
        if self.unused_s and self.next_trial_s:
            unused += f" (a trial needed ~{duration(self.next_trial_s)})"
        h2h = f", head-to-head {duration(self.head_to_head_s)}" if self.head_to_head_s >= 0.5 else ""
        return (f"{duration(self.elapsed_s)}{of}: launches {duration(self.launches_s)}, load levels "
                f"{duration(self.levels_s)}{h2h}, other {duration(self.other_s)}{unused}")


class Summary(_Frozen):
    """The study's recommendation (summary.json): the tune's state, the defaults and the best config (the
    head-to-head's recommendation when there was one), whether and by how much it beats them, the rate it
    holds, where the budget went, what was not done, and in a sentence or two what to run (`answer`)."""

    state: TuneState
    not_done: list[str]
    time_limit_s: float | None
    elapsed_s: float | None
    objective: Objective
    slo: dict[str, int | float]
    confidence: float | None  # of each level's verdict (None: point p99s, before statistical verdicts)
    rate_unit: RateUnit
    default: SummaryEntry | None
    best: SummaryEntry | None
    best_beats_default: bool
    gain: float | None
    confirmation: HeadToHead | None
    budget: list[BudgetEntry]
    trials: int
    failed: int
    skipped: int
    model: str
    strategy: str
    vllm_version: str
    device: str
    best_command: str | None = None  # with a best config only, as `headroom`
    headroom: Headroom | None = None
    time: TimeSpent | None = None
    roofline: Roofline | None = None
    answer: str = ""

    @model_serializer(mode="wrap")
    def _without_a_best_no_command(self, handler) -> dict[str, Any]:
        """As summary.json has always had it: `best_command` and `headroom` only where there is a best config."""
        data = handler(self)
        return data if self.best is not None else {k: v for k, v in data.items()
                                                   if k not in ("best_command", "headroom")}

    @property
    def slos(self) -> Slos:
        """The SLOs, parsed."""
        return parse_slo(self.slo)

    @property
    def recommended_rate(self) -> float | None:
        """The rate the recommendation holds: the head-to-head's, else the best config's own."""
        if self.best is None:
            return None
        decided = self._head_to_head()
        return decided.recommended_goodput_rate if decided else self.best.rate(self.objective)

    @property
    def default_rate(self) -> float | None:
        """The rate vLLM's defaults hold, decided as the recommendation's: the head-to-head's, else their own."""
        if self.default is None:
            return None
        decided = self._head_to_head()
        return decided.default_goodput_rate if decided else self.default.rate(self.objective)

    @property
    def limit_line(self) -> str:
        """Where the answer stands against its devices' limit and what it costs, in a sentence ('' with no roofline):
        at the decided rates, as the answer states them."""
        roofline = self.roofline
        if roofline is None:
            return ""
        rows = [(name, entry, rate) for name, entry, rate in (("vLLM's defaults", self.default, self.default_rate),
                                                              ("the pick", self.best, self.recommended_rate))
                if entry is not None and (name == "vLLM's defaults" or self.best_beats_default)]
        text = ""
        if roofline.accelerator is None:
            text = f"Roofline: {roofline.note}."
        elif shares := [_share(name, e.limit, rate, self.rate_unit) for name, e, rate in rows if e.limit.bound_rate]:
            text = f"Against the SLO-aware roofline of {roofline.accelerator}: {'; '.join(shares)}."
        if roofline.gpu_hour_price is not None and roofline.work:
            output = roofline.work["output"]
            costs = [f"{name} ${cost:.2f}" for name, e, rate in rows if rate and (
                cost := cost_per_million_tokens(roofline.gpu_hour_price, gpus_of(e.config), rate * output))]
            if costs:
                text += (f" A million output tokens at ${roofline.gpu_hour_price:g} per GPU-hour: "
                         f"{', '.join(costs)}.")
        return text.strip()

    def _head_to_head(self) -> HeadToHead | None:
        """The confirmation whose rates are the decided ones: a goodput study's, made by a method (older studies
        kept a pooled record without one)."""
        confirmation = self.confirmation
        if self.objective == Objective.GOODPUT and confirmation is not None and confirmation.method is not None:
            return confirmation
        return None


def _share(name: str, limit: Limit, rate: float | None, unit: str) -> str:
    """Where one config stands against its bound: its decided rate's share, else its most measured tokens/s'."""
    bound = limit.bound_rate
    assert bound is not None  # `Summary.limit_line` asks only where there is a bound
    if rate:
        return f"{name} {rate / bound:.0%} of the {bound:.2f} {unit} it allows ({limit.limited_by})"
    if limit.output_tokens_per_s and limit.peak_tokens_per_s:
        return (f"{name} hold no rate (bound {bound:.2f} {unit}); their most, {limit.output_tokens_per_s:,.0f} "
                f"output tokens/s, is {limit.tokens_efficiency:.0%} of the {limit.peak_tokens_per_s:,.0f} it allows "
                f"without SLOs")
    return f"{name} hold no rate (bound {bound:.2f} {unit})"


def summarize(meta: StudyMeta, record: StudyRecord, trials: list[RecordedTrial], rows: list[TrialRow],
              roofline: Roofline | None = None) -> Summary:
    """The summary of a study (`Summary`) from its rows (`trial_row` of every measured trial) and its `roofline`."""
    default, best, significant = choose_best(rows, meta.objective)
    gain = (best.value / default.value - 1) if best and best.value and default and default.value else None
    confirmation = record.confirmation
    if confirmation is not None:  # the head-to-head's recommendation replaces the search's
        best = next((r for r in rows if r.trial == confirmation.recommended_trial), best)
        significant = confirmation.confirmed
        held, base = confirmation.recommended_goodput_rate, confirmation.default_goodput_rate
        gain = held / base - 1 if significant and held and base else (0.0 if best is default else None)
    progress = record.progress
    result = Summary(
        state=progress.state, not_done=progress.not_done, time_limit_s=progress.time_limit_s,
        elapsed_s=progress.elapsed_s, objective=meta.objective, slo=meta.slo, confidence=meta.confidence,
        rate_unit=meta.rate_unit, default=SummaryEntry.of(default), best=SummaryEntry.of(best),
        best_beats_default=significant, gain=gain, confirmation=confirmation, budget=budget_spent(trials),
        trials=len(rows), failed=sum(not r.ok for r in rows),
        skipped=sum(1 for t in trials if t.record.skipped is not None), model=meta.model, strategy=meta.strategy,
        vllm_version=meta.vllm_version, device=meta.device,
        best_command=serve_command(meta.model, best.config) if best is not None else None,
        headroom=headroom(meta, best.config, best.model_len_reason) if best is not None else None,
        time=time_spent(record, progress), roofline=roofline)
    return result.model_copy(update={"answer": answer(result, rows)})


def time_spent(record: StudyRecord, progress: Progress) -> "TimeSpent | None":
    """How the tune's time went (`TimeSpent`), from every launch's outcome and the head-to-head's; None before the
    tune wrote its progress."""
    elapsed_s, limit_s = progress.elapsed_s, progress.time_limit_s
    if elapsed_s is None:
        return None
    launches = levels = 0.0
    for out in record.launches():
        ready = out.startup.ready_s if out.startup and out.startup.ready_s is not None else None
        launches += ready if ready is not None else (out.wall_s or 0.0)
        levels += max(0.0, (out.wall_s or 0.0) - (ready or 0.0)) if ready is not None else 0.0
    head_to_head = (record.confirmation.wall_s or 0.0) if record.confirmation is not None else 0.0
    spent = launches + levels + head_to_head
    return TimeSpent(elapsed_s=elapsed_s, launches_s=round(launches, 1), levels_s=round(levels, 1),
                     head_to_head_s=round(head_to_head, 1), other_s=round(max(0.0, elapsed_s - spent), 1),
                     unused_s=round(max(0.0, limit_s - elapsed_s), 1) if limit_s is not None else None,
                     next_trial_s=progress.next_trial_s, more_s=progress.more_s)


def answer(summary: Summary, rows: list[TrialRow]) -> str:
    """What to run, in a sentence or two, whatever the study holds: the recommended config and the rate it holds
    (decided at a stated confidence), against vLLM's defaults; or what is known when no rate was decided, and
    what was not done. The CLI and the report both print it."""
    state = {TuneState.RUNNING: "So far: ", TuneState.INTERRUPTED: "Interrupted: ",
             TuneState.TIME_LIMIT: "At the time limit: "}.get(summary.state, "")
    not_done = f" Not done: {'; '.join(summary.not_done)}." if summary.not_done else ""
    ok = [r for r in rows if r.ok]
    if not rows:
        text = "nothing was measured yet."
    elif not ok:
        kinds = sorted({(r.failure or "failed").split(":")[0] for r in rows})
        text = f"no config ran: {_count(len(rows), 'launch')}, all failed ({', '.join(kinds)}); the table says why."
    elif summary.objective == Objective.GOODPUT:
        text = _goodput_answer(summary, rows)
    else:
        text = _throughput_answer(summary, rows)
    return _sentence(state, text) + not_done


def _goodput_answer(summary: Summary, rows: list[TrialRow]) -> str:
    best, default, unit, confirmation = summary.best, summary.default, summary.rate_unit, summary.confirmation
    rate = summary.recommended_rate
    if not rate:
        return _no_rate(summary, rows)
    assert best is not None  # a trial ran (`answer`), and holds the rate
    who = "vLLM's defaults" if default is not None and best.trial == default.trial else f"trial #{best.trial}'s config"
    how = (f"decided at {summary.confidence:.0%} confidence" if summary.confidence
           else "by its levels' p99s, before servetune's verdicts were statistical")
    holds = f"it holds {rate:.2f} {unit} within the SLOs ({how})"
    if confirmation is not None and confirmation.reason:
        return f"run {who}: {holds}; {confirmation.reason}."
    if default is None:
        return f"vLLM's defaults did not run; the best config that did is {who}: {holds}."
    if summary.best_beats_default:
        base = summary.default_rate
        than = (f"{summary.gain:+.0%} over their {base:.2f} {unit}" if summary.gain is not None and base
                else f"where they hold no rate{_down_to(default, unit)}")
        return f"trial #{best.trial} beats vLLM's defaults: {holds}, {than}, beyond the measured resolution."
    text = f"keep vLLM's defaults: {holds}."
    top = max((r for r in rows if r.ok), key=lambda r: r.value or 0.0)
    if top.trial != default.trial and top.value:
        text += (f" No config beat them beyond the measured resolution: the highest, trial #{top.trial}, measured "
                 f"{top.value:.2f} {unit}.")
    return text


def _no_rate(summary: Summary, rows: list[TrialRow]) -> str:
    """No config holds a decided rate: what the defaults and the others measured instead."""
    unit, default = summary.rate_unit, summary.default
    others = [r for r in rows if r.ok and (default is None or r.trial != default.trial)]
    if default is None:
        first = "vLLM's defaults did not run"
    elif default.goodput_bracket is None:
        first = "vLLM's defaults were not measured to a verdict (no level finished)"
    else:
        capacity = (f" (capacity {default.request_throughput:.2f} req/s at full load)"
                    if default.request_throughput else "")
        first = f"vLLM's defaults hold no rate{_down_to(default, unit)}{capacity}"
    if not others:
        rest = "no other config was measured"
    else:
        lost = [r for r in others if r.goodput_bracket is not None]
        rest = (f"none of {_count(len(others), 'other config')} held a rate" if lost
                else f"none of {_count(len(others), 'other config')} was measured to a verdict")
    more = summary.time.more_s if summary.state == TuneState.TIME_LIMIT and summary.time else None
    limit = summary.time_limit_s
    if more and limit:
        rest += f"; give it ~{math.ceil((limit + more) / 60)} minutes"
    return f"no rate decided: {first}; {rest}."


def _down_to(entry: "SummaryEntry", unit: str) -> str:
    """' down to X unit': the lowest rate a config was measured at and did not pass ('' when none)."""
    bracket = entry.goodput_bracket
    return f" down to {bracket[1]:.2f} {unit}" if bracket and bracket[1] and math.isfinite(bracket[1]) else ""


def _throughput_answer(summary: Summary, rows: list[TrialRow]) -> str:
    best, default = summary.best, summary.default
    assert best is not None  # a trial ran (`answer`)
    if not best.request_throughput:
        return "no throughput was measured: no capacity level finished a request."
    who = "vLLM's defaults" if default is not None and best.trial == default.trial else f"trial #{best.trial}'s config"
    holds = f"{best.request_throughput:.2f} req/s at full load"
    if default is None:
        return f"vLLM's defaults did not run; the best config that did is {who}: {holds}."
    if summary.best_beats_default:
        return (f"trial #{best.trial} beats vLLM's defaults: {holds}"
                + (f", {summary.gain:+.0%} over their {default.request_throughput:.2f} req/s"
                   if summary.gain is not None else "") + ", beyond the measured resolution.")
    return f"keep vLLM's defaults: {holds}."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 'es' if noun.endswith('h') else 's'}"


def _sentence(prefix: str, text: str) -> str:
    return prefix + text if prefix else text[0].upper() + text[1:]


class Results:
    """A study read once: its meta, a row per measured trial, the trials never measured and the summary. Every
    output reads it (`write_outputs`, `servetune.report`, the CLI)."""

    def __init__(self, record: StudyRecord):
        self.record = record
        self.meta = record.meta
        trials = record.trials()
        out_dir = Path(self.meta.out)
        limits = Limits(self.meta)
        self.rows = [trial_row(t, self.meta.slos, out_dir, limits) for t in trials if t.measured]
        self.unmeasured = unmeasured(trials)
        self.summary = summarize(self.meta, record, trials, self.rows, limits.roofline)


def write_outputs(results: Results, out: Path) -> None:
    """best.yaml, best_command.sh, trials.csv and summary.json under `out`, each written whole."""
    summary, rows = results.summary, results.rows
    if summary.best is not None:
        comment = summary.headroom.comment if summary.headroom else None
        write_atomic(out / "best.yaml", vllm_config_yaml(summary.model, summary.best.config, comment))
        note = f"# {comment}\n" if comment else ""
        write_atomic(out / "best_command.sh", f"#!/bin/sh\n# servetune: the best config found\n{note}exec "
                                              f"{summary.best_command}\n", mode=0o755)
    table = io.StringIO()
    nested = {"slo_p99", "limit"}
    columns = [name for name, field in TrialRow.model_fields.items() if not field.exclude and name not in nested]
    writer = csv.DictWriter(table, fieldnames=columns + list(Limit.model_fields) + list(rows[0].slo_p99) if rows
                            else ["trial"])
    writer.writeheader()
    for row in rows:  # the limit's columns, then one per SLO's p99, after the fixed ones
        values = row.model_dump(exclude=nested) | row.limit.model_dump() | row.slo_p99
        writer.writerow({k: _csv(v) for k, v in values.items()})
    write_atomic(out / "trials.csv", table.getvalue())
    write_json(out / "summary.json", summary.model_dump())


def _csv(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return " ".join(to_argv(value)) if isinstance(value, dict) else value
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 4)
    return value

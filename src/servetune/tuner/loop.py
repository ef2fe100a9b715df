"""The tuner: prepare the study, then ask the proposer for configs, run each as a trial on a real server
(through an executor) and tell the study its outcome; then the head-to-head of the pick against vLLM's
defaults (`confirm`). Within a time limit (`timelimit`) it launches only what still fits. After every trial
and at every stop (the end, the time limit, an interrupt) the outputs are written again (`report`), with the
tune's state, so a run stopped at any moment leaves its best answer."""

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from servetune import __version__
from servetune.engine import InstalledVllm
from servetune.engine.memory import ModelShape
from servetune.engine.roofline import ModelCost, Work, accelerator, bound
from servetune.errors import ServetuneError
from servetune.executors import Executor, Job, make_executor
from servetune.jsonio import check_writable
from servetune.measure.slo import ITL, NO_SLO, Objective, Slos
from servetune.measure.verdict import Decision
from servetune.report import publish
from servetune.search.feasibility import MemoryCheck
from servetune.search.offer import Offer, offer
from servetune.search.ruleout import prefill_cost, ruled_out
from servetune.search.space import SearchSpace, build_space
from servetune.search.strategies import REGISTRY, Strategy, make_strategy, suggest
from servetune.study.notdone import CutShort, HeadToHeadUnrun, NotDone, NothingMeasured, Stopped, Unlaunched
from servetune.study.outcome import TrialOutcome
from servetune.study.record import (
    HeadToHeadMethod,
    Progress,
    RecordedTrial,
    Reference,
    Role,
    StudyMeta,
    StudyRecord,
    TrialRecord,
    TuneState,
    read_trial,
    write_trial,
)
from servetune.study.results import Results, Summary, TrialRow, beats, not_passed, trial_row
from servetune.study.storage import (
    StudyLock,
    check_resumable,
    check_storage,
    default_storage,
    open_study,
    stored_meta,
    trial_dir,
)
from servetune.timelimit import GUESS_CAPACITY_S, Clock, Keep, TimePlan
from servetune.trial.hooks import Hooks
from servetune.trial.run import (
    Latency,
    LevelOptions,
    Race,
    TrialPlan,
    least_requests,
    level_seconds,
    requests_per_s,
)
from servetune.tuner.confirm import (
    candidates_of,
    decide,
    deciding_level,
    failed_at_or_below,
    head_to_head_job,
    run_head_to_head,
)
from servetune.tuner.dispatch import Dispatch, Finished
from servetune.workload import MorePrompts, RequestSpec, WorkloadSpec, build_requests, load_tokenizer
from servetune.workload.fit import ModelLenBounds, max_chars_per_token, model_len_for

MAX_SKIPPED_IN_A_ROW = 200  # proposals that were infeasible or already measured, before giving up


@dataclass(frozen=True)
class TuneOptions:
    """What to tune and how; checked when made (ServetuneError naming the problem)."""

    model: str
    workload: WorkloadSpec
    out: Path
    slo: Slos = NO_SLO
    objective: Objective = Objective.GOODPUT
    strategy: str = "optuna"
    budget: int = 6  # servers to launch, vLLM's defaults included
    storage: str | None = None  # Optuna storage URL; None: sqlite in `out`
    resume: bool = False
    engine_args: dict[str, Any] = field(default_factory=dict)  # fixed for every config
    references: list[dict[str, Any]] = field(default_factory=list)  # configs to measure as they are
    optional_knobs: tuple[str, ...] = ()
    tokenizer: str | None = None
    levels: LevelOptions = LevelOptions()
    seed: int = 0
    parallel: int | None = None  # trials at once (default 1; on a Ray cluster, as many as it has GPUs)
    ray_address: str | None = None
    confirm: bool = True  # the head-to-head of the pick against the defaults at the pick's rate
    time_limit_s: float | None = None  # wall-clock budget of the whole tune, launches and head-to-head included
    min_model_len: int | None = None  # the floor of a tightened max-model-len (`workload.fit.ModelLenBounds`)
    gpu_hour_price: float | None = None  # what one GPU costs an hour: each config's cost per million output tokens

    def __post_init__(self) -> None:
        if self.min_model_len is not None and self.min_model_len < 1:
            raise ServetuneError(f"--min-model-len must be a positive number of tokens, not {self.min_model_len}")
        if self.objective not in tuple(Objective):
            raise ServetuneError(f"unknown objective {self.objective!r}; use goodput or throughput")
        if self.objective == Objective.GOODPUT and not self.slo:
            raise ServetuneError("the goodput objective needs at least one --slo (e.g. --slo tpot_p99_ms=50)")
        if self.gpu_hour_price is not None and not (0 < self.gpu_hour_price < float("inf")):
            raise ServetuneError(f"--gpu-hour-price must be a price above 0, not {self.gpu_hour_price:g}")

    def defining(self) -> dict[str, Any]:
        """What defines the study (`study.storage.DEFINING`), as its meta stores it."""
        return {"model": self.model, "workload": self.workload.model_dump(mode="json"), "slo": self.slo.as_dict(),
                "objective": self.objective, "strategy": self.strategy, "seed": self.seed,
                "user_engine_args": self.engine_args, "references": self.references,
                "optional_knobs": list(self.optional_knobs), "tokenizer": self.tokenizer,
                "levels": self.levels.stored(), "confirm": self.confirm, "min_model_len": self.min_model_len}


@dataclass(frozen=True)
class Runtime:
    """What a tune runs on, the real things by default: its clock, the writer of its outputs (after every trial and
    at every stop), the prompt builder and the study's storage. The simulated engine (`servetune.testing.simengine`)
    runs tunes on its own clock, without the report's charts, with each workload's prompts built once for many
    tunes and the study in memory."""

    clock: Clock = time
    publish: Callable[[Results, Path], object] = publish
    build_requests: Callable[..., list[RequestSpec]] = build_requests
    storage: optuna.storages.BaseStorage | None = None  # Optuna storage instead of the study URL's


def tune(opts: TuneOptions, hooks: Hooks = Hooks(), executor: Executor | None = None,
         runtime: Runtime = Runtime()) -> Summary:
    """Run (or resume) a study until `budget` servers were launched, the strategy has nothing left, or the time
    limit holds no other launch, then the head-to-head; returns the summary (`results.Summary`), written with the
    other outputs (`report.publish`) after every trial and at the end. With `parallel` > 1 or a `ray_address`,
    several trials run at once (see `servetune.executors`); an `executor` given here is used instead of the one
    those options make. On KeyboardInterrupt (SIGINT, or SIGTERM as `Interrupted`), or an OSError (a trial's files
    on a disk that filled up), the outputs are written with state `interrupted` and the exception goes on."""
    started = runtime.clock.time()  # the time limit counts from here
    lock = _lock(opts)
    tuner = executor_made = None
    try:
        tokenizer, sets, model_len = _prepare(opts, runtime.build_requests)
        executor = executor_made = executor or make_executor(opts.parallel, opts.ray_address, hooks)
        more = MorePrompts(opts.workload, str(opts.tokenizer or opts.model), seed=opts.workload.seed + 2000,
                           longest=max(r.min_model_len for s in sets for r in s), build=runtime.build_requests)
        proposer = Proposer.open(opts, executor, sets, model_len, runtime.storage, more)
        if proposer.offered.why:
            hooks.note(f"also searched, for this workload and GPU: {proposer.offered}")
        time_plan = TimePlan(opts.time_limit_s, device=proposer.vllm.kind, budget_trials=opts.budget,
                             clock=runtime.clock, started=started)
        tuner = Tuner(proposer=proposer, running=Dispatch(executor), hooks=hooks, time_plan=time_plan,
                      runtime=runtime)
        tuner.publish(TuneState.RUNNING)
        while True:
            out_of_time = tuner.search()
            if not (opts.confirm and opts.objective == Objective.GOODPUT):
                break
            tuner.confirm(tokenizer)
            if not (out_of_time and tuner.room_after_head_to_head()):
                break
        return tuner.publish(TuneState.TIME_LIMIT if tuner.not_done else TuneState.COMPLETE)
    except (KeyboardInterrupt, OSError) as e:  # a stop, or a write that failed (a disk that filled up)
        if tuner is not None:
            tuner.not_done.append(Stopped() if isinstance(e, KeyboardInterrupt) else
                                  Stopped(path=str(e.filename), error=e.strerror))
            if isinstance(e, OSError):
                lock.give_room()
            tuner.publish(TuneState.INTERRUPTED)
        raise
    finally:
        if executor_made is not None:
            executor_made.close()
        lock.release()


def _lock(opts: TuneOptions) -> StudyLock:
    """The output directory, checked writable, and the study's lock (`StudyLock`) taken: before anything else
    touches the study."""
    made = not opts.out.exists()
    try:
        check_writable(opts.out / "summary.json")
    except OSError as e:
        raise ServetuneError(f"--out: cannot write into {opts.out}: {e.strerror or e}") from None
    return StudyLock(opts.out, opts.storage or default_storage(opts.out), made_out=made).acquire()


def _prepare(opts: TuneOptions, build: Callable[..., list[RequestSpec]]) -> tuple[Any, list[list[RequestSpec]],
                                                                                  ModelLenBounds]:
    """(tokenizer, request sets, max-model-len bounds): everything a bad model path, dataset, workload or study
    storage fails on, before the vLLM probe (seconds) or any launch; a resumed study's options, before any prompt
    is built."""
    storage = opts.storage or default_storage(opts.out)
    if check_storage(storage, opts.resume):
        check_resumable(storage, stored_meta(storage), opts.defining())
    tokenizer = load_tokenizer(opts.tokenizer or opts.model)
    sets = [build(opts.workload, tokenizer, seed=opts.workload.seed + 1000, count=opts.levels.pool)]
    return tokenizer, sets, _model_len(opts, sets, tokenizer)


def _model_len(opts: TuneOptions, sets: list[list[RequestSpec]], tokenizer: Any) -> ModelLenBounds:
    """What a config's max-model-len may be: the model's context (its config.json), and where tightening pays
    what the longest request needs as vLLM counts it, plus headroom (`workload.fit`), at least
    --min-model-len and at most the context. A workload longer than the context is refused here."""
    longest = max(r.min_model_len for s in sets for r in s)
    try:
        context = ModelShape.from_path(opts.model).max_position_embeddings
    except (OSError, ValueError, KeyError):
        context = 0
    if context and longest > context:
        raise ServetuneError(f"the workload's longest request needs max-model-len {longest}, the model's context "
                             f"is {context} tokens: shorten the workload")
    need = min(model_len_for(longest), context) if context else model_len_for(longest)
    return ModelLenBounds(need=need, context=context, floor=opts.min_model_len or 0,
                          max_chars_per_token=max_chars_per_token(tokenizer))


def _shape(model: str) -> dict[str, Any] | None:
    """The model's shape as the roofline reads it (`engine.memory.ModelShape`); None where its config is not read."""
    try:
        return asdict(ModelShape.from_path(model))
    except (OSError, ValueError, KeyError):
        return None


def _work(spec: WorkloadSpec, requests: list[RequestSpec]) -> Work:
    """What the workload's requests ask of a server on average (`engine.roofline.Work`)."""
    return Work.of(((r.prompt_len, r.output_len) for r in requests), shared=spec.prefix.length if spec.prefix else 0,
                   cached_prompts=spec.sessions is not None)


def _offer(opts: TuneOptions, vllm: InstalledVllm, memory: MemoryCheck | None, work: Work) -> Offer:
    """The knobs worth searching on this GPU for this workload (`search.offer`), from the roofline at vLLM's
    defaults' KV cache as the memory model predicts it; none on CPU, for a trace, or where there is no bound."""
    device = accelerator(vllm.device_name)
    if vllm.on_cpu or memory is None or device is None or memory.shape.experts or opts.workload.trace:
        return Offer()
    defaults = dict(opts.engine_args)
    at_defaults = bound(device, ModelCost.of(memory.shape, defaults), work, opts.slo.step_ms,
                        memory.kv_cache_tokens(defaults))
    return offer(vllm.flags, at_defaults, work, ITL in opts.slo)


@dataclass
class Launch:
    """A config to run: the job, and the study's trial it is told to."""

    job: Job
    trial: optuna.Trial


@dataclass
class Skip:
    """A proposal not launched: trial `number`'s config and why (`duplicate`: measured or running already)."""

    number: int
    config: dict[str, Any]
    reason: str
    duplicate: bool = False


@dataclass
class Proposer:
    """Turns the strategy's (or the queue's) next trial into a launch, or a skip with its reason: a config
    that breaks the space's constraints, that measured trials rule out, that the memory model predicts will
    not start, that the executor cannot place, or that was measured already. A skip is told PRUNED and
    costs no budget."""

    record: StudyRecord
    strategy: Strategy
    space: SearchSpace
    plan: TrialPlan
    opts: TuneOptions
    memory: MemoryCheck | None
    vllm: InstalledVllm
    misfit: Callable[[Job], str | None]  # the executor's: why a job can never run there
    typical_prompt: int
    offered: Offer = Offer()  # knobs searched for this workload and GPU (`search.offer`)

    @classmethod
    def open(cls, opts: TuneOptions, executor: Executor, sets: list[list[RequestSpec]], model_len: ModelLenBounds,
             backend: optuna.storages.BaseStorage | None = None, more: MorePrompts | None = None) -> "Proposer":
        """Probe vLLM, build the search space, open (or resume) the study with its meta and queue the defaults
        and the reference configs it has not measured yet; `more` builds prompts past the pool `sets`."""
        vllm = executor.probe()
        memory = MemoryCheck.for_model(opts.model, vllm)
        work = _work(opts.workload, sets[0])
        offered = _offer(opts, vllm, memory, work)
        space = build_space(vllm, model_len.tightened, context=model_len.context, optional=opts.optional_knobs,
                            fixed=opts.engine_args, offered=offered.values)
        if memory is not None and not vllm.on_cpu:  # chosen per config by the memory model, not searched
            space = SearchSpace(tuple(k for k in space.knobs if k.name != "gpu_memory_utilization"), space.fixed,
                                space.max_model_len, space.context)
        meta = StudyMeta(**opts.defining(), budget=opts.budget, space=space.to_dict(),
                         model_len=model_len.model_dump(), servetune_version=__version__, vllm_version=vllm.version,
                         device=vllm.device_type, out=str(opts.out.resolve()), device_name=vllm.device_name or None,
                         model_shape=_shape(opts.model), work=work.to_dict(), gpu_hour_price=opts.gpu_hour_price,
                         offered=offered.why or None)
        strategy = make_strategy(opts.strategy, space, opts.budget, opts.seed,
                                 constrained=opts.objective == Objective.THROUGHPUT and bool(opts.slo),
                                 slo=opts.slo)
        record = open_study(opts.storage or default_storage(opts.out), strategy.sampler(), meta, opts.resume, backend)
        if memory is not None and _launches(record):  # resumed: refit on the launches already made
            memory.observe(_launches(record))
        roles = {t.record.role for t in record.trials()}
        if Role.DEFAULT not in roles:
            record.enqueue({}, TrialRecord(role=Role.DEFAULT, planned={}))
        for i, reference in enumerate(opts.references):
            if Reference(i) not in roles:
                record.enqueue({}, TrialRecord(role=Reference(i), planned={}, reference=reference))
        plan = TrialPlan(model=opts.model, workload=opts.workload, slo=opts.slo, objective=opts.objective,
                         level_sets=sets, levels=opts.levels, more=more)
        return cls(record=record, strategy=strategy, space=space, plan=plan, opts=opts, memory=memory, vllm=vllm,
                   misfit=executor.misfit, typical_prompt=int(statistics.median(r.prompt_len for r in sets[0])),
                   offered=offered)

    @property
    def study(self) -> optuna.Study:
        return self.record.study

    def next(self) -> Launch | Skip | None:
        """The next launch, the next proposal skipped, or None when the strategy has nothing to propose now."""
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not waiting and not self.strategy.plan_next(self.study):
            return None
        trial = self.study.ask()
        asked = read_trial(trial)
        role, reference = asked.role, asked.reference
        given = role == Role.DEFAULT or reference is not None  # measured as given: no constraint or memory choices
        if reference is not None:
            config = {**self.opts.engine_args, **reference}
        else:
            config = dict(self.opts.engine_args) if given else suggest(trial, self.space)
        config, reason = (config, None) if given else self._fitted(config)
        job = Job(trial.number, config, self.plan, trial_dir(self.opts.out, trial.number))
        reason = reason or self.misfit(job)
        twin = None if given or reason else self._twin(trial, config)
        if reason is not None or twin is not None:
            write_trial(trial, skipped=reason if twin is None else f"same config as trial {twin.number}")
            self.study.tell(trial, state=TrialState.PRUNED)
            return Skip(trial.number, config, reason or "duplicate", duplicate=reason is None)
        write_trial(trial, config_requested=config)
        if tightened := ("given with --reference-config" if "max_model_len" in (reference or {})
                         else self.space.model_len_reason(config)):
            write_trial(trial, model_len_reason=tightened)  # below the model's context: why
        if asked.why is None:
            write_trial(trial, why="vLLM's defaults: the baseline" if role == Role.DEFAULT
                        else "given with --reference-config" if reference is not None
                        else REGISTRY[self.opts.strategy].why)  # proposed by the strategy's sampler
        return Launch(job, trial)

    def _fitted(self, config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """A searched config as it would launch (with the memory model's max_model_len where its KV cache cannot
        hold the model's context, and its gpu_memory_utilization), and why it is not worth a launch, or None.
        `config` is left as it is."""
        if reason := self.space.violation(config):
            return config, reason
        cost = prefill_cost((t.number, t.outcome) for t in self.record.measured() if t.outcome.ok)
        if reason := ruled_out(config, self.opts.slo, cost, self.typical_prompt):
            return config, reason
        if self.memory is None:
            return config, None
        fitted = self.space.fit_kv_cache(config, self.memory.longest_fitting(config))
        if not self.vllm.on_cpu and "gpu_memory_utilization" not in fitted:
            fitted["gpu_memory_utilization"] = self.memory.gpu_memory_utilization(fitted)
        misfit = self.memory.misfit(fitted) if fitted.get("gpu_memory_utilization", 1) else "no utilization fits"
        return fitted, f"predicted not to start: {misfit}" if misfit else None

    def _twin(self, trial: optuna.Trial, config: dict) -> RecordedTrial | None:
        """A trial measured or running with the same config."""
        record = self.record
        for t in [*record.measured(), *record.trials((TrialState.RUNNING,))]:
            if t.number != trial.number and t.record.config_requested == config:
                return t
        return None


class SearchEnd(StrEnum):
    """Why the search launches nothing more (`Tuner._ask`): its stop rules."""

    BUDGET_SPENT = "budget spent"  # every server of the budget launched, or only configs it cannot launch proposed
    OUT_OF_TIME = "out of time"  # the time left holds no launch and first deciding level
    STRATEGY_DONE = "strategy done"  # the strategy has nothing left to propose


@dataclass
class Pending:
    """The search's launch in waiting: proposed and not yet submitted (`launch`: the executor had no room), the
    trial number told to the hooks, and the proposals skipped in a row."""

    launch: Launch | None = None
    announced: int | None = None
    skipped: int = 0


@dataclass
class Tuner:
    """The search loop, the head-to-head and the outputs of one tune."""

    proposer: Proposer
    running: Dispatch  # the trials in flight on the executor
    hooks: Hooks
    time_plan: TimePlan  # the time limit: what still fits
    runtime: Runtime = Runtime()
    not_done: list[NotDone] = field(default_factory=list)  # what the time limit (or a stop) left undone
    unlaunched: int = 0  # trials of the budget the time limit left unlaunched

    def publish(self, state: TuneState) -> Summary:
        """Record the tune's state in the study, read its results once and write every output from them;
        returns the summary."""
        record, opts = self.proposer.record, self.proposer.opts
        # the least another trial needed, where the time limit left trials of the budget unlaunched
        next_trial_s = (round(self.time_plan.trial_s(self.next_trial().first_level_s), 1)
                        if opts.time_limit_s and self.unlaunched else None)
        more_s = sum(t.outcome.needed_s or 0.0 for t in record.measured()) + self.unlaunched * (next_trial_s or 0.0)
        record.write_progress(Progress(state=state, not_done=[str(n) for n in self.not_done],
                                       time_limit_s=opts.time_limit_s,
                                       elapsed_s=round(self.time_plan.elapsed(), 1), next_trial_s=next_trial_s,
                                       more_s=round(more_s, 1) if more_s else None))
        results = Results(record)
        try:
            self.runtime.publish(results, opts.out)
        except OSError as e:  # the study keeps everything: `servetune report` writes them later
            self.hooks.note(f"could not write the outputs in {opts.out}: {e}")
        return results.summary

    def search(self) -> bool:
        """The search loop in Optuna's shape: ask for a launch (`_ask`) while the executor has a free slot, submit
        it, wait for trials to finish and tell the study each outcome (`_record`), writing the outputs; until no
        launch is left (`SearchEnd`) and nothing runs. True when it ended out of time (what was not launched is in
        `not_done`)."""
        self.not_done = [item for item in self.not_done if not isinstance(item, Unlaunched)]
        self.unlaunched = 0
        pending = Pending()
        self._note_time()
        while True:
            if pending.launch is None and self.running.free:
                end = self._ask(pending)
                if end is not None and not self.running.running:
                    if end == SearchEnd.OUT_OF_TIME:
                        self._out_of_time()
                    return end == SearchEnd.OUT_OF_TIME
            if pending.launch is not None and self._submit(pending):
                continue
            if not self.running.running:
                return False
            for finished in self.running.wait():
                self._record(finished)
            self.publish(TuneState.RUNNING)
            self._note_time()

    def _left(self) -> int:
        """Trials of the budget neither measured nor running."""
        return self.proposer.opts.budget - len(self.proposer.record.measured()) - len(self.running.running)

    def _ask(self, pending: "Pending") -> "SearchEnd | None":
        """The next config to launch, held in `pending` (None returned), or why no launch comes now: the budget is
        spent (or the proposer kept proposing configs it cannot launch), the time left holds no launch and first
        deciding level (`TimePlan.launch_fits`), or the strategy has
        nothing left. A skipped proposal costs nothing and the next is asked for."""
        while True:
            if pending.skipped >= MAX_SKIPPED_IN_A_ROW or self._left() <= 0:
                return SearchEnd.BUDGET_SPENT
            nxt, first = self.next_trial(), not (self.proposer.record.measured() or self.running.running)
            if not self.time_plan.launch_fits(nxt.first_level_s, nxt.reserve_s, first=first):
                return SearchEnd.OUT_OF_TIME
            proposal = self.proposer.next()
            if proposal is None:
                return SearchEnd.STRATEGY_DONE
            if not isinstance(proposal, Skip):
                pending.launch = proposal
                return None
            pending.skipped += 1
            if not proposal.duplicate:  # duplicates are TPE's noise, not news
                self.hooks.trial_skipped(proposal.number, proposal.config, proposal.reason)

    def _submit(self, pending: "Pending") -> bool:
        """Submit the held launch with the time it may spend (the hooks told before: `Inline` runs the trial in the
        submit); False when the executor has no room for it yet."""
        held = pending.launch
        assert held is not None  # asked for (`_ask`)
        if pending.announced != held.job.number:
            self.hooks.trial_started(held.job.number, held.job.config, read_trial(held.trial).why or "")
            pending.announced = held.job.number
        nxt = self.next_trial()
        job = replace(held.job, plan=replace(held.job.plan, race=nxt.race), trial_time=self.time_plan.trial_time(
            reserve_s=nxt.reserve_s, keep=nxt.keep, next_trial_s=self.time_plan.trial_s(nxt.first_level_s, later=True),
            after=self._left() - 1, baseline=read_trial(held.trial).role == Role.DEFAULT))
        if not self.running.submit(job, replace(held, job=job)):
            return False
        pending.skipped, pending.launch = 0, None
        return True

    def _note_time(self) -> None:
        """Under a time limit, tell the hooks the time left and what it affords."""
        if self.time_plan.deadline is not None:
            nxt = self.next_trial()
            self.hooks.note(self.time_plan.describe(nxt.first_level_s, self._left(), nxt.reserve_s))

    def next_trial(self) -> "NextTrial":
        """What the next trial would start with, from what the study measured (`NextTrial`)."""
        return next_trial(self.proposer.record, self.proposer.plan, self.time_plan, self.proposer.opts.confirm)

    def _out_of_time(self) -> None:
        left, nxt = self._left(), self.next_trial()
        budget, self.unlaunched = self.proposer.opts.budget, left
        self.not_done.append(Unlaunched(left=left, budget=budget, left_s=self.time_plan.remaining(),
                                        need_s=self.time_plan.trial_s(nxt.first_level_s), reserve_s=nxt.reserve_s))
        self.hooks.note(f"time limit: {self.not_done[-1]}")

    def room_after_head_to_head(self) -> bool:
        """Whether a trial fits again now that the head-to-head ran (it kept its time for a level that passes;
        the defaults' level often fails in seconds)."""
        nxt = self.next_trial()
        return self.time_plan.launch_fits(nxt.first_level_s, nxt.reserve_s)

    def _record(self, finished: Finished[Launch]) -> None:
        """Tell the study a finished trial's outcome. A trial whose worker died, or that the time limit stopped
        before it measured anything, is queued again."""
        proposer, hooks = self.proposer, self.hooks
        record, job, trial, out = proposer.record, finished.tag.job, finished.tag.trial, finished.outcome
        if out is None:
            assert finished.lost is not None  # no outcome: why the worker was lost
            record.requeue(record.trial(job.number), f"worker lost: {finished.lost}")
            hooks.trial_lost(job.number, finished.lost)
            return
        if out.startup is not None and out.startup.ready_s is not None:
            self.time_plan.observe_launch(out.startup.ready_s)
        if out.cut_short and not out.levels:
            write_trial(trial, outcome=out)  # its launch took time (`results.time_spent`); it runs again on --resume
            record.requeue(record.trial(job.number), "stopped by the time limit")
            self.not_done.append(NothingMeasured(job.number))
            hooks.trial_lost(job.number, "stopped by the time limit before it measured anything")
            return
        if out.cut_short:
            self.not_done.append(CutShort(out.cut_short, trial=job.number))
        out = out.model_copy(update={"artifacts": str(job.out_dir.relative_to(proposer.opts.out))})
        write_trial(trial, outcome=out)
        if proposer.memory is not None and out.startup and out.startup.kv_cache_tokens:
            record.write_calibration(proposer.memory.observe(_launches(record)))
        value = (out.goodput_rate or 0.0) if proposer.opts.objective == Objective.GOODPUT else out.request_throughput
        if out.ok and value is not None:
            write_trial(trial, constraints=_constraints(out, proposer.opts.slo))
            record.study.tell(trial, value)
        else:
            record.study.tell(trial, state=TrialState.PRUNED)  # TPE ranks a failed config below every measured one
        hooks.trial_finished(job.number, out)

    def confirm(self, tokenizer) -> None:
        """The head-to-head (`servetune.tuner.confirm`): is the pick better than vLLM's defaults at the pick's rate?
        Decided by the defaults' own search where it failed at or below that rate, else by the defaults launched
        again and measured there; stored in the study as its `confirmation`. A resumed study that measured nothing
        new keeps the confirmation it has."""
        record, opts = self.proposer.record, self.proposer.opts
        measured = record.measured()
        trials = len(measured)
        if (confirmation := record.confirmation) is not None and confirmation.search_trials == trials:
            return
        rows = [trial_row(t, opts.slo) for t in measured]
        default = next((r for r in rows if r.role == Role.DEFAULT and r.ok), None)
        if default is None:
            return
        candidates = candidates_of(rows, default, lambda row, base: beats(row, base, Objective.GOODPUT))
        pick = candidates[0] if candidates else None
        level = pick_level = missing = wall_s = None
        method = HeadToHeadMethod.HEAD_TO_HEAD
        if pick is not None:
            pick_out, default_out = record.trial(pick.trial).outcome, record.trial(default.trial).outcome
            assert pick_out is not None and default_out is not None and pick.goodput_rate is not None  # measured rows
            pick_level = deciding_level(pick_out, pick.goodput_rate)
            level = failed_at_or_below(default_out, pick.goodput_rate)
            if level is not None:
                method = HeadToHeadMethod.SEARCH
            else:
                outcome = self._head_to_head(default, pick, _latency(pick_out), tokenizer)
                wall_s = outcome.wall_s if outcome is not None else None
                level = outcome.levels[0] if outcome is not None and outcome.levels else None
                missing = ("the time limit came first" if outcome is None
                           else str(outcome.failure) if outcome.failure else None)
        decided = decide(pick, default, level, pick_level, opts.workload.rate_unit, method=method, missing=missing)
        record.write_confirmation(decided.model_copy(update={"search_trials": trials, "wall_s": wall_s}))

    def _head_to_head(self, default: TrialRow, pick: TrialRow, latency: Latency, tokenizer) -> TrialOutcome | None:
        """The defaults launched again and measured at the pick's rate (its requests taking what they took the
        pick: `latency`), when that fits the time left (None: it does not, which `not_done` says)."""
        opts, plan = self.proposer.opts, self.proposer.plan
        assert pick.goodput_rate is not None  # it beat the defaults' (`confirm`)
        if not self.time_plan.head_to_head_fits():
            need = self.next_trial().head_to_head_s(pick.goodput_rate)
            self.not_done.append(HeadToHeadUnrun(need))
            return None
        level_set = self.runtime.build_requests(opts.workload, tokenizer, seed=opts.workload.seed + 100_000,
                                                count=plan.levels.pool)
        job = head_to_head_job(default, pick.goodput_rate, plan, level_set, opts.out,
                               self.time_plan.trial_time(reserve_s=0.0, keep=None, next_trial_s=0.0, after=0,
                                                         baseline=True), latency)
        outcome = run_head_to_head(job, self.running, self.hooks)
        if outcome.cut_short:
            self.not_done.append(CutShort(outcome.cut_short))
        return outcome


@dataclass(frozen=True)
class NextTrial:
    """What the next trial starts with: its race (None: a full search), the time its first deciding level takes, the
    time kept for a head-to-head that is needed already (`reserve_s`), and the head-to-head's cost (`cost`), kept
    once a pass of the trial's makes it needed (`keep`: the cost with the window of rates where it would be)."""

    race: Race | None
    first_level_s: float
    cost: Keep
    per_s: float  # req/s per rate unit
    reserve_s: float = 0.0
    keep: Keep | None = None

    def head_to_head_s(self, rate: float) -> float:
        """The defaults launched again and a deciding level at `rate` (the study's unit)."""
        return self.cost.seconds(rate * self.per_s)


def next_trial(record: StudyRecord, plan: TrialPlan, time_plan: TimePlan, confirm: bool) -> NextTrial:
    """The next trial's start (`NextTrial`) from the study's measured trials."""
    measured = [t for t in record.measured() if t.outcome.ok]
    per_s = requests_per_s(plan, 1.0)
    incumbent = max((t for t in measured if t.outcome.goodput_rate), key=lambda t: t.outcome.goodput_rate or 0.0,
                    default=None)
    e2e = _latency(incumbent.outcome) if incumbent else Latency()
    capacities = [lv.metrics.duration for t in measured for lv in t.outcome.levels if lv.name == "capacity"]
    first = statistics.median(capacities) if capacities else GUESS_CAPACITY_S  # every trial's first level
    if incumbent is not None and plan.objective == Objective.GOODPUT:
        rate = incumbent.outcome.goodput_rate
        assert rate is not None  # a rated trial's
        race = Race(rate, (incumbent.outcome.goodput_bracket or (rate, None))[1])
        first += level_seconds(plan, rate * per_s, e2e)
    else:
        race = None
    cost = Keep(low=0.0, high=math.inf, launch_s=time_plan.launch_s(), requests=least_requests(plan, 0.0),
                drain_s=e2e.overhead_s, min_window_s=plan.levels.window_s)
    nxt = NextTrial(race, first, cost, per_s)
    default = next((t for t in measured if t.record.role == Role.DEFAULT), None)
    if not confirm or plan.objective != Objective.GOODPUT or default is None:
        return nxt
    low = not_passed(trial_row(default, plan.slo)) if default.outcome.goodput_rate else 0.0
    high = min((lv.rate for lv in default.outcome.levels if lv.verdict == Decision.FAIL and math.isfinite(lv.rate)),
               default=math.inf)
    keep = replace(cost, low=low, high=high)
    best = max((t for t in measured if t.number != default.number and t.outcome.goodput_rate),
               key=lambda t: t.outcome.goodput_rate or 0.0, default=None)
    pick = best if best is not None and keep.applies(best.outcome.goodput_rate or 0.0) else None  # the head-to-head's
    decided = record.confirmation
    if pick is None or (decided is not None and decided.pick is not None and decided.pick.trial == pick.number
                        and decided.head_to_head is not None):
        return replace(nxt, keep=keep)  # nothing waits for a head-to-head, or the one it waited for has run
    assert pick.outcome.goodput_rate is not None  # a rated trial's
    return replace(nxt, reserve_s=nxt.head_to_head_s(pick.outcome.goodput_rate), keep=keep)


def _latency(outcome: TrialOutcome) -> Latency:
    """What requests take end to end at a trial's goodput rate (`trial.run.Latency`)."""
    level = deciding_level(outcome, outcome.goodput_rate)
    return Latency() if level is None else Latency.of(level)


def _launches(record: StudyRecord) -> list[tuple[dict, int]]:
    """(config as launched, logged KV cache tokens) of every launch that logged one."""
    return [(o.config, o.startup.kv_cache_tokens) for o in record.launches() if o.startup and o.startup.kv_cache_tokens]


def _constraints(out: TrialOutcome, slo: Slos) -> list[float]:
    """Optuna constraints (<= 0 is feasible): each p99 over its SLO, at the capacity level (none measured: none)."""
    capacity = out.capacity
    if capacity is None or not capacity.metrics.completed:
        return [0.0]
    return [s.latency.p99(capacity.metrics) - s.bound_ms for s in slo] or [0.0]

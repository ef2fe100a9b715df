"""The tuner: prepare the study, then ask the proposer for configs, run each as a trial on a real server
(through an executor) and tell the study its outcome; confirm the best against vLLM's defaults. `results`
turns the finished study into the recommendation and its files."""

import statistics
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from servetune import __version__
from servetune.confirm import Confirmation, ConfirmOptions, candidates_of, next_rates
from servetune.engine import InstalledVllm
from servetune.errors import ServetuneError
from servetune.executors import Executor, Job, WorkerError, WorkerLost, make_executor
from servetune.memory import ModelShape
from servetune.outcome import TrialOutcome
from servetune.results import beats, summary, trial_row
from servetune.search.feasibility import MemoryCheck
from servetune.search.objective import SLO_METRICS
from servetune.search.ruleout import prefill_speed, ruled_out
from servetune.search.space import SearchSpace, build_space
from servetune.search.strategies import Strategy, make_strategy, suggest
from servetune.study import check_storage, default_storage, measured, open_study, outcome, requeue, trial_dir
from servetune.trial import LevelOptions, TrialPlan
from servetune.workload import RequestSpec, WorkloadSpec, build_requests, load_tokenizer
from servetune.workload.fit import ModelLenBounds, max_chars_per_token, model_len_for

MAX_SKIPPED_IN_A_ROW = 200  # proposals that were infeasible or already measured, before giving up
MAX_LOST_IN_A_ROW = 3  # trials whose worker died, one after another, before giving up


@dataclass(frozen=True)
class TuneOptions:
    """What to tune and how; checked when made (ServetuneError naming the problem)."""

    model: str
    workload: WorkloadSpec
    out: Path
    slo: dict[str, float] = field(default_factory=dict)
    objective: str = "goodput"  # or "throughput"
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
    confirm: ConfirmOptions | None = field(default_factory=ConfirmOptions)  # None: recommend unconfirmed
    min_model_len: int | None = None  # the floor of a tightened max-model-len (`workload.fit.ModelLenBounds`)

    def __post_init__(self) -> None:
        if self.min_model_len is not None and self.min_model_len < 1:
            raise ServetuneError(f"--min-model-len must be a positive number of tokens, not {self.min_model_len}")
        if self.objective not in ("goodput", "throughput"):
            raise ServetuneError(f"unknown objective {self.objective!r}; use goodput or throughput")
        if self.objective == "goodput" and not self.slo:
            raise ServetuneError("the goodput objective needs at least one --slo (e.g. --slo tpot_p99_ms=50)")


class Hooks:
    """Progress callbacks; the CLI draws bars with them."""

    def trial_started(self, number: int, config: dict, why: str) -> None: ...
    def trial_finished(self, number: int, out: TrialOutcome) -> None: ...
    def trial_lost(self, number: int, reason: str) -> None: ...
    def trial_skipped(self, number: int, config: dict, reason: str) -> None: ...
    def confirm_started(self, number: int, config: dict, rates: list[float], opts: ConfirmOptions) -> None: ...
    def confirm_finished(self, number: int, result: dict) -> None: ...
    def level_started(self, name: str, rate: float, n: int) -> None: ...
    def record(self, record) -> None: ...


def tune(opts: TuneOptions, hooks: Hooks = Hooks(), executor: Executor | None = None) -> dict:
    """Run (or resume) a study until `budget` servers were launched, then confirm its pick; returns the
    summary (`results.summary`; `report.write_report` writes it with the other outputs). With `parallel` > 1
    or a `ray_address`, several trials run at once (see `servetune.executors`); an `executor` given here is
    used instead of the one those options make."""
    tokenizer, sets, model_len = _prepare(opts)
    executor = executor or make_executor(opts.parallel, opts.ray_address, hooks.level_started, hooks.record)
    try:
        proposer = Proposer.open(opts, executor, sets, model_len)
        _search(proposer, executor, hooks)
        if opts.confirm is not None and opts.objective == "goodput":
            _confirm(proposer.study, proposer.plan, tokenizer, opts, hooks, executor)
    finally:
        executor.close()
    return summary(proposer.study)


def _prepare(opts: TuneOptions) -> tuple[Any, list[list[RequestSpec]], ModelLenBounds]:
    """(tokenizer, request sets, max-model-len bounds): everything a bad model path, dataset, workload or study
    storage fails on, before the vLLM probe (seconds) or any launch."""
    opts.out.mkdir(parents=True, exist_ok=True)
    check_storage(opts.storage or default_storage(opts.out), opts.resume)
    tokenizer = load_tokenizer(opts.tokenizer or opts.model)
    sets = [build_requests(opts.workload, tokenizer, seed=opts.workload.seed + 1000 * k, count=opts.levels.requests)
            for k in range(opts.levels.max_levels + 2)]
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

    study: optuna.Study
    strategy: Strategy
    space: SearchSpace
    plan: TrialPlan
    opts: TuneOptions
    memory: MemoryCheck | None
    vllm: InstalledVllm
    misfit: Callable[[Job], str | None]  # the executor's: why a job can never run there
    typical_prompt: int

    @classmethod
    def open(cls, opts: TuneOptions, executor: Executor, sets: list[list[RequestSpec]],
             model_len: ModelLenBounds) -> "Proposer":
        """Probe vLLM, build the search space, open (or resume) the study with its meta and queue the defaults
        and the reference configs it has not measured yet."""
        vllm = executor.probe()
        space = build_space(vllm, model_len.tightened, context=model_len.context, optional=opts.optional_knobs,
                            fixed=opts.engine_args)
        memory = MemoryCheck.for_model(opts.model, vllm)
        if memory is not None and not vllm.on_cpu:  # chosen per config by the memory model, not searched
            space = SearchSpace(tuple(k for k in space.knobs if k.name != "gpu_memory_utilization"), space.fixed,
                                space.max_model_len, space.context)
        meta = {"model": opts.model, "workload": opts.workload.model_dump(mode="json"), "slo": opts.slo,
                "objective": opts.objective, "strategy": opts.strategy, "budget": opts.budget,
                "space": space.to_dict(), "model_len": model_len.model_dump(),
                "user_engine_args": opts.engine_args, "servetune_version": __version__,
                "vllm_version": vllm.version, "device": vllm.device_type, "out": str(opts.out.resolve())}
        strategy = make_strategy(opts.strategy, space, opts.budget, opts.seed,
                                 constrained=opts.objective == "throughput" and bool(opts.slo), slo=tuple(opts.slo))
        study = open_study(opts.storage or default_storage(opts.out), strategy.sampler(), meta, opts.resume)
        if memory is not None and _launches(study):  # resumed: refit on the launches already made
            memory.observe(_launches(study))
        roles = [t.user_attrs.get("role") for t in study.get_trials(deepcopy=False)]
        if "default" not in roles:
            study.enqueue_trial({}, user_attrs={"role": "default", "planned": {}})
        for i, reference in enumerate(opts.references):
            if f"reference-{i}" not in roles:
                study.enqueue_trial({}, user_attrs={"role": f"reference-{i}", "planned": {}, "reference": reference})
        plan = TrialPlan(opts.model, opts.workload, opts.slo, opts.objective, sets, opts.levels)
        return cls(study, strategy, space, plan, opts, memory, vllm, executor.misfit,
                   int(statistics.median(r.prompt_len for r in sets[0])))

    def next(self) -> Launch | Skip | None:
        """The next launch, the next proposal skipped, or None when the strategy has nothing to propose now."""
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not waiting and not self.strategy.plan_next(self.study):
            return None
        trial = self.study.ask()
        role, reference = trial.user_attrs.get("role"), trial.user_attrs.get("reference")
        given = role == "default" or reference is not None  # measured as given: no constraint or memory choices
        if reference is not None:
            config = {**self.opts.engine_args, **reference}
        else:
            config = dict(self.opts.engine_args) if given else suggest(trial, self.space)
        reason = None if given else self._refusal(config)
        job = Job(trial.number, config, self.plan, trial_dir(self.opts.out, trial.number))
        reason = reason or self.misfit(job)
        twin = None if given or reason else self._twin(trial, config)
        if reason is not None or twin is not None:
            trial.set_user_attr("skipped", reason or f"same config as trial {twin.number}")
            self.study.tell(trial, state=TrialState.PRUNED)
            return Skip(trial.number, config, reason or "duplicate", duplicate=reason is None)
        trial.set_user_attr("config_requested", config)
        if tightened := ("given with --reference-config" if "max_model_len" in (reference or {})
                         else self.space.model_len_reason(config)):
            trial.set_user_attr("model_len_reason", tightened)  # below the model's context: why
        if "why" not in trial.user_attrs:
            trial.set_user_attr("why", "vLLM's defaults: the baseline" if role == "default"
                                else "given with --reference-config" if reference is not None
                                else "TPE's proposal" if self.opts.strategy == "optuna" else "the grid's next point")
        return Launch(job, trial)

    def _refusal(self, config: dict[str, Any]) -> str | None:
        """Why a searched config is not worth a launch, or None. May set its max_model_len (where its KV cache
        cannot hold the model's context) and its gpu_memory_utilization (the memory model's choices)."""
        if reason := self.space.violation(config):
            return reason
        speed = prefill_speed((t.number, out) for t in measured(self.study) if (out := outcome(t)).ok)
        if reason := ruled_out(config, self.opts.slo, speed, self.typical_prompt):
            return reason
        if self.memory is None:
            return None
        self.space.fit_kv_cache(config, self.memory.longest_fitting(config))
        if not self.vllm.on_cpu and "gpu_memory_utilization" not in config:
            config["gpu_memory_utilization"] = self.memory.gpu_memory_utilization(config)
        misfit = self.memory.misfit(config) if config.get("gpu_memory_utilization", 1) else "no utilization fits"
        return f"predicted not to start: {misfit}" if misfit else None

    def _twin(self, trial: optuna.Trial, config: dict) -> FrozenTrial | None:
        """A trial measured or running with the same config."""
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for t in [*measured(self.study), *running]:
            if t.number != trial.number and t.user_attrs.get("config_requested") == config:
                return t
        return None


def _search(proposer: Proposer, executor: Executor, hooks: Hooks) -> None:
    """Launch what the proposer proposes, as many at once as the executor has slots, until `budget` servers
    were launched; tell the study each outcome as it returns."""
    study, budget = proposer.study, proposer.opts.budget
    running: dict[Future, Launch] = {}
    held: Launch | None = None  # proposed, waiting for devices to free up
    announced = None  # the held trial's number once told to the hooks
    skipped = lost_in_a_row = 0
    while True:
        if (held is None and len(running) < executor.slots and skipped < MAX_SKIPPED_IN_A_ROW
                and len(measured(study)) + len(running) < budget):
            proposal = proposer.next()
            if isinstance(proposal, Skip):
                skipped += 1
                if not proposal.duplicate:  # duplicates are TPE's noise, not news
                    hooks.trial_skipped(proposal.number, proposal.config, proposal.reason)
                continue
            held = proposal
        if held is not None and announced != held.job.number:  # before submit: `Inline` runs the trial inside it
            hooks.trial_started(held.job.number, held.job.config, held.trial.user_attrs.get("why", ""))
            announced = held.job.number
        if held is not None and (future := executor.submit(held.job)) is not None:
            skipped = 0
            running[future], held = held, None
            continue
        if not running:
            return
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            lost = _record(proposer, running.pop(future), future, hooks)
            lost_in_a_row = lost_in_a_row + 1 if lost else 0
            if lost_in_a_row >= MAX_LOST_IN_A_ROW:
                raise WorkerError(f"{lost_in_a_row} trials in a row lost their worker (last: {lost}); "
                                  "their configs are queued: fix the cause and continue with --resume")


def _record(proposer: Proposer, launch: Launch, future: Future, hooks: Hooks) -> str | None:
    """Tell the study a finished trial's outcome. A trial whose worker died is queued again; returns why."""
    study, job, trial = proposer.study, launch.job, launch.trial
    try:
        out: TrialOutcome = future.result()
    except WorkerLost as e:
        requeue(study, study.get_trials(deepcopy=False)[job.number], f"worker lost: {e}")
        hooks.trial_lost(job.number, str(e))
        return str(e)
    out = out.model_copy(update={"artifacts": str(job.out_dir.relative_to(proposer.opts.out))})
    trial.set_user_attr("outcome", out.stored())
    if proposer.memory is not None and out.startup and out.startup.kv_cache_tokens:
        study.set_user_attr("calibration", proposer.memory.observe(_launches(study)).model_dump())
    if out.ok:
        trial.set_user_attr("constraints", _constraints(out, proposer.opts.slo))
        study.tell(trial, out.goodput_rate if proposer.opts.objective == "goodput" else out.request_throughput)
    else:
        study.tell(trial, state=TrialState.PRUNED)  # TPE ranks a failed config below every measured one
    hooks.trial_finished(job.number, out)
    return None


def _launches(study: optuna.Study) -> list[tuple[dict, int]]:
    """(config as launched, logged KV cache tokens) of every launch that logged one."""
    outcomes = [outcome(t) for t in study.get_trials(deepcopy=False) if "outcome" in t.user_attrs]
    return [(o.config, o.startup.kv_cache_tokens) for o in outcomes if o.startup and o.startup.kv_cache_tokens]


def _constraints(out: TrialOutcome, slo: dict[str, float]) -> list[float]:
    """Optuna constraints (<= 0 is feasible): each p99 over its SLO, at the capacity level."""
    metrics = out.capacity.metrics
    return [getattr(metrics, SLO_METRICS[k]) - v for k, v in slo.items()] or [0.0]


def _confirm(study: optuna.Study, plan: TrialPlan, tokenizer, opts: TuneOptions, hooks: Hooks,
             executor: Executor) -> None:
    """Confirm the search's candidates against the defaults (`servetune.confirm`) and store the result in the
    study; a resumed study that measured nothing new keeps the confirmation it has."""
    trials = len(measured(study))
    if (study.user_attrs.get("confirmation") or {}).get("search_trials") == trials:
        return
    rows = [trial_row(t) for t in measured(study)]
    default = next((r for r in rows if r["role"] == "default" and r["status"] == "ok"), None)
    if default is None or not next_rates(default):
        return
    candidates = candidates_of(rows, default, lambda row, base: beats(row, base, "goodput"))

    def sets(k: int) -> list[RequestSpec]:
        return build_requests(opts.workload, tokenizer, seed=opts.workload.seed + 100_000 + k,
                              count=opts.confirm.requests + plan.levels.warmup_requests)

    result = Confirmation(plan, sets, executor, opts.out, opts.confirm, hooks).run(default, candidates)
    study.set_user_attr("confirmation", result | {"search_trials": trials})

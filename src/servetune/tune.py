"""The tuner: ask the strategy for a config, run it as a trial on a real server, tell the study; then write
the winner as a `vllm serve` config and command, with a summary against vLLM's defaults."""

import csv
import math
import statistics
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from servetune import __version__
from servetune.confirm import Confirmation, ConfirmOptions, candidates_of, next_rates
from servetune.engine import serve_command
from servetune.engine.args import CPU_KVCACHE_SPACE, to_argv
from servetune.executors import Executor, Job, WorkerError, WorkerLost, make_executor
from servetune.jsonio import write_json
from servetune.memory import ModelShape
from servetune.search.feasibility import MemoryCheck
from servetune.search.objective import SLO_METRICS
from servetune.search.ruleout import prefill_speed, ruled_out
from servetune.search.space import SearchSpace, build_space
from servetune.search.strategies import make_strategy, suggest
from servetune.study import check_storage, default_storage, measured, open_study, outcome, requeue, trial_dir
from servetune.trial import TrialPlan
from servetune.workload import RequestSpec, WorkloadSpec, build_requests, load_tokenizer
from servetune.workload.fit import model_len_for

MAX_SKIPPED_IN_A_ROW = 200  # proposals that were infeasible or already measured, before giving up
MAX_LOST_IN_A_ROW = 3  # trials whose worker died, one after another, before giving up


@dataclass
class TuneOptions:
    model: str
    workload: WorkloadSpec
    out: Path
    slo: dict[str, float] = field(default_factory=dict)
    objective: str = "goodput"
    strategy: str = "optuna"
    budget: int = 6
    storage: str | None = None
    resume: bool = False
    engine_args: dict[str, Any] = field(default_factory=dict)
    references: list[dict[str, Any]] = field(default_factory=list)  # configs to measure as they are
    optional_knobs: tuple[str, ...] = ()
    tokenizer: str | None = None
    level_seconds: float = 30.0
    level_requests: int = 300
    min_level_requests: int = 50
    max_levels: int = 6
    seed: int = 0
    request_timeout_s: float | None = None  # a request fails after this long without a byte; None: from the level
    parallel: int | None = None  # trials at once (default 1; on a Ray cluster, as many as it has GPUs)
    ray_address: str | None = None
    confirm: ConfirmOptions | None = field(default_factory=ConfirmOptions)  # None: recommend unconfirmed


class Hooks:
    """Progress callbacks; the CLI draws bars with them."""

    def trial_started(self, number: int, config: dict, why: str) -> None: ...
    def trial_finished(self, number: int, out: dict) -> None: ...
    def trial_lost(self, number: int, reason: str) -> None: ...
    def trial_skipped(self, number: int, config: dict, reason: str) -> None: ...
    def confirm_started(self, number: int, config: dict, rates: list[float], opts: ConfirmOptions) -> None: ...
    def confirm_finished(self, number: int, result: dict) -> None: ...
    def level_started(self, name: str, rate: float, n: int) -> None: ...
    def record(self, record) -> None: ...


def tune(opts: TuneOptions, hooks: Hooks = Hooks(), executor: Executor | None = None) -> dict:
    """Run (or resume) a study until `budget` servers were launched, write the outputs, return the summary.
    With `parallel` > 1 or a `ray_address`, several trials run at once (see `servetune.executors`); an
    `executor` given here is used instead of the one those options make."""
    if opts.objective not in ("goodput", "throughput"):
        raise ValueError(f"unknown objective {opts.objective!r}; use goodput or throughput")
    if opts.objective == "goodput" and not opts.slo:
        raise ValueError("the goodput objective needs at least one --slo (e.g. --slo tpot_p99_ms=50)")
    tokenizer, sets, model_len = _prepare(opts)
    executor = executor or make_executor(opts.parallel, opts.ray_address, hooks.level_started, hooks.record)
    try:
        study, plan = _search(opts, hooks, executor, sets, model_len)
        if opts.confirm is not None and opts.objective == "goodput":
            _confirm(study, plan, tokenizer, opts, hooks, executor)
    finally:
        executor.close()
    return write_outputs(study, opts.out)


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
                              count=opts.confirm.requests + plan.warmup_requests)

    result = Confirmation(plan, sets, executor, opts.out, opts.confirm, hooks).run(default, candidates)
    study.set_user_attr("confirmation", result | {"search_trials": trials})


def _prepare(opts: TuneOptions) -> tuple[Any, list[list[RequestSpec]], int]:
    """(tokenizer, request sets, max-model-len): everything a bad model path, dataset, workload or study
    storage fails on, before the vLLM probe (seconds) or any launch."""
    opts.out.mkdir(parents=True, exist_ok=True)
    check_storage(opts.storage or default_storage(opts.out), opts.resume)
    tokenizer = load_tokenizer(opts.tokenizer or opts.model)
    sets = [build_requests(opts.workload, tokenizer, seed=opts.workload.seed + 1000 * k, count=opts.level_requests)
            for k in range(opts.max_levels + 2)]
    return tokenizer, sets, _model_len(opts.model, sets)


def _search(opts: TuneOptions, hooks: Hooks, executor: Executor, sets: list[list[RequestSpec]], model_len: int):
    """Prepare the study and run the search until the budget is spent; returns (study, plan)."""
    vllm = executor.probe()
    space = build_space(vllm, model_len, optional=opts.optional_knobs, fixed=opts.engine_args)
    memory = MemoryCheck.for_model(opts.model, vllm)
    if memory is not None and not vllm.on_cpu:  # chosen per config by the memory model, not searched
        space = SearchSpace(tuple(k for k in space.knobs if k.name != "gpu_memory_utilization"), space.fixed,
                            space.max_model_len)
    meta = {"model": opts.model, "workload": opts.workload.model_dump(mode="json"), "slo": opts.slo,
            "objective": opts.objective, "strategy": opts.strategy, "budget": opts.budget,
            "space": space.to_dict(), "user_engine_args": opts.engine_args, "servetune_version": __version__,
            "vllm_version": vllm.version, "device": vllm.device_type, "out": str(opts.out.resolve())}
    strategy = make_strategy(opts.strategy, space, opts.budget, opts.seed,
                             constrained=opts.objective == "throughput" and bool(opts.slo), slo=tuple(opts.slo))
    typical_prompt = int(statistics.median(r.prompt_len for r in sets[0]))
    study = open_study(opts.storage or default_storage(opts.out), strategy.sampler(), meta, opts.resume)
    if memory is not None and _launches(study):  # resumed: refit on the launches already made
        memory.observe(_launches(study))
    roles = [t.user_attrs.get("role") for t in study.get_trials(deepcopy=False)]
    if "default" not in roles:
        study.enqueue_trial({}, user_attrs={"role": "default", "planned": {}})
    for i, reference in enumerate(opts.references):
        if f"reference-{i}" not in roles:
            study.enqueue_trial({}, user_attrs={"role": f"reference-{i}", "planned": {}, "reference": reference})
    plan = TrialPlan(opts.model, opts.workload, opts.slo, opts.objective, sets, opts.level_seconds,
                     opts.min_level_requests, max_levels=opts.max_levels, request_timeout_s=opts.request_timeout_s)

    def propose() -> tuple[Job, optuna.Trial] | str | None:
        """Ask the study for the next config: a job, the reason it was refused (told PRUNED, costs
        nothing), or None when the strategy has nothing to propose now."""
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not waiting and not strategy.plan_next(study):
            return None
        trial = study.ask()
        default = trial.user_attrs.get("role") == "default"
        reference = trial.user_attrs.get("reference")
        if reference is not None:
            config = {**opts.engine_args, **reference}
        else:
            config = dict(opts.engine_args) if default else suggest(trial, space)
        default = default or reference is not None  # measured as given: no constraint or memory choices
        reason = None if default else space.violation(config)
        if reason is None and not default:
            speed = prefill_speed((t.number, outcome(t)) for t in measured(study) if outcome(t)["status"] == "ok")
            reason = ruled_out(config, opts.slo, speed, typical_prompt)
        if memory is not None and not default and reason is None:
            if not vllm.on_cpu and "gpu_memory_utilization" not in config:
                config["gpu_memory_utilization"] = memory.gpu_memory_utilization(config)
            misfit = memory.misfit(config) if config.get("gpu_memory_utilization", 1) else "no utilization fits"
            reason = f"predicted not to start: {misfit}" if misfit else None
        job = Job(trial.number, config, plan, trial_dir(opts.out, trial.number))
        reason = reason or executor.misfit(job)
        twin = None if default or reason else _twin(study, trial, config)
        if reason is not None or twin is not None:
            trial.set_user_attr("skipped", reason or f"same config as trial {twin.number}")
            study.tell(trial, state=TrialState.PRUNED)
            if reason is not None:  # duplicates are TPE's noise, not news
                hooks.trial_skipped(trial.number, config, reason)
            return reason or "duplicate"
        trial.set_user_attr("config_requested", config)
        if "why" not in trial.user_attrs:
            trial.set_user_attr("why", "vLLM's defaults: the baseline" if trial.user_attrs.get("role") == "default"
                                else "given with --reference-config" if reference is not None
                                else "TPE's proposal" if opts.strategy == "optuna" else "the grid's next point")
        return job, trial

    running: dict[Future, tuple[Job, optuna.Trial]] = {}
    held: tuple[Job, optuna.Trial] | None = None  # asked, waiting for devices to free up
    announced = None  # the held trial's number once told to the hooks
    skipped = lost_in_a_row = 0
    while True:
        if (held is None and len(running) < executor.slots and skipped < MAX_SKIPPED_IN_A_ROW
                and len(measured(study)) + len(running) < opts.budget):
            proposal = propose()
            if isinstance(proposal, str):
                skipped += 1
                continue
            held = proposal
        if held is not None and announced != held[0].number:  # before submit: `Inline` runs the trial inside it
            hooks.trial_started(held[0].number, held[0].config, held[1].user_attrs.get("why", ""))
            announced = held[0].number
        if held is not None and (future := executor.submit(held[0])) is not None:
            skipped = 0
            running[future], held = held, None
            continue
        if not running:
            break
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            lost = _record(study, *running.pop(future), future, opts, memory, hooks)
            lost_in_a_row = lost_in_a_row + 1 if lost else 0
            if lost_in_a_row >= MAX_LOST_IN_A_ROW:
                raise WorkerError(f"{lost_in_a_row} trials in a row lost their worker (last: {lost}); "
                                  "their configs are queued: fix the cause and continue with --resume")
    return study, plan


def _model_len(model: str, sets: list[list[RequestSpec]]) -> int:
    """The max-model-len every searched config gets: what the longest request needs as vLLM counts it, plus
    headroom (`workload.fit`), at most the model's context. A workload longer than that is refused here."""
    longest = max(r.min_model_len for s in sets for r in s)
    try:
        context = ModelShape.from_path(model).max_position_embeddings
    except (OSError, ValueError, KeyError):
        return model_len_for(longest)
    if longest > context:
        raise ValueError(f"the workload's longest request needs max-model-len {longest}, the model's context "
                         f"is {context} tokens: shorten the workload")
    return min(model_len_for(longest), context)


def _record(study: optuna.Study, job: Job, trial: optuna.Trial, future: Future, opts: TuneOptions,
            memory: MemoryCheck | None, hooks: Hooks) -> str | None:
    """Tell the study a finished trial's outcome. A trial whose worker died is queued again; returns why."""
    try:
        out = future.result()
    except WorkerLost as e:
        requeue(study, study.get_trials(deepcopy=False)[job.number], f"worker lost: {e}")
        hooks.trial_lost(job.number, str(e))
        return str(e)
    out["artifacts"] = str(job.out_dir)
    trial.set_user_attr("outcome", out)
    if memory is not None and (out.get("startup") or {}).get("kv_cache_tokens"):
        study.set_user_attr("calibration", memory.observe(_launches(study)).model_dump())
    if out["status"] == "ok":
        trial.set_user_attr("constraints", _constraints(out, opts.slo))
        study.tell(trial, _value(out, opts.objective))
    else:
        study.tell(trial, state=TrialState.PRUNED)  # TPE ranks a failed config below every measured one
    hooks.trial_finished(job.number, out)
    return None


def _launches(study: optuna.Study) -> list[tuple[dict, int]]:
    """(config as launched, logged KV cache tokens) of every launch that logged one."""
    return [(outcome(t)["config"], outcome(t)["startup"]["kv_cache_tokens"]) for t in study.get_trials(deepcopy=False)
            if outcome(t) and (outcome(t).get("startup") or {}).get("kv_cache_tokens")]


def _value(out: dict, objective: str) -> float:
    return out["goodput_rate"] if objective == "goodput" else out["request_throughput"]


def _constraints(out: dict, slo: dict[str, float]) -> list[float]:
    """Optuna constraints (<= 0 is feasible): each p99 over its SLO, at the capacity level."""
    metrics = out["levels"][0]["metrics"]
    return [metrics[SLO_METRICS[k]] - v for k, v in slo.items()] or [0.0]


def _twin(study: optuna.Study, trial: optuna.Trial, config: dict) -> FrozenTrial | None:
    """A trial measured or running with the same config."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in [*measured(study), *running]:
        if t.number != trial.number and t.user_attrs.get("config_requested") == config:
            return t
    return None


def trial_row(t: FrozenTrial) -> dict:
    out = outcome(t) or {}
    failure = out.get("failure") or {}
    return {
        "trial": t.number, "role": t.user_attrs.get("role", "search"), "status": out.get("status"),
        "config": out.get("config"), "goodput_rate": out.get("goodput_rate"),
        "goodput_bracket": out.get("goodput_bracket"),
        "request_throughput": out.get("request_throughput"), "p99_ttft_ms": out.get("p99_ttft_ms"),
        "p99_tpot_ms": out.get("p99_tpot_ms"), "preemptions": out.get("preemptions"),
        "kv_cache_tokens": (out.get("startup") or {}).get("kv_cache_tokens"),
        "ready_s": (out.get("startup") or {}).get("ready_s"),
        "failure": f"{failure.get('kind')}: {failure.get('reason')}" if failure else None,
        "rejected_requests": out.get("rejected_requests"), "why": t.user_attrs.get("why"),
        "value": t.value if t.state == TrialState.COMPLETE else None,
    }


def budget_spent(study: optuna.Study) -> list[dict]:
    """Where the budget went and why: every launched trial (why it was proposed, what it measured) and every
    proposal skipped before launching (why), in order."""
    entries = []
    for t in study.get_trials(deepcopy=False):
        if "skipped" in t.user_attrs:
            entries.append({"trial": t.number, "launched": False, "why": t.user_attrs.get("why") or "TPE's proposal",
                            "config": t.params, "result": f"skipped: {t.user_attrs['skipped']}"})
        elif (out := outcome(t)) is not None:
            result = (f"failed ({out['failure']['kind']}): {out['failure']['reason']}" if out["status"] != "ok"
                      else f"goodput {out['goodput_rate']:.2f} {out.get('rate_unit', 'req/s')}"
                      if out.get("goodput_rate") is not None
                      else f"throughput {out['request_throughput']:.2f} req/s")
            entries.append({"trial": t.number, "launched": True, "why": t.user_attrs.get("why"),
                            "config": out["config"], "result": result})
    return entries


def _summary_entry(row: dict | None) -> dict | None:
    if row is None:
        return None
    keys = ("config", "goodput_rate", "request_throughput", "p99_ttft_ms", "p99_tpot_ms")
    return {k: row[k] for k in keys} | {"trial": row["trial"], "goodput_bracket": row["goodput_bracket"]}


def beats(row: dict, default: dict, objective: str) -> bool:
    """Whether a measured row beats the default's beyond the measurement's resolution: for goodput, its
    passing rate is at or above the rate at which the default failed (the brackets do not overlap); for
    throughput, by more than 5%."""
    if objective == "goodput":
        return row["goodput_bracket"][0] >= default["goodput_bracket"][1] > 0 or (
            default["goodput_rate"] == 0 and row["goodput_rate"] > 0)
    return row["request_throughput"] > 1.05 * default["request_throughput"]


def choose_best(rows: list[dict], objective: str) -> tuple[dict | None, dict | None, bool]:
    """(default, best, significant). The best must beat the default (`beats`); otherwise the default is
    recommended."""
    ok = [r for r in rows if r["status"] == "ok"]
    default = next((r for r in ok if r["role"] == "default"), None)
    best = max(ok, key=lambda r: r["value"] or 0.0, default=None)
    if best is None or default is None or best is default:
        return default, best or default, False
    significant = beats(best, default, objective)
    return default, best if significant else default, significant


def vllm_config_yaml(model: str, config: dict) -> str:
    """A file `vllm serve --config` accepts: kebab-case flag names, as launched."""
    flags: dict[str, Any] = {"model": model}
    for key, value in config.items():
        if key != CPU_KVCACHE_SPACE and value is not None:
            flags[key.replace("_", "-")] = value
    return yaml.safe_dump(flags, sort_keys=False)


def write_outputs(study: optuna.Study, out: Path) -> dict:
    """best.yaml, best_command.sh, trials.csv and summary.json under `out`; returns the summary."""
    meta = study.user_attrs["meta"]
    rows = [trial_row(t) for t in measured(study)]
    default, best, significant = choose_best(rows, meta["objective"])
    gain = (best["value"] / default["value"] - 1) if best and default and default["value"] else None
    confirmation = study.user_attrs.get("confirmation")
    if confirmation is not None:  # the confirmed recommendation replaces the search's
        best = next(r for r in rows if r["trial"] == confirmation["recommended_trial"])
        significant = confirmation["verdict"] == "confirmed"
        held, base = confirmation["recommended_goodput_rate"], confirmation["default_goodput_rate"]
        gain = held / base - 1 if significant and held and base else (0.0 if best is default else None)
    summary = {
        "objective": meta["objective"], "slo": meta["slo"],
        "rate_unit": "x trace speed" if meta["workload"].get("trace") else "req/s",  # a trace's rates are speed-ups
        "default": _summary_entry(default), "best": _summary_entry(best),
        "best_beats_default": significant, "gain": gain, "confirmation": confirmation,
        "budget": budget_spent(study),
        "trials": len(rows), "failed": sum(r["status"] != "ok" for r in rows),
        "skipped": sum(1 for t in study.get_trials(deepcopy=False) if "skipped" in t.user_attrs),
        "model": meta["model"], "strategy": meta["strategy"], "vllm_version": meta["vllm_version"],
        "device": meta["device"],
    }
    if best is not None:
        (out / "best.yaml").write_text(vllm_config_yaml(meta["model"], best["config"]))
        command = serve_command(meta["model"], best["config"])
        (out / "best_command.sh").write_text(f"#!/bin/sh\n# servetune: the best config found\nexec {command}\n")
        (out / "best_command.sh").chmod(0o755)
        summary["best_command"] = command
    with open(out / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv(v) for k, v in row.items()})
    write_json(out / "summary.json", summary)
    return summary


def _csv(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return " ".join(to_argv(value)) if isinstance(value, dict) else value
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 4)
    return value

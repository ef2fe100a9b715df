"""Synthetic studies shaped like `servetune tune` writes them: configs whose p99s grow with the load, measured as a
trial measures them, stored in SQLite as Optuna trials with servetune's records."""

import math
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from servetune.engine.logfacts import StartupFacts
from servetune.search.objective import RateSearch
from servetune.study.outcome import LevelOutcome, TrialOutcome
from servetune.study.storage import STUDY_NAME
from support import outcomes

KNOBS = {"max_num_batched_tokens": [2048, 4096, 8192, 16384], "max_num_seqs": [64, 128, 256, 512],
         "enable_prefix_caching": [True, False], "gpu_memory_utilization": [0.9, 0.95]}
SLO = {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 40.0}
OOM = "CUDA out of memory while profiling the KV cache (tried to allocate 2.00 GiB)"


def level(name: str, rate: float, capacity: float, tpot0: float, ttft0: float, slo: dict) -> LevelOutcome:
    """A load level of a config that serves `capacity` req/s, its p99s growing with the load."""
    load = 1.0 if math.isinf(rate) else min(rate / capacity, 0.97)
    ttft = ttft0 * 40 if math.isinf(rate) else ttft0 / (1 - load)
    metrics = {"request_throughput": capacity if math.isinf(rate) else rate * 0.99, "completed": 300, "failed": 0,
               "p99_ttft_ms": ttft, "p99_tpot_ms": tpot0 * (1 + 2 * load**3), "mean_ttft_ms": ttft / 3,
               "mean_tpot_ms": tpot0, "steady_request_rate": min(rate, capacity),
               "output_throughput": 256 * (capacity if math.isinf(rate) else rate * 0.99)}  # replies of 256 tokens
    reasons = [f"{k} {metrics['p99_' + k.split('_')[0] + '_ms']:.1f} > {v:g}" for k, v in slo.items()
               if metrics["p99_" + k.split("_")[0] + "_ms"] > v]
    return outcomes.level(name, rate, passed=not reasons, reasons=reasons,
                          server={"num_preemptions": 0.0, "kv_cache_usage_perc": 0.4 * load}, **metrics)


def ran(config: dict, capacity: float, tpot0: float, ttft0: float, objective: str = "goodput", slo=SLO,
        preemptions: int = 0) -> TrialOutcome:
    """The outcome of a config that launched and was measured like trial.run_trial measures it."""
    levels = [level("capacity", math.inf, capacity, tpot0, ttft0, slo)]
    out: dict = {"request_throughput": capacity,
                 "startup": StartupFacts(kv_cache_tokens=400_000 + 1000 * len(config), max_concurrency=97.6,
                                         ready_s=41.5)}
    if objective == "goodput":
        search = RateSearch(capacity)
        while (rate := search.next_rate()) is not None:
            levels.append(level("search", rate, capacity, tpot0, ttft0, slo))
            search.tell(rate, levels[-1].passed)
        out |= {"goodput_rate": search.goodput_rate, "goodput_bracket": search.bracket}
    passing = [lv for lv in levels if lv.passed and math.isfinite(lv.rate)]
    decisive = max(passing, key=lambda lv: lv.rate) if passing else levels[0]
    return outcomes.ok(config, levels=levels, p99_ttft_ms=decisive.metrics.p99_ttft_ms,
                       p99_tpot_ms=decisive.metrics.p99_tpot_ms, preemptions=preemptions, **out)


def failed(config: dict, kind: str, reason: str) -> TrialOutcome:
    return outcomes.failed(config, kind, reason, artifacts="trials/0003")


def make_study(path: Path, trials: list[tuple[str, dict, TrialOutcome | str]], objective: str = "goodput",
               slo=SLO, more_attrs: dict[int, dict] | None = None, meta: dict | None = None) -> str:
    """A study in SQLite at `path`: each trial is (role, params, outcome or the reason it was skipped);
    `more_attrs`: more user attributes by trial number; `meta`: the meta's values to replace."""
    storage = f"sqlite:///{path}"
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction="maximize")
    study.set_user_attr("meta", {
        "model": "meta-llama/Llama-3.1-8B-Instruct", "objective": objective, "slo": slo, "strategy": "optuna",
        "budget": len(trials), "space": {"knobs": KNOBS, "fixed": {}, "max_model_len": 2320, "context": 8192},
        "model_len": {"need": 2320, "context": 8192, "floor": 0, "max_chars_per_token": 16},
        "workload": {"input_len": {"type": "uniform", "min": 512, "max": 2048}, "output_len": {"type": "fixed",
                     "value": 256}, "request_rate": math.inf}, "vllm_version": "0.11.0", "device": "cuda",
        "out": str(path.parent)} | (meta or {}))
    for number, (role, params, result) in enumerate(trials):
        attrs = ({} if role == "search" else {"role": role}) | (more_attrs or {}).get(number, {})
        dists = {k: CategoricalDistribution(KNOBS[k]) for k in params}
        if isinstance(result, str):
            state, value, attrs = TrialState.PRUNED, None, attrs | {"skipped": result}
        else:
            value = ((result.goodput_rate if objective == "goodput" else result.request_throughput)
                     if result.ok else None)
            state = TrialState.COMPLETE if result.ok else TrialState.PRUNED
            attrs = attrs | {"outcome": result.stored()}
        study.add_trial(optuna.trial.create_trial(state=state, value=value, params=params, distributions=dists,
                                                  user_attrs=attrs))
    return storage


def tuned_study(path: Path, objective: str = "goodput") -> str:
    """Ten trials: vLLM's defaults, six measured configs (#4 the clear winner), an OOM and two skipped."""
    def run(params, *shape, **kw):
        return ("search", params, ran(dict(params), *shape, objective=objective, **kw))

    p = [dict(zip(KNOBS, values)) for values in [
        (8192, 256, True, 0.9), (2048, 128, True, 0.9), (16384, 512, False, 0.95), (8192, 512, True, 0.95),
        (2048, 64, False, 0.9), (4096, 256, False, 0.95), (16384, 128, True, 0.9), (4096, 64, True, 0.9)]]
    return make_study(path, [
        ("default", {}, ran({}, 18, 16, 180, objective)),
        run(p[0], 24, 18, 150),
        run(p[1], 16, 12, 300),
        ("search", p[2], failed(dict(p[2]), "oom", OOM)),
        run(p[3], 30, 17, 140),
        ("search", p[4], "max_num_batched_tokens 2048 < max_model_len 4096 without chunked prefill"),
        run(p[5], 21, 15, 220),
        run(p[6], 20, 22, 120, preemptions=12),
        ("search", p[3], "same config as trial 4"),
        run(p[7], 12, 11, 260),
    ], objective)

"""How many of a finished tune's "pass" verdicts hold when measured again, longer.

The rate search passes a load level of a few dozen requests when each p99 of the level is within its SLO;
over so few requests the p99 is about the maximum. This script takes every passing load level of the search
(the `target` and `search` levels of each trial's `outcome` with `passed` true, or where a level carries a
`verdict`, with verdict "pass"; never capacity or confirmation levels), launches the trial's config once
and, lowest rate first, measures each of its passing rates again: `--runs` runs of `--requests` timed
requests (8 warm-up requests before the server's first run), fresh prompts (seeds unlike the tune's) and
arrival seed = run index.

A verdict HOLDS when, over the runs' successful timed requests pooled, every p99 the study has an SLO on is
within it (TTFT, TPOT, E2EL: one value per request; ITL: every gap of every request), no run lost a request
to an error, and the runs kept up: their mean keep-up ratio >= 0.95, or short of it by no more than 1.645
pooled standard errors (`servetune.measure.verdict.fell_behind`). The study is read with plain Optuna and
dicts, so that outcomes of other schema versions read the same.

Usage: PYTHONPATH=src .venv/bin/python bench/verdicts.py --out OUT --json verdicts.json [--requests 300]
       [--runs 3] [--only-trials 0 2]
Writes each run's records and the servers' logs under OUT/verdicts/, the JSON after every verdict.
"""

import argparse
import json
import math
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import optuna

from servetune.engine import Engine, EngineFailed, launched
from servetune.loadgen import LoadShape, Target
from servetune.measure.bench import measure_level
from servetune.measure.metrics import e2el_ms, itls_ms, tpot_ms, ttft_ms
from servetune.measure.steady import fell_behind
from servetune.trial.server import reset_prefix_cache
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer

try:  # the pooled p99's bootstrap interval, reported beside it (it decides nothing)
    from servetune.tuner.confirm import p99_ci
except ImportError:
    p99_ci = None

WARMUP_REQUESTS = 8
SEED_OFFSET = 700_000  # prompt seeds: workload.seed + SEED_OFFSET + k; the tune uses + 1000 k and + 100_000 + k
# SLO name -> (the search level's metric, the per-request values its p99 is taken over)
SLOS = {
    "ttft_p99_ms": ("p99_ttft_ms", lambda r: [ttft_ms(r)]),
    "tpot_p99_ms": ("p99_tpot_ms", lambda r: [] if (t := tpot_ms(r)) is None else [t]),
    "itl_p99_ms": ("p99_itl_ms", itls_ms),
    "e2el_p99_ms": ("p99_e2el_ms", lambda r: [e2el_ms(r)]),
}


def passing_levels(study: optuna.Study) -> list[dict]:
    """Every passing finite-rate target/search level of the study: {trial, role, config, level}, by trial and rate."""
    found = []
    for t in study.get_trials(deepcopy=False):
        outcome = t.user_attrs.get("outcome") or {}
        for level in outcome.get("levels") or []:
            rate = level.get("rate")
            passed = level["verdict"] == "pass" if "verdict" in level else level.get("passed") is True
            if level.get("name") in ("target", "search") and passed and rate is not None and math.isfinite(rate):
                found.append({"trial": t.number, "role": t.user_attrs.get("role"), "config": outcome["config"],
                              "level": level})
    return sorted(found, key=lambda v: (v["trial"], v["level"]["rate"]))


def p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def judge(runs: list, slo: dict[str, float], rng: np.random.Generator) -> dict:
    """The pooled p99s, per-run p99s, keep-up and errors of one rate's runs, and whether the verdict holds."""
    ok = [[r for r in run.load.records if r.ok and not r.warmup] for run in runs]
    pooled = [r for records in ok for r in records]
    result = {"requests": len(pooled), "pooled_p99": {}, "pooled_ci": {}, "run_p99": {}}
    for name in slo:
        values = SLOS[name][1]
        result["pooled_p99"][name] = p99([x for r in pooled for x in values(r)])
        result["run_p99"][name] = [p99([x for r in records for x in values(r)]) for records in ok]
        if p99_ci is not None:
            ci = p99_ci([values(r) for r in pooled], 1000, 0.95, rng)
            result["pooled_ci"][name] = [ci["ci_low"], ci["ci_high"]]
    ratios = [run.metrics.keep_up_ratio for run in runs]
    if runs and None not in ratios:
        ratio = float(np.mean(ratios))
        se = math.sqrt(sum((run.metrics.keep_up_se or 0.0) ** 2 for run in runs)) / len(runs)
        behind = fell_behind(ratio, se)
    else:
        ratio = se = None
        behind = "fell behind: a run completed no request in its steady part"
    failed = sum(run.metrics.failed for run in runs)
    why = [f"pooled {name} {v:.1f} > {slo[name]:g}" if v is not None else f"no {name} measured"
           for name, v in result["pooled_p99"].items() if v is None or v > slo[name]]
    why += [behind] if behind else []
    why += [f"{failed} requests failed"] if failed else []
    return result | {"keep_up_ratio": ratio, "keep_up_se": se, "kept_up": behind is None, "failed": failed,
                     "holds": not why, "why": why}


def measure_rate(target: Target, workload: WorkloadSpec, tokenizer, rate: float, first_seed: int, args,
                 warmup: int, records_dir: Path) -> tuple[list, list[dict]]:
    """`args.runs` runs at `rate` (the first with `warmup` warm-up requests): their results and a summary each.
    A run whose client fell behind its own schedule is sent once more, as the search does."""
    runs, summaries = [], []
    for k in range(args.runs):
        requests = build_requests(workload, tokenizer, seed=first_seed + k, count=args.requests + warmup)
        for attempt in range(2):  # noqa: B007 (read after the loop)
            reset_prefix_cache(target.base_url)  # as the search does before a level
            run = measure_level(target, requests, LoadShape(request_rate=rate, burstiness=workload.burstiness,
                                                            max_concurrency=workload.max_concurrency,
                                                            warmup_requests=warmup, seed=k))
            if not run.metrics.client_lagging:
                break
        path = records_dir / f"rate-{rate:.4f}-run-{k}.records.jsonl"
        run.load.save(path)
        m = run.metrics
        summaries.append({"prompt_seed": first_seed + k, "arrival_seed": k, "attempts": attempt + 1,
                          "completed": m.completed, "failed": m.failed, "errors": m.errors,
                          "request_throughput": m.request_throughput, "keep_up_ratio": m.keep_up_ratio,
                          "keep_up_se": m.keep_up_se, "client_lagging": m.client_lagging,
                          "p99_schedule_lag_ms": m.p99_schedule_lag_ms, "records": str(path)})
        runs.append(run)
        warmup = 0
    return runs, summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the tune's output directory (holds study.db)")
    parser.add_argument("--json", type=Path, required=True, help="where to write the verdicts")
    parser.add_argument("--storage", help="the study's storage URL (default: sqlite:///OUT/study.db)")
    parser.add_argument("--requests", type=int, default=300, help="timed requests per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per rate (arrival seeds 0..runs-1)")
    parser.add_argument("--only-trials", type=int, nargs="+", help="only these trials' verdicts")
    parser.add_argument("--tokenizer", help="default: the study's model")
    args = parser.parse_args()

    storage = args.storage or f"sqlite:///{(args.out / 'study.db').resolve()}"
    study = optuna.load_study(study_name="servetune", storage=storage)
    meta = study.user_attrs["meta"]
    model, slo = meta["model"], {k: float(v) for k, v in meta["slo"].items()}
    workload = WorkloadSpec.model_validate(meta["workload"])
    tokenizer = load_tokenizer(args.tokenizer or model)
    verdicts = passing_levels(study)
    # numbered over the whole study: a verdict's prompts never depend on --only-trials
    for index, v in enumerate(verdicts):
        v["prompt_seed"] = workload.seed + SEED_OFFSET + args.runs * index
    chosen = [v for v in verdicts if args.only_trials is None or v["trial"] in args.only_trials]
    report = {"study": str(args.out), "model": model, "slo": slo, "requests_per_run": args.requests,
              "runs": args.runs, "warmup_requests": WARMUP_REQUESTS, "verdicts": []}
    rng = np.random.default_rng(0)
    print(f"{len(chosen)} pass verdicts to check ({len(verdicts)} in the study), SLO {slo}", flush=True)

    for trial in sorted({v["trial"] for v in chosen}):
        mine = [v for v in chosen if v["trial"] == trial]
        records_dir = args.out / "verdicts" / f"trial-{trial:04d}"
        records_dir.mkdir(parents=True, exist_ok=True)
        engine = Engine(model, mine[0]["config"], records_dir / "server.log")
        with ExitStack() as running:
            try:
                running.enter_context(launched(engine))
            except EngineFailed as e:
                for v in mine:
                    report["verdicts"].append(entry(v, slo) | {"measured": False, "why": [f"launch failed: {e}"]})
                    print(f"trial {trial} rate {v['level']['rate']:.3f}: NOT MEASURED (launch failed: {e})", flush=True)
                continue
            target = Target(engine.base_url, model, workload.endpoint)
            warmup = WARMUP_REQUESTS
            for v in mine:
                started, begun = time.time(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
                rate = v["level"]["rate"]
                runs, summaries = measure_rate(target, workload, tokenizer, rate, v["prompt_seed"], args, warmup,
                                               records_dir)
                warmup = 0
                result = judge(runs, slo, rng)
                for name in slo:
                    for s, value in zip(summaries, result["run_p99"][name]):
                        s[name] = value
                report["verdicts"].append(entry(v, slo) | {"measured": True, "runs": summaries} | result
                                          | {"started": begun, "wall_s": round(time.time() - started, 1)})
                print(line(report["verdicts"][-1], slo), flush=True)
                write(report, args.json)
    write(report, args.json)
    totals = report["totals"]
    print(f"{totals['held']} of {totals['measured']} pass verdicts held (share {totals['share']})"
          + (f"; {totals['verdicts'] - totals['measured']} not measured"
             if totals["verdicts"] > totals["measured"] else ""))


def entry(v: dict, slo: dict[str, float]) -> dict:
    level = v["level"]
    metrics = level.get("metrics") or {}
    return {"trial": v["trial"], "role": v["role"], "config": v["config"], "rate": level["rate"],
            "level": level.get("name"), "prompt_seed": v["prompt_seed"],
            "search_p99": {name: metrics.get(SLOS[name][0]) for name in slo},
            "search_requests": metrics.get("completed"), "search_keep_up_ratio": metrics.get("keep_up_ratio")}


def line(v: dict, slo: dict[str, float]) -> str:
    def fmt(x):
        return "-" if x is None else f"{x:.1f}"
    parts = [f"{name} search {fmt(v['search_p99'][name])} (n={v['search_requests']}) -> pooled "
             f"{fmt(v['pooled_p99'][name])} (n={v['requests']}; runs {' '.join(map(fmt, v['run_p99'][name]))})"
             for name in slo]
    keep = "-" if v["keep_up_ratio"] is None else f"{v['keep_up_ratio']:.3f}"
    return (f"trial {v['trial']} rate {v['rate']:.3f}: {'; '.join(parts)}; keep-up {keep}: "
            + ("HOLDS" if v["holds"] else "does not hold: " + "; ".join(v["why"])))


def write(report: dict, path: Path) -> None:
    measured = [v for v in report["verdicts"] if v["measured"]]
    held = sum(v["holds"] for v in measured)
    report["totals"] = {"verdicts": len(report["verdicts"]), "measured": len(measured), "held": held,
                        "share": round(held / len(measured), 3) if measured else None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Confirmation: before a pick is recommended, it and vLLM's defaults are launched again and measured with
long levels at their claimed goodput rate and the next rate up (where the search saw them fail), over
several arrival orders (seeds). The runs at a rate are pooled; each p99 gets a bootstrap confidence
interval. The pick stands only when it holds its rate and the defaults fail at a rate it holds; otherwise
the next candidate is tried, and failing all, the defaults are recommended.
"""

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from servetune.executors import Executor, Job
from servetune.loadgen import LoadResult, RequestRecord
from servetune.metrics import e2el_ms, itls_ms, tpot_ms, ttft_ms
from servetune.outcome import LevelOutcome, TrialOutcome
from servetune.search.objective import SLO_METRICS, fell_behind, level_verdict
from servetune.trial import TrialPlan

# SLO name -> the per-request values its p99 is taken over (ITL: every gap of every request)
PER_REQUEST: dict[str, Callable[[RequestRecord], list[float]]] = {
    "ttft_p99_ms": lambda r: [ttft_ms(r)],
    "tpot_p99_ms": lambda r: [t] if (t := tpot_ms(r)) is not None else [],
    "itl_p99_ms": itls_ms,
    "e2el_p99_ms": lambda r: [e2el_ms(r)],
}


@dataclass(frozen=True)
class ConfirmOptions:
    """How hard to confirm: requests per run, arrival orders per rate, candidates to try, bootstrap draws."""

    requests: int = 300
    seeds: int = 3
    candidates: int = 2
    bootstrap: int = 1000
    confidence: float = 0.95


def p99_ci(per_request: Sequence[Sequence[float]], draws: int, confidence: float,
           rng: np.random.Generator) -> dict[str, float | None]:
    """p99 of all values pooled, with a percentile-bootstrap interval that resamples whole requests (a
    request's ITLs move together). {value, ci_low, ci_high}; None values without data."""
    lengths = np.array([len(v) for v in per_request])
    if lengths.sum() == 0:
        return {"value": None, "ci_low": None, "ci_high": None}
    values = np.concatenate([np.asarray(v, dtype=float) for v in per_request])
    owner = np.repeat(np.arange(len(per_request)), lengths)
    order = np.argsort(values)
    values, owner = values[order], owner[order]
    picks = rng.integers(0, len(per_request), size=(draws, len(per_request)))
    estimates = []
    for pick in picks:  # weighted p99: each value counts as often as its request was drawn
        cumulative = np.cumsum(np.bincount(pick, minlength=len(per_request))[owner])
        if cumulative[-1] == 0:
            continue
        estimates.append(values[np.searchsorted(cumulative, 0.99 * cumulative[-1])])
    tail = (1 - confidence) / 2
    return {"value": float(np.percentile(values, 99)), "ci_low": float(np.quantile(estimates, tail)),
            "ci_high": float(np.quantile(estimates, 1 - tail))}


def rate_result(rate: float, levels: list[LevelOutcome], out_dir: Path, slo: dict[str, float],
                opts: ConfirmOptions, rng: np.random.Generator) -> dict:
    """The runs at one rate, pooled: passed when no run lost requests or was cut short, the runs kept up
    together (mean keep-up ratio, as one long level would) and every pooled p99 is within its SLO;
    `marginal` when an interval straddles its SLO (the verdict could go either way)."""
    records = [r for lv in levels for r in LoadResult.load(out_dir / lv.records).records if r.ok and not r.warmup]
    p99 = {name: p99_ci([PER_REQUEST[name](r) for r in records], opts.bootstrap, opts.confidence, rng)
           for name in slo}
    problems = [f"seed {lv.seed}: {reason}" for lv in levels
                for reason in level_verdict(lv.metrics, {}, keep_up=False)]
    ratios = [lv.metrics.keep_up_ratio for lv in levels]
    if levels and None not in ratios:  # the runs' mean ratio, and its standard error
        se = math.sqrt(sum((lv.metrics.keep_up_se or 0.0) ** 2 for lv in levels)) / len(levels)
        behind = fell_behind(float(np.mean(ratios)), se)
    else:
        behind = "fell behind: a run completed no request in its steady part" if levels else None
    if behind:
        problems.append(f"{behind} over {len(levels)} runs")
    problems += [f"pooled {name} {p['value']:.1f} > {slo[name]:g}" if p["value"] is not None
                 else f"no {name} measured" for name, p in p99.items() if p["value"] is None or p["value"] > slo[name]]
    if len(levels) < opts.seeds:
        problems.append(f"{opts.seeds - len(levels)} of {opts.seeds} runs missing (the server stopped)")
    return {
        "rate": rate, "runs": [{"seed": lv.seed, "passed": lv.passed, "reasons": lv.reasons,
                                "completed": lv.metrics.completed, "failed": lv.metrics.failed,
                                "request_throughput": lv.metrics.request_throughput,
                                **{SLO_METRICS[n]: getattr(lv.metrics, SLO_METRICS[n]) for n in slo}} for lv in levels],
        "requests": len(records), "p99": p99, "passed": not problems, "reasons": problems,
        "marginal": any(p["ci_low"] is not None and p["ci_low"] <= slo[n] < p["ci_high"] for n, p in p99.items()),
    }


def config_result(outcome: TrialOutcome, rates: list[float], out_dir: Path, slo: dict[str, float],
                  opts: ConfirmOptions, rng: np.random.Generator) -> dict:
    """Every rate's pooled result; `confirmed_rate` is the highest rate held with every lower one held too,
    `failed_at` the lowest rate not held (None when it held them all)."""
    if not outcome.ok:
        return {"rates": [], "confirmed_rate": None, "failed_at": None, "failure": str(outcome.failure)}
    results = [rate_result(rate, [lv for lv in outcome.levels if lv.rate == rate], out_dir, slo, opts, rng)
               for rate in sorted(set(rates))]
    confirmed = failed_at = None
    for result in results:
        if not result["passed"]:
            failed_at = result["rate"]
            break
        confirmed = result["rate"]
    return {"rates": results, "confirmed_rate": confirmed, "failed_at": failed_at, "failure": None}


class Confirmation:
    """Runs the confirmation of a finished search through an executor and decides the recommendation."""

    def __init__(self, plan: TrialPlan, sets: Callable[[int], list], executor: Executor, out: Path,
                 opts: ConfirmOptions, hooks: Any):
        self.plan, self.sets, self.executor, self.out, self.opts, self.hooks = plan, sets, executor, out, opts, hooks
        self.rng = np.random.default_rng(0)
        self.runs = 0

    def _job(self, row: dict, rates: list[float]) -> tuple[Job, list[float]]:
        levels = [(rate, seed) for rate in rates for seed in range(self.opts.seeds)]
        sets = [self.sets(self.runs + k) for k in range(len(levels))]
        self.runs += len(levels)
        plan = replace(self.plan, level_sets=sets, fixed_levels=levels)
        tag = "default" if row["role"] == "default" else f"trial-{row['trial']:04d}"
        return Job(row["trial"], row["config"], plan, self.out / "confirm" / tag), rates

    def _run(self, jobs: list[tuple[Job, list[float]]]) -> list[dict]:
        """Run jobs (as many at once as the executor takes) and return each config's result."""
        results: list[dict | None] = [None] * len(jobs)
        pending = list(enumerate(jobs))
        running: list[tuple[int, Future]] = []
        announced: set[int] = set()
        while pending or running:
            while pending:
                index, (job, rates) = pending[0]
                if index not in announced:  # before submit: an in-process executor runs the job inside it
                    self.hooks.confirm_started(job.number, job.config, rates, self.opts)
                    announced.add(index)
                if (future := self.executor.submit(job)) is None:
                    break
                pending.pop(0)
                running.append((index, future))
            index, future = running.pop(0)
            job, rates = jobs[index]
            result = config_result(future.result(), rates, job.out_dir, self.plan.slo, self.opts, self.rng)
            results[index] = result | {"trial": job.number, "config": job.config, "out_dir": str(job.out_dir)}
            self.hooks.confirm_finished(job.number, results[index])
        return results

    def run(self, default: dict, candidates: list[dict]) -> dict:
        """Confirm `candidates` (search rows, best first, each beat the defaults in the search) one after
        another until one stands, with the defaults measured beside the first."""
        first = candidates[0] if candidates else None
        default_rates = next_rates(default)
        if first is not None and first["goodput_rate"] > default_rates[-1]:
            # head to head at the pick's rate, run first: it decides the verdict, and it is the fastest of the
            # defaults' rates (their own claim, lower, is what a confirmation spends most of its time on)
            default_rates.insert(0, first["goodput_rate"])
        jobs = [self._job(default, default_rates)]
        if first is not None:
            jobs.insert(0, self._job(first, next_rates(first)))
        results = self._run(jobs)
        default_result = results[-1]
        tried = results[:-1]
        verdict = _verdict(tried[0], default_result) if tried else None
        for row in candidates[1:self.opts.candidates]:
            if verdict is not None and verdict[0]:
                break
            tried.append(self._run([self._job(row, next_rates(row))])[0])
            verdict = _verdict(tried[-1], default_result)
        stands = verdict is not None and verdict[0]
        pick = tried[-1] if stands else default_result
        return {
            "requests_per_run": self.opts.requests, "seeds": self.opts.seeds, "confidence": self.opts.confidence,
            "bootstrap_draws": self.opts.bootstrap, "default": default_result, "candidates": tried,
            "verdict": "confirmed" if stands else ("not confirmed" if tried else "defaults"),
            "reason": verdict[1] if verdict else "the search found no config that beat the defaults" + _held(default_result),
            "recommended_trial": pick["trial"], "recommended_goodput_rate": pick["confirmed_rate"],
            "default_goodput_rate": default_result["confirmed_rate"],
        }


def _held(default: dict) -> str:
    """What the defaults' own confirmation says about their claimed rate."""
    if default["confirmed_rate"] is not None or not default["rates"]:
        return ""
    first = default["rates"][0]
    return (f"; the defaults did not hold their claimed {first['rate']:.2f} req/s ({'; '.join(first['reasons'][:2])}): "
            "their goodput lies below it")


def next_rates(row: dict) -> list[float]:
    """A search row's claimed goodput rate and the next rate up: where the search saw it fail."""
    low, high = row["goodput_bracket"]
    return [rate for rate in dict.fromkeys((low, high)) if rate > 0]


def _verdict(candidate: dict, default: dict) -> tuple[bool, str]:
    """(stands, why): the candidate holds a rate at which the defaults fail."""
    name, held = f"trial {candidate['trial']}", candidate["confirmed_rate"]
    if held is None:
        why = candidate["failure"] or ("; ".join(candidate["rates"][0]["reasons"]) if candidate["rates"] else "no runs")
        return False, f"{name} did not hold its claimed rate: {why}"
    failed_at = default["failed_at"]
    if failed_at is not None and held >= failed_at:
        return True, f"{name} holds {held:.2f} req/s; the defaults fail at {failed_at:.2f} req/s"
    if failed_at is None:
        return False, f"{name} holds {held:.2f} req/s, and so do the defaults at every rate measured"
    return False, f"{name} holds {held:.2f} req/s, below {failed_at:.2f} req/s where the defaults first fail"


def candidates_of(rows: list[dict], default: dict | None, significant: Callable[[dict, dict], bool]) -> list[dict]:
    """Measured configs that beat the defaults in the search beyond resolution, best first."""
    if default is None:
        return []
    ok = [r for r in rows if r["status"] == "ok" and r["role"] != "default" and r["value"] is not None
          and math.isfinite(r["value"]) and significant(r, default)]
    return sorted(ok, key=lambda r: r["value"], reverse=True)

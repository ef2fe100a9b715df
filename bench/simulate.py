"""The tuner on the simulated engine (`servetune.testing.simengine`), over many generated scenarios: every tune with a
15-minute limit, and the same tune without a limit, judged against the scenario's truth: the recommendation, and
every trial's measured goodput beside its config's true goodput. Writes the per-scenario rows (JSON) and prints the
tables docs/results/simulated.md records.

usage: .venv/bin/python bench/simulate.py [--scenarios 1000] [--workers 2] [--tunes limited unlimited]
           [--json docs/results/simulated.json]
"""

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from servetune.testing.simengine import (
    CLEAR_GAIN,
    DECIDABLE_RATE,
    WORKLOADS,
    draw_scenario,
    judge,
    simulate,
    true_goodput,
)
from servetune.workload import WorkloadSpec

MODEL = Path(__file__).resolve().parents[1] / ".cache" / "tiny-llama"
LIMIT_S = 900.0


def run(seed: int, tunes: tuple[str, ...] = ("limited", "unlimited")) -> dict:
    scenario = draw_scenario(seed, limit_s=LIMIT_S)
    row = {"seed": seed, "device": scenario.device, "slo": sorted(scenario.slo), "budget": scenario.budget,
           "workload": family(scenario), "fail_share": scenario.fail_share}
    for name, limit in (("limited", LIMIT_S), ("unlimited", None)):
        if name not in tunes:
            continue
        started = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as out:
                result = simulate(replace(scenario, limit_s=limit), MODEL, Path(out) / "out")
        except Exception as e:  # a crash is a finding, not the end of the run
            row[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        judged = judge(scenario, result, ladder="limited" in tunes)  # the ladder: the recommendation table's
        workload = WorkloadSpec.model_validate(scenario.workload)
        one_run = {row.trial: true_goodput(scenario.physics(row.config), scenario.slo, workload, runs=1)
                   for row in result.rows if row.ok}  # the truth of one run, as the judge had it before 8 pooled
        spent = result.summary.time
        row[name] = {"answer": result.summary.answer, "state": result.summary.state, "ended_by": result.ended_by,
                     "elapsed_s": round(result.elapsed_s, 1), "unused_s": spent.unused_s,
                     "next_trial_s": spent.next_trial_s, "launched": len(result.rows),
                     "defaults_true": judged.defaults, "recommended_true": judged.recommended,
                     "best_true": judged.best, "clear_gain": judged.clear_gain, "decidable": judged.decidable,
                     "named": judged.named, "wall_s": round(time.perf_counter() - started, 2),
                     "trials": [{"trial": t.trial, "measured": t.measured, "truth": t.truth, "closed": t.searched,
                                 "decidable": t.decidable, "truth_one_run": one_run.get(t.trial)}
                                for t in judged.trials]}
    return row


def family(scenario) -> str:
    """The name of the scenario's workload in WORKLOADS."""
    return next(name for name, spec in WORKLOADS.items()
                if all(scenario.workload.get(k) == v for k, v in spec.items()))


def share(part: list, whole: list) -> str:
    return f"{len(part)} of {len(whole)} ({100 * len(part) / len(whole):.0f}%)" if whole else "0 of 0"


def report(rows: list[dict]) -> str:
    lim = [r for r in rows if "error" not in r["limited"]]
    errors = [r["seed"] for r in rows if "error" in r["limited"] or "error" in r["unlimited"]]
    answered = [r for r in lim if r["limited"]["answer"]]
    by_time = [r for r in lim if r["limited"]["ended_by"] == "time"]
    used = [r for r in by_time if r["limited"]["elapsed_s"] >= 0.9 * LIMIT_S
            or r["limited"]["unused_s"] <= (r["limited"]["next_trial_s"] or 0)]
    high = [r for r in by_time if r["limited"]["elapsed_s"] >= 0.9 * LIMIT_S]
    clear = [r for r in lim if r["limited"]["clear_gain"]]
    decidable = [r for r in lim if r["limited"]["decidable"]]
    both = [r for r in lim if "error" not in r["unlimited"]]
    reach = [r for r in both if r["unlimited"]["named"] and r["unlimited"]["elapsed_s"] <= LIMIT_S]
    unl = [r for r in both if r["unlimited"]["named"]]
    lines = [
        f"| scenarios | {len(rows)} (crashed: {len(errors)} {errors[:10]}) |",
        f"| ended with an answer (15 min) | {share(answered, lim)} |",
        f"| ended by the time limit | {len(by_time)}; of them used >= 90% of it: {share(high, by_time)}; used it or "
        f"left less than one trial's cost: {share(used, by_time)} |",
        f"| a config of the chunk ladder >= {CLEAR_GAIN}x the defaults' true goodput | {len(clear)}; named in 15 "
        f"min: {share([r for r in clear if r['limited']['named']], clear)} |",
        f"| ... whose deciding level is short (>= {DECIDABLE_RATE:g} req/s) | {len(decidable)}; named: "
        f"{share([r for r in decidable if r['limited']['named']], decidable)} |",
        f"| the tune without a limit names one | {len(unl)}; the 15-min tune too: "
        f"{share([r for r in unl if r['limited']['named']], unl)} |",
        f"| ... and did so within 15 simulated minutes | {len(reach)}; the 15-min tune too: "
        f"{share([r for r in reach if r['limited']['named']], reach)} |",
        f"| simulated minutes the unlimited tunes took (median, max) | "
        f"{statistics.median(r['unlimited']['elapsed_s'] for r in both) / 60:.0f}, "
        f"{max(r['unlimited']['elapsed_s'] for r in both) / 60:.0f} |",
        f"| wall seconds per scenario, both tunes (median) | "
        f"{statistics.median(r['limited']['wall_s'] + r['unlimited']['wall_s'] for r in both):.1f} |",
    ]
    return "\n".join(["| | |", "|---|---|", *lines])


def trials_report(rows: list[dict], tune: str) -> str:
    """Every trial of the `tune` ("limited" or "unlimited") that measured a goodput, its ratio to its truth, by
    reply family: all of them, those whose truth levels can decide (`TrialTruth.decidable`), and of those the ones
    whose search closed in on its rate."""
    def ratios(select) -> list[float]:
        return [t["measured"] / t["truth"] for r in rows if "error" not in r[tune] for t in r[tune]["trials"]
                if t["measured"] and t["truth"] and select(r, t)]

    def line(name: str, select) -> str:
        all_, dec = ratios(select), ratios(lambda r, t: select(r, t) and t["decidable"])
        closed = ratios(lambda r, t: select(r, t) and t["decidable"] and t["closed"])
        def within(values):
            return f"{share([v for v in values if 0.85 <= v <= 1.05], values)}" if values else "-"
        def above(values):
            return f"{share([v for v in values if v > 1.05], values)}" if values else "-"
        median = f"{statistics.median(dec):.2f}" if dec else "-"
        return (f"| {name} | {len(all_)} | {above(all_)} | {len(dec)} | {above(dec)} | median {median} | "
                f"{within(closed)} |")

    head = ["| workload | trials with a goodput | above 1.05x | decidable | decidable above 1.05x | ratio | "
            "decidable, closed: within 0.85-1.05x |", "|---|---|---|---|---|---|---|"]
    families = sorted({r["workload"] for r in rows})
    return "\n".join(head + [line(f, lambda r, t, f=f: r["workload"] == f) for f in families]
                     + [line("all", lambda r, t: True)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=1000)
    parser.add_argument("--first", type=int, default=0, help="the first scenario's seed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tunes", nargs="+", choices=("limited", "unlimited"), default=["limited", "unlimited"],
                        help="the 15-minute tune, the tune without a limit, or both (the recommendation table)")
    parser.add_argument("--json", type=Path, default=Path("docs/results/simulated.json"))
    args = parser.parse_args()
    started = time.time()
    rows = []
    with ProcessPoolExecutor(args.workers) as pool:
        seeds = range(args.first, args.first + args.scenarios)
        for done in as_completed([pool.submit(run, seed, tuple(args.tunes)) for seed in seeds]):
            rows = sorted([*rows, done.result()], key=lambda r: r["seed"])
            args.json.write_text(json.dumps(rows, indent=1) + "\n")  # what a stopped run leaves is still rows
    if set(args.tunes) == {"limited", "unlimited"}:
        print(report(rows))
    for tune in args.tunes:
        print(f"\nevery trial's goodput against its truth, {tune}:\n{trials_report(rows, tune)}")
    print(f"\n{len(rows)} scenarios in {time.time() - started:.0f} s with {args.workers} workers; rows in {args.json}")


if __name__ == "__main__":
    main()

"""Every decidable trial of a `bench/simulate.py` run (`--json`) judged again against a truth from runs the judge
never used: the same `true_goodput`, pooled over INDEPENDENT runs of other seeds. Outside 0.85-1.05x of a truth
that moves ~2-3% between seed sets, some trials land outside by the truth's noise alone, and picking those that did
picks truths that were low or high by chance; an independent truth says which stay outside. One JSON line per trial,
then the counts (docs/results/simulated.md).

    PYTHONPATH=src SERVETUNE_NO_VLLM=1 python3 bench/sim_truth_again.py ROWS.json.gz --workers 2 > again.jsonl
    python3 bench/sim_truth_again.py ROWS.json.gz --count again.jsonl
"""

import argparse
import gzip
import json
import math
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

import servetune.testing.simengine as sim
from servetune.workload import WorkloadSpec

MODEL = Path(__file__).resolve().parents[1] / ".cache" / "tiny-llama"
SEED = sim.TRUE_SEED + sim.TRUE_RUNS  # the first seed after the judge's runs
INDEPENDENT = 24  # runs pooled: three times the judge's


def rows_of(path: Path) -> dict[int, dict]:
    opened = gzip.open(path) if path.suffix == ".gz" else path.open()
    return {r["seed"]: r for r in json.load(opened) if "trials" in r.get("unlimited", {})}


def again(seed: int, stored: dict) -> list[dict]:
    """Seed `seed`'s unlimited tune run again (deterministic: its goodputs must equal `stored`'s) and each decidable
    trial's truth from INDEPENDENT runs of seeds SEED, SEED + 1, ..."""
    scenario = replace(sim.draw_scenario(seed), limit_s=None)
    with tempfile.TemporaryDirectory() as out:
        result = sim.simulate(scenario, MODEL, Path(out) / "out")
    workload = WorkloadSpec.model_validate(scenario.workload)
    rows = {r.trial: r for r in result.rows}
    lines = []
    for t in stored["unlimited"]["trials"]:
        if not t["decidable"] or t["measured"] is None:
            continue
        rerun = rows[t["trial"]]
        if not math.isclose(rerun.goodput_rate or 0.0, t["measured"], rel_tol=1e-9):
            raise SystemExit(f"seed {seed} trial {t['trial']}: measured {rerun.goodput_rate}, stored {t['measured']}")
        truth = sim.true_goodput(scenario.physics(rerun.config), scenario.slo, workload, SEED, INDEPENDENT)
        lines.append({"seed": seed, "workload": stored["workload"], "trial": t["trial"], "measured": t["measured"],
                      "judge_truth": t["truth"], "truth": truth, "closed": t["closed"],
                      "levels": scenario.max_levels})
    return lines


def count(lines: list[dict]) -> str:
    """Above 1.05x, below 0.85x and within, against the judge's truth and the independent one; the spread of the
    two truths' log ratio (sd of the difference of two estimates: about sqrt(1 + 8/24) x one 8-run truth's se)."""
    out = [f"decidable trials {len(lines)} (seeds {len({x['seed'] for x in lines})})"]
    for key, name in (("judge_truth", f"the judge's truth ({sim.TRUE_RUNS} runs, seeds {sim.TRUE_SEED}-)"),
                      ("truth", f"an independent truth ({INDEPENDENT} runs, seeds {SEED}-)")):
        ratios = [x["measured"] / x[key] for x in lines]
        above = sorted((round(q, 3), x["seed"], x["trial"]) for q, x in zip(ratios, lines, strict=True) if q > 1.05)
        below = sorted((round(q, 3), x["seed"], x["trial"]) for q, x in zip(ratios, lines, strict=True) if q < 0.85)
        out.append(f"against {name}: above 1.05x {len(above)}, below 0.85x {len(below)}, "
                   f"within {len(lines) - len(above) - len(below)}; median {statistics.median(ratios):.3f}")
        out.append(f"  above: {above}")
        out.append(f"  below: {below}")
    diffs = [math.log(x["judge_truth"] / x["truth"]) for x in lines if x["truth"] and x["judge_truth"]]
    out.append(f"log(judge's truth / independent truth): mean {statistics.mean(diffs):+.4f}, "
               f"sd {statistics.stdev(diffs):.4f}, |.| > 0.05 in {sum(abs(d) > 0.05 for d in diffs)} of {len(diffs)}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path, help="a bench/simulate.py --json file (.json or .json.gz)")
    parser.add_argument("--seeds", help="only these (comma-separated)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--count", type=Path, help="no runs: count the JSON lines of an earlier run")
    args = parser.parse_args()
    if args.count:
        print(count([json.loads(line) for line in args.count.open() if line.strip()]))
        return
    stored = rows_of(args.rows)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else sorted(stored)
    with ProcessPoolExecutor(args.workers) as pool:
        for done in as_completed([pool.submit(again, s, stored[s]) for s in seeds]):
            for line in done.result():
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

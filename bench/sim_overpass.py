"""Why a simulated trial measured above 1.05x its truth: for every decidable trial of a `bench/simulate.py` run
(`--json`) that did, its config's truth, its saturated throughput (the truth is capped there: `capped`), the largest
log(p99 / bound) at the measured rate in long runs of three seeds (<= 0: the config holds the SLOs there), and with
`--truths` the truth itself by seed, from runs of at least 2,000 and of at least 10,000 requests. One JSON line per
trial (docs/results/simulated.md).

    python3 bench/sim_overpass.py docs/results/simulated/trials-320-619d0fc.json.gz --truths
"""

import argparse
import gzip
import json
import math
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import servetune.testing.simengine as sim
from servetune.workload import WorkloadSpec

MODEL = Path(__file__).resolve().parents[1] / ".cache" / "tiny-llama"
SEEDS = (7, 8, 9)


def over(path: Path) -> list[int]:
    """The seeds with a decidable trial above 1.05x its truth in the run at `path`."""
    rows = json.load(gzip.open(path) if path.suffix == ".gz" else path.open())
    return sorted({r["seed"] for r in rows for t in r["unlimited"].get("trials", [])
                   if t["decidable"] and t["measured"] and t["measured"] > 1.05 * t["truth"]})


def explain(seed: int, truths: bool) -> list[dict]:
    requests = sim.TRUE_REQUESTS
    scenario = replace(sim.draw_scenario(seed), limit_s=None)
    with tempfile.TemporaryDirectory() as out:
        result = sim.simulate(scenario, MODEL, Path(out) / "out")
    workload = WorkloadSpec.model_validate(scenario.workload)
    found = []
    for t in sim.judge(scenario, result, ladder=False).trials:
        if not (t.decidable and t.measured and t.measured > 1.05 * t.truth):
            continue
        physics = scenario.physics(next(r for r in result.rows if r.trial == t.trial).config)
        capacity = sim.saturated_throughput(physics, workload)
        margins = {}
        for s in SEEDS:
            p99 = sim.p99s(physics, workload, t.measured, s, tuple(scenario.slo))
            margins[s] = round(max(math.log(max(p99[k], 1e-9) / b) for k, b in scenario.slo.items()), 3)
        line = {"seed": seed, "trial": t.trial, "ratio": round(t.measured / t.truth, 3),
                "measured": round(t.measured, 2), "truth": round(t.truth, 2), "capacity": round(capacity, 2),
                "capped": abs(capacity - t.truth) < 1e-6, "margin_at_measured": margins}
        if truths:
            for least in (2_000, 10_000):
                sim.TRUE_REQUESTS = (least, requests[1])
                sim._TRUTHS.clear()
                line[f"truth_by_seed_{least}"] = [round(sim.true_goodput(physics, scenario.slo, workload, s, runs=1), 2)
                                                  for s in SEEDS]
            sim.TRUE_REQUESTS = requests
            sim._TRUTHS.clear()
        found.append(line)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", type=Path)
    parser.add_argument("--truths", action="store_true", help="the truth by seed too (slow)")
    parser.add_argument("--seeds", help="only these of them (comma-separated)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    seeds = over(args.trials)
    if args.seeds:
        seeds = [s for s in seeds if str(s) in args.seeds.split(",")]
    with ProcessPoolExecutor(args.workers) as pool:
        for lines in pool.map(explain, seeds, [args.truths] * len(seeds)):
            for line in lines:
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

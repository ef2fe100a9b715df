"""Does a pass just under a cliff measure above its truth? On fresh seeds: each seed's unlimited tune (the simulated
engine), every decidable trial's measured goodput against its truth (`judge`, as bench/simulate.py), and whether its
pass sits under a cliff: the lowest rate above it not passed is within CLIFF_SPAN of it and failed by far (saturated,
or a p99 at least FAR_P99 x its bound). The criterion was read off seeds 503-634 (`../why-outside-97ef012/`), and is
frozen here before these seeds run. One JSON line per decidable trial.

    PYTHONPATH=src SERVETUNE_NO_VLLM=1 python3 docs/results/simulated/cliffs/cliffs.py 635-765 WORKERS > fresh.jsonl
    python3 docs/results/simulated/cliffs/cliffs.py --count fresh.jsonl
"""
import json
import math
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

CLIFF_SPAN = 1.10
FAR_P99 = 2.0


def cliff(goodput, levels, slo) -> dict | None:
    """The failed level just above `goodput` where it makes a cliff: its rate / goodput and its largest p99 / bound."""
    above = [lv for lv in levels if math.isfinite(lv.rate) and lv.rate > goodput and not lv.passed
             and str(lv.verdict) == "fail"]
    if not goodput or not above:
        return None
    nxt = min(above, key=lambda lv: lv.rate)
    p99 = max((s.latency.p99(nxt.metrics) / s.bound_ms for s in slo), default=0.0)
    saturated = str(nxt.stopped) == "saturated"
    if nxt.rate / goodput <= CLIFF_SPAN and (saturated or p99 >= FAR_P99):
        return {"step": round(nxt.rate / goodput, 3), "p99_x": round(p99, 2), "saturated": saturated}
    return None


def one(seed: int) -> list[dict]:
    import servetune.testing.simengine as sim
    from servetune.measure.slo import parse_slo

    model = Path(".cache/tiny-llama").resolve()
    scenario = replace(sim.draw_scenario(seed), limit_s=None)
    with tempfile.TemporaryDirectory() as out:
        result = sim.simulate(scenario, model, Path(out) / "o")
    judged = sim.judge(scenario, result, ladder=False)
    rows, slo = {r.trial: r for r in result.rows}, parse_slo(scenario.slo)
    return [{"seed": seed, "trial": t.trial, "measured": t.measured, "truth": t.truth, "closed": t.searched,
             "max_levels": scenario.max_levels, "cliff": cliff(t.measured, rows[t.trial].levels, slo)}
            for t in judged.trials if t.decidable and t.measured]


def count(path: str) -> None:
    lines = [json.loads(x) for x in open(path) if x.strip() and "error" not in x]
    table = Counter()
    for t in lines:
        ratio = t["measured"] / t["truth"]
        side = "above 1.05x" if ratio > 1.05 else "below 0.85x" if ratio < 0.85 else "within"
        table[(bool(t["cliff"]), side)] += 1
        if t["cliff"]:
            print(f"cliff: seed {t['seed']} trial {t['trial']}: {ratio:.3f}x its truth, {t['cliff']}")
    for flagged in (True, False):
        n = sum(v for (f, _), v in table.items() if f == flagged)
        print(f"{'under a cliff' if flagged else 'not under one'}: {n} trials:",
              ", ".join(f"{side} {table[(flagged, side)]}" for side in ("above 1.05x", "within", "below 0.85x")))
    ratios = [t["measured"] / t["truth"] for t in lines if t["cliff"]]
    if ratios:
        print(f"under a cliff, measured / truth: {min(ratios):.3f}-{max(ratios):.3f}; at 0.95x the measured: "
              f"{sum(0.85 <= 0.95 * r <= 1.05 for r in ratios)} of {len(ratios)} within 0.85-1.05x")


if __name__ == "__main__":
    if sys.argv[1] == "--count":
        count(sys.argv[2])
        sys.exit()
    first, last = map(int, sys.argv[1].split("-"))
    with ProcessPoolExecutor(int(sys.argv[2])) as pool:
        for f in as_completed([pool.submit(one, s) for s in range(first, last + 1)]):
            try:
                for line in f.result():
                    print(json.dumps(line), flush=True)
            except Exception as e:  # a crash is a finding
                print(json.dumps({"error": repr(e)}), flush=True)

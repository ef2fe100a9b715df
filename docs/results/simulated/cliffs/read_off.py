"""Where the cliff criterion of cliffs.py was read off: seeds 503-634 (97ef012's search), each decidable trial's
levels (`../why-outside-97ef012/levels-503-634.jsonl.gz`) beside its measured / judge's truth
(`../why-outside-97ef012/again-503-634.jsonl`). Those levels keep each level's margin (the largest log(p99 / bound),
or the keep-up term where it is larger), not its p99s: a far failure here is saturated or a margin >= log 2.

    python3 read_off.py > read_off.log
"""
import gzip
import json
import math
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent / ".." / "why-outside-97ef012"
levels = {(x["seed"], x["trial"]): x for x in map(json.loads, gzip.open(HERE / "levels-503-634.jsonl.gz")) if "seed" in x}
table, flagged = Counter(), []
for t in map(json.loads, open(HERE / "again-503-634.jsonl")):
    ratio = t["measured"] / t["judge_truth"]
    side = "above 1.05x" if ratio > 1.05 else "below 0.85x" if ratio < 0.85 else "within"
    trial = levels[(t["seed"], t["trial"])]
    above = [lv for lv in trial["levels"] if math.isfinite(lv["rate"]) and lv["rate"] > trial["goodput"]
             and lv["verdict"] == "fail"]
    nxt = min(above, key=lambda lv: lv["rate"]) if above else None
    cliff = bool(nxt and nxt["rate"] / trial["goodput"] <= 1.10
                 and (nxt["stopped"] == "saturated" or (nxt["margin"] or 0) >= math.log(2)))
    table[(cliff, side)] += 1
    if cliff:
        flagged.append(ratio)
        print(f"cliff: seed {t['seed']} trial {t['trial']}: {ratio:.3f}x its truth, next fail at "
              f"{nxt['rate'] / trial['goodput']:.3f}x ({nxt['stopped']}, margin {nxt['margin']:.2f})")
for cliff in (True, False):
    n = sum(v for (c, _), v in table.items() if c == cliff)
    print(f"{'under a cliff' if cliff else 'not under one'}: {n} trials:",
          ", ".join(f"{side} {table[(cliff, side)]}" for side in ("above 1.05x", "within", "below 0.85x")))
print(f"under a cliff, measured / truth: {min(flagged):.3f}-{max(flagged):.3f}; at 0.95x the measured: "
      f"{sum(0.85 <= 0.95 * r <= 1.05 for r in flagged)} of {len(flagged)} within 0.85-1.05x")

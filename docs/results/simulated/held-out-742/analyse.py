"""Decidable trials of the unlimited tunes in bench/simulate.py rows (json or json.gz): within 0.85-1.05x of their
truth, above, below; one-sided 95% Clopper-Pearson bounds; by workload family and closed/open; every trial outside.
By the scenario's --max-levels too (drawn again: `simengine.draw_scenario`, so run with PYTHONPATH=src).
usage: python3 analyse.py ROWS [FIRST]   (only the longest complete prefix FIRST..N is counted; FIRST defaults to the
lowest seed)"""
import gzip, json, sys
from collections import defaultdict
from scipy.stats import beta

from servetune.testing.simengine import draw_scenario

rows = json.load(gzip.open(sys.argv[1]) if sys.argv[1].endswith(".gz") else open(sys.argv[1]))
seeds = {r["seed"] for r in rows}
first = int(sys.argv[2]) if len(sys.argv) > 2 else min(seeds)
last = first
while last + 1 in seeds:
    last += 1
prefix = [r for r in sorted(rows, key=lambda r: r["seed"]) if first <= r["seed"] <= last]
print(f"rows back: {len(rows)} (seeds {min(seeds)}-{max(seeds)}); longest complete prefix: {first}-{last} "
      f"({len(prefix)} seeds); rows past it left out: {sorted(s for s in seeds if s > last)}")
crashed = [r["seed"] for r in prefix if "error" in r["unlimited"]]
print(f"crashed tunes in the prefix: {len(crashed)} {crashed} "
      + "; ".join(r["unlimited"]["error"] for r in prefix if "error" in r["unlimited"]))

trials = []  # (seed, family, trial, ratio, closed)
for r in prefix:
    if "error" in r["unlimited"]:
        continue
    for t in r["unlimited"]["trials"]:
        if t["measured"] and t["truth"] and t["decidable"]:
            trials.append((r["seed"], r["workload"], t["trial"], t["measured"] / t["truth"], t["closed"],
                           t["measured"] / t["truth_one_run"] if t.get("truth_one_run") else None,
                           draw_scenario(r["seed"]).max_levels))


def lower(k, n):
    return beta.ppf(0.05, k, n - k + 1) if k > 0 else 0.0


def upper(k, n):
    return beta.ppf(0.95, k + 1, n - k) if k < n else 1.0


def line(name, sel):
    n = len(sel)
    w = sum(0.85 <= x[3] <= 1.05 for x in sel)
    a = sum(x[3] > 1.05 for x in sel)
    b = sum(x[3] < 0.85 for x in sel)
    if not n:
        return f"| {name} | 0 | - | - | - |"
    return (f"| {name} | {n} | {w} ({100 * w / n:.1f}%, >= {100 * lower(w, n):.1f}%) | "
            f"{a} ({100 * a / n:.1f}%, <= {100 * upper(a, n):.1f}%) | {b} ({100 * b / n:.1f}%, <= {100 * upper(b, n):.1f}%) |")


print(f"\ndecidable trials with a measured goodput and a truth; ratio = measured / truth; one-sided 95% Clopper-Pearson "
      f"bounds (lower for within, upper for above and below)\n")
print("| trials | n | within 0.85-1.05x (share, lower bound) | above 1.05x (share, upper bound) | below 0.85x (share, upper bound) |")
print("|---|---|---|---|---|")
print(line("all", trials))
for fam in sorted({x[1] for x in trials}):
    print(line(f"workload {fam}", [x for x in trials if x[1] == fam]))
for levels in (4, 5, 6):
    print(line(f"--max-levels {levels}", [x for x in trials if x[6] == levels]))
print(line("closed", [x for x in trials if x[4]]))
print(line("open", [x for x in trials if not x[4]]))
for fam in sorted({x[1] for x in trials}):
    for c in (True, False):
        print(line(f"{fam}, {'closed' if c else 'open'}", [x for x in trials if x[1] == fam and x[4] == c]))

out = [x for x in trials if not 0.85 <= x[3] <= 1.05]
print(f"\nevery decidable trial outside 0.85-1.05x ({len(out)}): seed, workload, trial, ratio, closed/open, "
      f"ratio to one run's truth")
for s, fam, tr, ratio, closed, one, levels in out:
    print(s, fam, "trial", tr, "%.2fx" % ratio, "closed" if closed else "open", f"{levels} levels",
          "(one run's truth: %.2fx)" % one if one else "")

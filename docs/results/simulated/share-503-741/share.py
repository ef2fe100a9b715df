"""Issue 36's simulated goal as a share: the decidable trials of seeds 503-741 (the tuning of 97ef012 / 6224a1e,
which tune alike) within 0.85-1.05x of their truth, above and below, with one-sided 95% Clopper-Pearson bounds, by the
scenario's --max-levels. Inputs: ../tie-search/head-503-634-device.json.gz (bench/simulate.py rows; seed 558 crashed
there, its row after the fix is ../tie-search/seed-558-e246983.json) and ../cliffs/fresh-635-741.jsonl (one row per
decidable trial, with its max_levels)."""
import gzip
import json
from pathlib import Path

from scipy.stats import beta

HERE = Path(__file__).parent


def trials():
    from servetune.testing.simengine import draw_scenario  # the scenario's max_levels, as drawn

    rows = json.load(gzip.open(HERE / "../tie-search/head-503-634-device.json.gz"))
    rows = [r for r in rows if "error" not in r["unlimited"]]
    rows += json.load(open(HERE / "../tie-search/seed-558-e246983.json"))
    for row in rows:
        levels = draw_scenario(row["seed"]).max_levels
        for t in row["unlimited"]["trials"]:
            if t["measured"] and t["truth"] and t["decidable"]:
                yield row["seed"], levels, t["measured"] / t["truth"], t["closed"]
    for line in open(HERE / "../cliffs/fresh-635-741.jsonl"):
        t = json.loads(line)
        yield t["seed"], t["max_levels"], t["measured"] / t["truth"], t["closed"]


def lower(k, n):
    return beta.ppf(0.05, k, n - k + 1) if k else 0.0


def upper(k, n):
    return beta.ppf(0.95, k + 1, n - k) if k < n else 1.0


def line(name, ratios):
    n = len(ratios)
    within = sum(0.85 <= r <= 1.05 for r in ratios)
    above = sum(r > 1.05 for r in ratios)
    below = sum(r < 0.85 for r in ratios)
    return (f"| {name} | {n} | {within} ({100 * within / n:.1f}%, >= {100 * lower(within, n):.1f}%) | "
            f"{above} ({100 * above / n:.1f}%, <= {100 * upper(above, n):.1f}%) | "
            f"{below} ({100 * below / n:.1f}%, <= {100 * upper(below, n):.1f}%) |")


rows = list(trials())
print("| decidable trials, seeds 503-741 | n | within 0.85-1.05x (share, 95% lower bound) | above 1.05x (upper bound) "
      "| below 0.85x (upper bound) |")
print("|---|---|---|---|---|")
print(line("all", [r for _, _, r, _ in rows]))
for levels in (4, 5, 6):
    print(line(f"--max-levels {levels}", [r for _, m, r, _ in rows if m == levels]))
print(line("closed brackets", [r for _, _, r, c in rows if c]))
print(line("open brackets", [r for _, _, r, c in rows if not c]))

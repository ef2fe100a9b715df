"""Summarise a `bench/search_vs_grid.sh OUT ...` run as markdown: per workload, every grid config's goodput and time,
and each search arm's answer, its goodput as a fraction of the grid's best, and its time as a fraction of the grid's.

    python bench/search_vs_grid.py OUT > table.md

An arm's goodput is its best trial's (the search's own measurement, `summary.json` `best`); the recommended one (after
the head-to-head) is shown beside it. A goodput rate is the highest rate the rate search passed: its bracket (passed,
failed) says how finely it was located.
"""

import csv
import json
import sys
from pathlib import Path

from servetune.study import Summary


def flags(config: dict) -> str:
    return " ".join(f"{k.replace('_', '-')}={v}" for k, v in config.items()) or "vLLM's defaults"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(out: Path) -> None:
    times: dict[str, dict[str, tuple[float, int]]] = {}
    with open(out / "times.tsv") as f:
        for name, arm, seconds, rc in csv.reader(f, delimiter="\t"):
            times.setdefault(name, {})[arm] = (float(seconds), int(rc))
    for name, arms in times.items():
        summaries = {arm: Summary.model_validate_json((out / name / arm / "summary.json").read_text()) for arm in arms}
        grid = {arm: s for arm, s in summaries.items() if arm.startswith("grid-")}
        grid_s = sum(times[name][arm][0] for arm in grid)
        best_arm = max(grid, key=lambda arm: grid[arm].best.goodput_rate or 0 if grid[arm].best else 0)
        grid_best = grid[best_arm].best.goodput_rate
        print(f"### {name}: {', '.join(f'{k} <= {v:g}' for k, v in next(iter(summaries.values())).slo.items())}\n")
        print("| grid config | goodput (req/s) | bracket | time |\n|---|---|---|---|")
        for arm, s in grid.items():
            bracket = s.best.goodput_bracket if s.best else None
            shown = f"[{bracket[0]:.2f}, {bracket[1]:.2f}]" if bracket else "-"
            mark = " **(best)**" if arm == best_arm else ""
            chunk, seqs = arm.removeprefix("grid-").split("-")
            print(f"| chunk {chunk}, max-num-seqs {seqs}{mark} | "
                  f"{rate(s.best.goodput_rate if s.best else None)} | {shown} | {times[name][arm][0] / 60:.1f} min |")
        print(f"\nGrid: {len(grid)} configs, {grid_s / 60:.1f} min, best {rate(grid_best)} req/s.\n")
        print("| arm | state | launched | best goodput (req/s) | of grid's best | recommended (req/s) | time | of grid's "
              "time | best config |\n|---|---|---|---|---|---|---|---|---|")
        for arm, s in summaries.items():
            if arm in grid:
                continue
            seconds, _ = times[name][arm]
            best = s.best.goodput_rate if s.best else None
            share = f"{best / grid_best:.0%}" if best and grid_best else "-"
            launched = sum(1 for b in s.budget if b.launched)
            print(f"| {arm} | {s.state} | {launched} | {rate(best)} | {share} | "
                  f"{rate(s.confirmation.recommended_goodput_rate)} | {seconds / 60:.1f} min | {seconds / grid_s:.0%} | "
                  f"{flags(s.best.config) if s.best else '-'} |")
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

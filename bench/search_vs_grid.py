"""Summarise a `bench/search_vs_grid.sh OUT ...` run as markdown: per workload, every grid config's goodput and time,
and each search arm's answer, its goodput as a fraction of the grid's best, and its time as a fraction of the grid's.

    python bench/search_vs_grid.py OUT > table.md
    python bench/search_vs_grid.py OUT --picks NAME   # the configs to re-measure back to back (search_vs_grid.sh)

An arm's goodput is its recommended config's (after the head-to-head), as the arm measured it. The machine's speed
drifts between arms measured tens of minutes apart, so each arm's pick is also read off the grid (the grid's goodput
for the pick's max-num-batched-tokens and max-num-seqs, other knobs aside) and re-measured back to back with the
grid's best (`recheck-*`, one-config tunes, when the run has them; `roundN-*` for repeated rounds of them). Last, how
far the run's fail verdicts can be trusted: how many were reached within 5 s, and how many a pass of the same config
at an equal or higher rate, anywhere in the run, contradicts. A goodput rate is the highest rate the rate search
passed: its bracket (passed, failed) says how finely it was located.
"""

import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from servetune.study import Summary


def flags(config: dict) -> str:
    return " ".join(f"{k.replace('_', '-')}={v}" for k, v in config.items()) or "vLLM's defaults"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def bracket(summary: Summary) -> str:
    """The best trial's goodput bracket (passed, failed), or "-"."""
    found = summary.best.goodput_bracket if summary.best else None
    return f"[{found[0]:.2f}, {found[1]:.2f}]" if found else "-"


def share(value: float | None, whole: float | None) -> str:
    return f"{value / whole:.0%}" if value and whole else "-"


def load(out: Path) -> dict[str, dict[str, tuple[Summary, float]]]:
    """Per workload, per arm: its summary and wall seconds (times.tsv)."""
    runs: dict[str, dict[str, tuple[Summary, float]]] = {}
    with open(out / "times.tsv") as f:
        for name, arm, seconds, _rc in csv.reader(f, delimiter="\t"):
            summary = Summary.model_validate_json((out / name / arm / "summary.json").read_text())
            runs.setdefault(name, {})[arm] = (summary, float(seconds))
    return runs


V1_DEFAULTS = {"enable_chunked_prefill": True, "enable_prefix_caching": True, "enforce_eager": False}


def same_config(config: dict) -> str:
    """A key that a grid point and a search's trial of the same config share (vLLM V1's defaults left out)."""
    return json.dumps({k: v for k, v in config.items() if V1_DEFAULTS.get(k, object()) != v}, sort_keys=True)


def fail_verdicts(out: Path, name: str, arms: dict[str, tuple[Summary, float]]) -> str:
    """The run's level fail verdicts: how many, how many within 5 s, how many contradicted by a pass of the same
    config at an equal or higher rate in any arm (of those whose levels.csv is kept)."""
    levels = []
    for arm, (summary, _) in arms.items():
        path = out / name / arm / "levels.csv"
        if not path.exists():  # runs kept in docs before this count keep the searches' levels only
            continue
        configs = {b.trial: same_config(b.config) for b in summary.budget}
        with open(path) as f:
            levels += [(configs[int(r["trial"])], r) for r in csv.DictReader(f) if r["name"] != "capacity"]
    passed: dict[str, float] = defaultdict(float)
    for config, r in levels:
        if r["verdict"] == "pass":
            passed[config] = max(passed[config], float(r["rate"]))
    fails = [(config, r) for config, r in levels if r["verdict"] == "fail"]
    contradicted = [r for config, r in fails if passed[config] >= float(r["rate"])]

    def within_5s(rows: list[dict]) -> int:
        return sum(float(r["duration"]) < 5 for r in rows)
    return (f"Fail verdicts of the run's levels (capacity bursts aside): {len(fails)} of {len(levels)} levels; "
            f"{within_5s([r for _, r in fails])} reached within 5 s; {len(contradicted)} contradicted by a pass of "
            f"the same config at an equal or higher rate elsewhere in the run ({within_5s(contradicted)} of them "
            "within 5 s).")


REMEASURED = re.compile(r"(recheck|round\d+)-(.+)")  # an arm that re-measures a pick: its stage and the pick's arm


def goodput(summary: Summary) -> float:
    return (summary.best.goodput_rate or 0.0) if summary.best else 0.0


def recommended(summary: Summary) -> dict:
    """The config an arm answers with: its recommendation, or a grid point's config."""
    if summary.confirmation is None:
        return summary.best.config if summary.best else summary.default.config
    return next(b.config for b in summary.budget if b.trial == summary.confirmation.recommended_trial)


def picks(arms: dict[str, tuple[Summary, float]]) -> dict[str, dict]:
    """The grid's best config and each search arm's recommendation, each config once, the grid's first."""
    best = max((arm for arm in arms if arm.startswith("grid-")), key=lambda arm: goodput(arms[arm][0]))
    chosen = {best: recommended(arms[best][0])}
    for arm, (summary, _) in arms.items():
        searched = not arm.startswith("grid-") and not REMEASURED.fullmatch(arm)
        if searched and recommended(summary) not in chosen.values():
            chosen[arm] = recommended(summary)
    return chosen


def main(out: Path) -> None:
    for name, arms in load(out).items():
        summaries = {arm: summary for arm, (summary, _) in arms.items() if not REMEASURED.fullmatch(arm)}
        grid = {arm: s for arm, s in summaries.items() if arm.startswith("grid-")}
        grid_s = sum(arms[arm][1] for arm in grid)
        best_arm = max(grid, key=lambda arm: goodput(grid[arm]))
        grid_best = grid[best_arm].best.goodput_rate
        print(f"### {name}: {', '.join(f'{k} <= {v:g}' for k, v in next(iter(summaries.values())).slo.items())}\n")
        print("| grid config | goodput (req/s) | bracket | time |\n|---|---|---|---|")
        for arm, s in grid.items():
            mark = " **(best)**" if arm == best_arm else ""
            chunk, seqs = arm.removeprefix("grid-").split("-")
            print(f"| chunk {chunk}, max-num-seqs {seqs}{mark} | "
                  f"{rate(s.best.goodput_rate if s.best else None)} | {bracket(s)} | {arms[arm][1] / 60:.1f} min |")
        print(f"\nGrid: {len(grid)} configs, {grid_s / 60:.1f} min, best {rate(grid_best)} req/s.\n")
        print("| arm | state | launched | recommended | its goodput (req/s) | of grid's best | the grid's goodput for "
              "its chunk and max-num-seqs | of grid's best | time | of grid's time |\n"
              "|---|---|---|---|---|---|---|---|---|---|")
        for arm, s in summaries.items():
            if arm in grid:
                continue
            seconds = arms[arm][1]
            pick = recommended(s)
            rate_ = s.confirmation.recommended_goodput_rate
            point = grid.get(f"grid-{pick.get('max_num_batched_tokens')}-{pick.get('max_num_seqs')}")
            on_grid = point.best.goodput_rate if point and point.best else None
            print(f"| {arm} | {s.state} | {sum(1 for b in s.budget if b.launched)} | {flags(pick)} | {rate(rate_)} | "
                  f"{share(rate_, grid_best)} | {rate(on_grid) if point else 'not in the grid'} | "
                  f"{share(on_grid, grid_best)} | {seconds / 60:.1f} min | {seconds / grid_s:.0%} |")
        rounds: dict[str, dict[str, Summary]] = {}
        for arm, (summary, _) in arms.items():
            if match := REMEASURED.fullmatch(arm):
                rounds.setdefault(match[1], {})[match[2]] = summary
        for stage, rechecks in rounds.items():
            base = goodput(rechecks[best_arm])
            print(f"\nRe-measured back to back ({stage}; one-config tunes, in this order):\n\n| config of | goodput "
                  "(req/s) | bracket | of the grid's best, re-measured |\n|---|---|---|---|")
            for arm, summary in rechecks.items():
                print(f"| {arm} | {rate(goodput(summary) or None)} | {bracket(summary)} "
                      f"| {share(goodput(summary), base)} |")
        print(f"\n{fail_verdicts(out, name, arms)}\n")


if __name__ == "__main__":
    if sys.argv[2:3] == ["--picks"]:
        for arm, config in picks(load(Path(sys.argv[1]))[sys.argv[3]]).items():
            print(arm, *(f"{k.replace('_', '-')}={str(v).lower()}" for k, v in config.items()), sep="\t")
    else:
        main(Path(sys.argv[1]))

"""`servetune report`: why a config wins, from a finished study. Reads the study and nothing else."""

from pathlib import Path

from servetune.report import charts
from servetune.report.data import importances, load_study, rows, unmeasured, write_levels_csv, write_trials_json
from servetune.report.page import render
from servetune.jsonio import write_atomic
from servetune.results import write_outputs

__all__ = ["write_report"]


def write_report(storage: str, out: Path) -> Path:
    """Write into `out` a self-contained report.html, its charts as PNGs, trials.json (every trial's full
    outcome), levels.csv (one row per load level) and tune's outputs (summary.json, trials.csv, best.yaml,
    best_command.sh). Returns the page's path."""
    record = load_study(storage)
    meta = record.stored_meta
    out.mkdir(parents=True, exist_ok=True)
    summary = write_outputs(record, out)
    trial_rows = rows(record)
    write_trials_json(record, out / "trials.json")
    write_levels_csv(trial_rows, out / "levels.csv")
    default = (summary["default"] or {}).get("trial")
    best = (summary["best"] or {}).get("trial")
    importance, note = importances(record)
    figures = {
        "pareto": charts.pareto(trial_rows, default, best, meta["objective"], meta["slo"]),
        "load": charts.load_curves(trial_rows, default, best, meta["slo"]),
        "effects": charts.param_effects(trial_rows, meta["space"]["knobs"], default, best, meta["objective"],
                                        importance),
        "importance": charts.importance_bars(importance) if importance else None,
    }
    for name, fig in figures.items():
        if fig is None:
            (out / f"{name}.png").unlink(missing_ok=True)  # from an earlier report of this study
    images = {name: charts.save(fig, out / f"{name}.png") for name, fig in figures.items() if fig is not None}
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "report.html")
    page = out / "report.html"
    write_atomic(page, render(meta, summary, trial_rows, unmeasured(record), images, importance, note,
                           ["report.html", *files]))
    return page

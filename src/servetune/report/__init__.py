"""`servetune report`: why a config wins, from a finished study. Reads the study and nothing else."""

from pathlib import Path

from servetune.jsonio import write_atomic
from servetune.report import charts
from servetune.report.data import importances, load_study, write_levels_csv, write_trials_json
from servetune.report.page import render
from servetune.study.results import Results, write_outputs

__all__ = ["publish", "write_report"]


def write_report(storage: str, out: Path) -> Path:
    """Read the study in `storage` and write every output into `out` (`publish`). Returns the page's path."""
    return publish(Results(load_study(storage)), out)


def publish(results: Results, out: Path) -> Path:
    """Write into `out`, all from `results`: a self-contained report.html, its charts as PNGs, trials.json (every
    trial's full record), levels.csv (one row per load level) and tune's outputs (summary.json, trials.csv,
    best.yaml, best_command.sh). Returns the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(results, out)
    write_trials_json(results.record, out / "trials.json")
    write_levels_csv(results.rows, out / "levels.csv")
    importance, note = importances(results.record)
    figures = {
        "pareto": charts.pareto(results),
        "load": charts.load_curves(results),
        "tokens": charts.tokens_pareto(results),
        "effects": charts.param_effects(results, importance),
        "importance": charts.importance_bars(importance) if importance else None,
    }
    for name, fig in figures.items():
        if fig is None:
            (out / f"{name}.png").unlink(missing_ok=True)  # from an earlier report of this study
    images = {name: charts.save(fig, out / f"{name}.png") for name, fig in figures.items() if fig is not None}
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "report.html")
    page = out / "report.html"
    write_atomic(page, render(results, images, importance, note, ["report.html", *files]))
    return page

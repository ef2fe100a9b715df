"""The report's charts as matplotlib figures (no pyplot: no global state, no display needed).

Every chart shows vLLM's default config in grey (a square) and the recommended one in green (a star).
"""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

from servetune.engine.roofline import gpus_of
from servetune.measure.slo import Latency, Objective, headline_latencies
from servetune.study.results import Results, TrialRow
from servetune.workload import RateUnit

DEFAULT, BEST, FRONT, OTHER, FAILED, SLO = "#6b7280", "#16a34a", "#f59e0b", "#93c5fd", "#dc2626", "#dc2626"
STYLE: dict[Any, Any] = {"font.size": 10, "axes.titlesize": 11, "axes.titleweight": "bold", "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.color": "#e5e7eb", "grid.linewidth": 0.8,
                         "legend.frameon": False, "savefig.dpi": 120}  # Any: matplotlib's rc keys


def value_label(objective: str, rate_unit: RateUnit = RateUnit.REQUESTS_PER_S) -> str:
    """What a trial's value is, in its unit (a trace's goodput rates are speed-up factors)."""
    return f"goodput ({rate_unit} within SLOs)" if objective == Objective.GOODPUT else "throughput (req/s)"


def _marked(results: Results) -> tuple[list[TrialRow], int | None, int | None]:
    """The rows, and the trial numbers of vLLM's defaults and of the recommended config (None: none)."""
    default, best = results.summary.default, results.summary.best
    return results.rows, default.trial if default else None, best.trial if best else None


def measured_at(objective: str) -> str:
    """Where a trial's headline p99s come from (see trial/run.py: the decisive level)."""
    return "at the goodput rate" if objective == Objective.GOODPUT else "at full load"


def pareto_front(points: list[TrialRow], latency: str) -> list[TrialRow]:
    """The points no other beats on both objective value (higher) and the p99 of `latency` (an SLO key, lower), by
    latency."""
    front: list[TrialRow] = []
    for p in sorted(points, key=lambda p: (p.slo_p99[latency], -(p.value or 0.0))):
        if not front or (p.value or 0.0) > (front[-1].value or 0.0):
            front.append(p)
    return front


def pareto(results: Results) -> Figure | None:
    """Objective value against the p99 of each latency the SLOs bound (TTFT and TPOT without SLOs) for every trial
    that measured a rate; the front as a staircase. None when none did."""
    (rows, default, best), objective, slo = _marked(results), results.meta.objective, results.meta.slos
    label_y = value_label(objective, results.summary.rate_unit)
    if not any(r.value for r in rows):
        return None
    with matplotlib.rc_context(STYLE):
        latencies = headline_latencies(slo)
        fig = Figure(figsize=(max(6.5, 5.5 * len(latencies)), 4.2), layout="constrained")
        axes = fig.subplots(1, len(latencies), sharey=True, squeeze=False)[0]
        for ax, lat in zip(axes, latencies):
            slo_key, label = lat.slo, lat.p99_label
            points = [r for r in rows if r.value and r.slo_p99[slo_key] is not None]  # a rate and its p99s measured
            front = pareto_front(points, slo_key)
            ax.scatter([p.slo_p99[slo_key] for p in points], [p.value for p in points], s=36, color=OTHER,
                       edgecolor="#3b82f6", linewidth=0.6, zorder=2, label="measured config")
            ax.plot([p.slo_p99[slo_key] for p in front], [p.value for p in front], drawstyle="steps-post",
                    color=FRONT, linewidth=2, marker="o", markersize=7, zorder=3, label="Pareto front")
            for p in front:
                if p.trial in (default, best):
                    continue  # labelled by _mark
                ax.annotate(f"#{p.trial}", (p.slo_p99[slo_key], p.value), xytext=(5, -11),
                            textcoords="offset points", fontsize=8, color="#92400e")
            _mark(ax, points, default, best, slo_key)
            if (bound := slo.bound(lat)) is not None:
                ax.axvline(bound, color=SLO, linestyle="--", linewidth=1.2)
                ax.annotate(f"SLO {bound:g} ms", (bound, 0), xycoords=("data", "axes fraction"),
                            xytext=(-4, 4), textcoords="offset points", ha="right", color=SLO, fontsize=9)
            _log_if_wide(ax.set_xscale, [p.slo_p99[slo_key] for p in points])
            ax.set_xlabel(f"{label}, {measured_at(objective)}")
            ax.set_title(f"{label_y.split(' (')[0]} vs {label.split(' (')[0]}")
            ax.margins(x=0.1)
        axes[0].set_ylabel(label_y)
        axes[0].set_ylim(0, 1.15 * max(r.value for r in rows if r.value) or 1)
        handles, labels = axes[-1].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=9)
    return fig


def _mark(ax, points: list[TrialRow], default: int | None, best: int | None, latency: str) -> None:
    for p in points:
        x = p.slo_p99[latency]
        if p.trial == default:
            text = "default = recommended" if best == default else "vLLM default"
            ax.scatter(x, p.value, s=120, marker="s", facecolor="none", edgecolor=DEFAULT, linewidth=2, zorder=4)
            ax.annotate(f"{text} (#{p.trial})", (x, p.value), xytext=(10, -16),
                        textcoords="offset points", fontsize=9, color="#374151", fontweight="bold")
        elif p.trial == best:
            ax.scatter(x, p.value, s=260, marker="*", color=BEST, edgecolor="white", zorder=5)
            ax.annotate(f"recommended (#{p.trial})", (x, p.value), xytext=(10, 6),
                        textcoords="offset points", fontsize=9, color=BEST, fontweight="bold")


def _log_if_wide(set_scale, values: Sequence[float | None]) -> None:
    """A log scale when the values span more than 30x."""
    positive = [v for v in values if v and v > 0]
    if positive and max(positive) / min(positive) > 30:
        set_scale("log")


def load_curves(results: Results) -> Figure | None:
    """The p99 of each latency the SLOs bound (TTFT and TPOT without SLOs) against the offered request rate, one line
    per config through its load levels. The capacity level (every request at once) sits at the rate it achieved.
    None without any level."""
    (rows, default, best), slo = _marked(results), results.meta.slos
    in_req_s = results.summary.rate_unit == RateUnit.REQUESTS_PER_S  # a trace's levels: at the req/s they offered
    latencies = headline_latencies(slo)
    if not any(_level_points(r, latencies[0], in_req_s) for r in rows):
        return None
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(max(6.5, 5.5 * len(latencies)), 4.2), layout="constrained")
        axes = fig.subplots(1, len(latencies), squeeze=False)[0]
        order = sorted(rows, key=lambda r: (r.trial == best, r.trial == default))  # highlights on top
        for ax, lat in zip(axes, latencies):
            label = lat.p99_label
            values = []
            for row in order:
                levels = sorted(_level_points(row, lat, in_req_s), key=lambda p: p[0])
                if not levels:
                    continue
                color, width, z = ((BEST, 2.4, 4) if row.trial == best else (DEFAULT, 2.2, 3)
                                   if row.trial == default else ("#94a3b8", 1, 2))
                ax.plot([p[0] for p in levels], [p[1] for p in levels], color=color, linewidth=width, zorder=z,
                        alpha=1 if z > 2 else 0.6)
                for x, y, passed, capacity in levels:
                    ax.scatter(x, y, s=55 if capacity else 30, marker="D" if capacity else "o", zorder=z,
                               facecolor=color if passed else "white", edgecolor=color, linewidth=1.4)
                values += [p[1] for p in levels]
            if (bound := slo.bound(lat)) is not None:
                ax.axhline(bound, color=SLO, linestyle="--", linewidth=1.2)
                ax.annotate(f"SLO {bound:g} ms", (0.01, bound), xycoords=("axes fraction", "data"),
                            xytext=(0, 4), textcoords="offset points", color=SLO, fontsize=9)
            _log_if_wide(ax.set_yscale, values)
            ax.set_xlabel("offered request rate (req/s)")
            ax.set_ylabel(label)
            ax.set_title(f"{label.split(' (')[0]} under load")
            ax.set_xlim(left=0)
        axes[-1].legend(handles=_load_legend(default, best), loc="upper left", fontsize=9)
    return fig


def _level_points(row: TrialRow, latency: Latency, in_req_s: bool) -> list[tuple[float, float, bool, bool]]:
    """(rate in req/s, the level's p99 of `latency`, passed, capacity level) of each of the row's levels in which a
    request finished (no other has a latency); the rate of a level whose rate is not in req/s (a trace's speed-up
    factor) is the rate it offered."""
    points = []
    for level in row.levels:
        if not level.metrics.completed:
            continue
        capacity = not math.isfinite(level.rate)
        x = (level.metrics.request_throughput if capacity else level.rate if in_req_s
             else level.metrics.offered_request_rate)
        points.append((x, latency.p99(level.metrics), level.passed, capacity))
    return points


def _load_legend(default: int | None, best: int | None) -> list[Line2D]:
    handles = []
    if best is not None and best != default:
        handles.append(Line2D([], [], color=BEST, linewidth=2.4, label=f"recommended (#{best})"))
    if default is not None:
        handles.append(Line2D([], [], color=BEST if best == default else DEFAULT, linewidth=2.2,
                              label=f"vLLM default{', recommended' if best == default else ''} (#{default})"))
    return handles + [
        Line2D([], [], color="#94a3b8", linewidth=1, label="other configs"),
        Line2D([], [], color="#475569", marker="o", linestyle="", label="met the SLOs"),
        Line2D([], [], color="#475569", marker="o", markerfacecolor="white", linestyle="", label="missed them"),
        Line2D([], [], color="#475569", marker="D", linestyle="", label="capacity (all at once)"),
    ]


def tokens_pareto(results: Results) -> Figure | None:
    """Output tokens/s per user (1000 / mean TPOT) against output tokens/s per GPU, a point per measured load level of
    every config (filled: it passed its SLOs), the front of the levels no other beats on both, and each bound the
    roofline gives the recommended config (`study.limits`). None without a level that finished requests."""
    (rows, default, best), summary = _marked(results), results.summary
    points = [(level.metrics.output_throughput / gpus_of(row.config), 1000 / level.metrics.mean_tpot_ms,
               level.passed, row.trial) for row in rows for level in row.levels
              if level.metrics.completed and level.metrics.mean_tpot_ms > 0 and level.metrics.output_throughput > 0]
    if not points:
        return None
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(6.8, 4.4), layout="constrained")
        ax = fig.subplots()
        for x, y, passed, trial in sorted(points, key=lambda p: (p[3] == best, p[3] == default)):
            color = BEST if trial == best else DEFAULT if trial == default else "#3b82f6"
            ax.scatter(x, y, s=34, color=color if passed else "white", edgecolor=color, linewidth=1.2, zorder=3)
        front: list[tuple[float, float]] = []
        for x, y, *_ in sorted(points, key=lambda p: (-p[0], -p[1])):
            if not front or y > front[-1][1]:
                front.append((x, y))
        ax.plot(*zip(*front), drawstyle="steps-pre", color=FRONT, linewidth=1.6, zorder=2, label="Pareto front")
        chosen = next((r for r in rows if r.trial == best), None)
        for per_gpu, style, label, y in _roofline_lines(chosen, summary):
            ax.axvline(per_gpu, color=SLO, linestyle=style, linewidth=1.2)
            ax.annotate(f"{label}: {per_gpu:,.0f}", (per_gpu, y), xycoords=("data", "axes fraction"),
                        xytext=(-4, 4 if y == 0 else -12), textcoords="offset points", ha="right", color=SLO,
                        fontsize=8)
        ax.set_xlabel("output tokens/s per GPU")
        ax.set_ylabel("output tokens/s per user (1000 / mean TPOT)")
        ax.set_title("Tokens per user against tokens per GPU, every load level")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        handles = [Line2D([], [], marker="o", linestyle="", color=c, label=label) for c, label in
                   ((BEST, "recommended"), (DEFAULT, "vLLM's defaults"), ("#3b82f6", "other config"))]
        handles += [Line2D([], [], marker="o", linestyle="", color="#6b7280", markerfacecolor="white",
                           label="level failed its SLOs"), Line2D([], [], color=FRONT, label="Pareto front")]
        fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)
    return fig


def _roofline_lines(row: TrialRow | None, summary) -> list[tuple[float, str, str, float]]:
    """The recommended config's bounds in output tokens/s per GPU, as (x, line style, label, label's height): within
    the SLOs, and without them where that is higher."""
    if row is None or not row.limit.bound_rate or not summary.roofline or not summary.roofline.work:
        return []
    gpus = gpus_of(row.config)
    within = row.limit.bound_rate * summary.roofline.work["output"] / gpus
    lines = [(within, "--", "roofline within the SLOs", 0.0)]
    if row.limit.peak_tokens_per_s and row.limit.peak_tokens_per_s / gpus > 1.01 * within:
        lines.append((row.limit.peak_tokens_per_s / gpus, ":", "roofline without SLOs", 1.0))
    return lines


def param_effects(results: Results, importance: dict[str, float]) -> Figure | None:
    """The objective value of every trial against each searched knob's value; failed configs at zero."""
    (rows, default, best), knobs, objective = _marked(results), results.meta.knobs, results.meta.objective
    unit = results.summary.rate_unit if objective == Objective.GOODPUT else RateUnit.REQUESTS_PER_S
    names = [k for k in knobs if any(k in r.params for r in rows)]
    if not names:
        return None
    default_value = next((r.value for r in rows if r.trial == default), None)
    cols = 2 if len(names) in (2, 4) else min(3, len(names))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(11, 3.1 * math.ceil(len(names) / cols)), layout="constrained")
        axes = fig.subplots(math.ceil(len(names) / cols), cols, squeeze=False).ravel()
        for ax, name in zip(axes, names):
            tried = [str(r.params[name]) for r in rows if name in r.params]
            choices = list(dict.fromkeys([*map(str, knobs[name]), *tried]))  # the space's values, then any others
            groups: dict[int, list[TrialRow]] = {}
            for row in rows:
                if name in row.params:
                    groups.setdefault(choices.index(str(row.params[name])), []).append(row)
            for x, group in groups.items():
                for dx, row in zip(np.linspace(-0.15, 0.15, len(group)) if len(group) > 1 else [0.0], group):
                    _effect_point(ax, x + dx, row, best)
            if default_value is not None:
                ax.axhline(default_value, color=DEFAULT, linestyle="--", linewidth=1.2)
            ax.set_xticks(range(len(choices)), choices, rotation=30 if len(choices) > 5 else 0)
            ax.set_xlim(-0.5, len(choices) - 0.5)
            ax.set_ylim(bottom=0)
            share = f"  ·  importance {importance[name]:.0%}" if name in importance else ""
            ax.set_title(f"{name}{share}", fontsize=10)
        for ax in axes[len(names):]:
            ax.set_visible(False)
        for ax in axes[::cols]:
            ax.set_ylabel(value_label(objective).split(" (")[0] + f" ({unit})")
        fig.legend(handles=[
            Line2D([], [], color=OTHER, marker="o", markeredgecolor="#3b82f6", linestyle="", label="trial"),
            Line2D([], [], color=BEST, marker="*", markersize=12, linestyle="", label="recommended"),
            Line2D([], [], color=FAILED, marker="x", linestyle="", label="failed"),
            Line2D([], [], color=DEFAULT, linestyle="--", label="vLLM default"),
        ], loc="outside lower center", ncols=4, fontsize=9)
    return fig


def _effect_point(ax, x: float, row: TrialRow, best: int | None) -> None:
    if row.value is None:
        ax.scatter(x, 0, marker="x", color=FAILED, s=40, zorder=3, clip_on=False)
    elif row.trial == best:
        ax.scatter(x, row.value, marker="*", color=BEST, s=200, edgecolor="white", zorder=4, clip_on=False)
    else:
        ax.scatter(x, row.value, color=OTHER, edgecolor="#3b82f6", s=32, zorder=2, clip_on=False)


def importance_bars(importance: dict[str, float]) -> Figure:
    """Optuna's importances as horizontal bars, largest on top."""
    names = list(importance)[::-1]
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(6, 0.45 * len(names) + 1), layout="constrained")
        ax = fig.subplots()
        bars = ax.barh(names, [importance[n] for n in names], color="#3b82f6")
        ax.bar_label(bars, labels=[f"{importance[n]:.0%}" for n in names], padding=3, fontsize=9)
        ax.set_xlim(0, max(importance.values(), default=0) * 1.2 or 1)
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel("share of importance")
        ax.grid(axis="y", visible=False)
        ax.set_title("What mattered most")
    return fig


def save(fig: Figure, path: Path) -> Path:
    """The figure as a PNG at `path`, written whole (through a temporary file renamed into place)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with matplotlib.rc_context(STYLE):
        fig.savefig(tmp, format="png", facecolor="white")
    tmp.replace(path)
    return path

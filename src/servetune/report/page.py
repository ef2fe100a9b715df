"""The HTML page: one self-contained file (inline CSS, charts as data URIs, no scripts) rendered with Jinja2."""

import base64
import math
import shlex
from pathlib import Path

import jinja2
import yaml

from servetune.engine.args import to_argv
from servetune.measure.slo import Objective, headline_latencies
from servetune.report.charts import measured_at, value_label
from servetune.study.results import Results, vllm_config_yaml

TEMPLATE = Path(__file__).with_name("report.html.j2").read_text()


def number(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def flags(config: dict | None) -> list[str]:
    """vLLM flags with their values, one string per flag."""
    groups: list[str] = []
    for arg in to_argv(config or {}):
        if arg.startswith("--") or not groups:
            groups.append(arg)
        else:
            groups[-1] += " " + shlex.quote(arg)
    return groups


def command(model: str, config: dict) -> str:
    """`vllm serve` with one flag a line, as a shell command."""
    return " \\\n  ".join([f"vllm serve {shlex.quote(model)}", *flags(config)])


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def render(results: Results, images: dict[str, Path], importance: dict[str, float], importance_note: str | None,
           files: list[str]) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters |= {"num": number, "flags": flags, "pct": lambda v: "–" if v is None else f"{v:+.0%}",
                    "share": lambda v: "–" if v is None else f"{v:.0%}",
                    "pairs": lambda params: " ".join(f"{k}={v}" for k, v in params.items())}
    meta, summary = results.meta, results.summary
    best, default = summary.best, summary.default
    rows = {row.trial: row for row in results.rows}
    shown = [("recommended", best.trial)] if best else []
    shown += [("vLLM's defaults", default.trial)] if default and (not best or default.trial != best.trial) else []
    per_turn = [(who, trial, level) for who, trial in shown
                if (level := rows[trial].headline_level) is not None and level.metrics.per_turn]
    headroom = summary.headroom  # a max-model-len below the model's context: what it refuses
    return env.from_string(TEMPLATE).render(
        meta=meta, summary=summary, rows=results.rows, unmeasured=results.unmeasured, importance=importance,
        importance_note=importance_note, files=files, confidence=meta.confidence or 0.95,
        value_label=value_label(meta.objective, summary.rate_unit), measured_at=measured_at(meta.objective),
        images={name: data_uri(path) for name, path in images.items()},
        default_trial=default.trial if default else None, best_trial=best.trial if best else None,
        best_value=summary.recommended_rate,
        default_value=default.rate(meta.objective) if default else None,
        best_yaml=vllm_config_yaml(meta.model, best.config, headroom.comment if headroom else None)
        if best else None, headroom=headroom,
        best_command=command(meta.model, best.config) if best else None,
        workload=yaml.safe_dump(meta.workload, sort_keys=False), per_turn=per_turn,
        latencies=headline_latencies(meta.slos), goodput=meta.objective == Objective.GOODPUT,
        price=meta.gpu_hour_price, bounded=bool(summary.roofline and summary.roofline.accelerator),
    )

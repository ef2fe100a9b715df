"""What a finished study recommends: a row per measured trial, the best config against vLLM's defaults (or the
confirmed pick), and the files a user runs and reads: best.yaml, best_command.sh, trials.csv, summary.json.
Depends only on the study and the outcome types; `tune` and `report` both use it."""

import csv
import math
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from servetune.engine import serve_command
from servetune.engine.args import CPU_KVCACHE_SPACE, to_argv
from servetune.jsonio import write_json
from servetune.study import measured, outcome
from servetune.workload.fit import refused_beyond


def trial_row(t: FrozenTrial) -> dict:
    """A measured trial as one row of trials.csv and of the report's table."""
    out = outcome(t)
    startup = out.startup
    return {
        "trial": t.number, "role": t.user_attrs.get("role", "search"), "status": str(out.status),
        "config": out.config, "goodput_rate": out.goodput_rate,
        "goodput_bracket": list(out.goodput_bracket) if out.goodput_bracket else None,
        "request_throughput": out.request_throughput, "p99_ttft_ms": out.p99_ttft_ms,
        "p99_tpot_ms": out.p99_tpot_ms, "preemptions": out.preemptions,
        "kv_cache_tokens": startup.kv_cache_tokens if startup else None,
        "ready_s": startup.ready_s if startup else None,
        "failure": str(out.failure) if out.failure else None,
        "rejected_requests": out.rejected_requests, "why": t.user_attrs.get("why"),
        "value": t.value if t.state == TrialState.COMPLETE else None,
    }


def budget_spent(study: optuna.Study) -> list[dict]:
    """Where the budget went and why: every launched trial (why it was proposed, what it measured) and every
    proposal skipped before launching (why), in order."""
    entries = []
    for t in study.get_trials(deepcopy=False):
        if "skipped" in t.user_attrs:
            entries.append({"trial": t.number, "launched": False, "why": t.user_attrs.get("why") or "TPE's proposal",
                            "config": t.params, "result": f"skipped: {t.user_attrs['skipped']}"})
        elif (out := outcome(t)) is not None:
            result = (f"failed ({out.failure.kind}): {out.failure.reason}" if not out.ok
                      else f"goodput {out.goodput_rate:.2f} {out.rate_unit}" if out.goodput_rate is not None
                      else f"throughput {out.request_throughput:.2f} req/s")
            entries.append({"trial": t.number, "launched": True, "why": t.user_attrs.get("why"),
                            "config": out.config, "result": result})
    return entries


def _summary_entry(row: dict | None) -> dict | None:
    if row is None:
        return None
    keys = ("config", "goodput_rate", "request_throughput", "p99_ttft_ms", "p99_tpot_ms")
    return {k: row[k] for k in keys} | {"trial": row["trial"], "goodput_bracket": row["goodput_bracket"]}


def beats(row: dict, default: dict, objective: str) -> bool:
    """Whether a measured row beats the default's beyond the measurement's resolution: for goodput, its
    passing rate is at or above the rate at which the default failed (the brackets do not overlap); for
    throughput, by more than 5%."""
    if objective == "goodput":
        return row["goodput_bracket"][0] >= default["goodput_bracket"][1] > 0 or (
            default["goodput_rate"] == 0 and row["goodput_rate"] > 0)
    return row["request_throughput"] > 1.05 * default["request_throughput"]


def choose_best(rows: list[dict], objective: str) -> tuple[dict | None, dict | None, bool]:
    """(default, best, significant). The best must beat the default (`beats`); otherwise the default is
    recommended."""
    ok = [r for r in rows if r["status"] == "ok"]
    default = next((r for r in ok if r["role"] == "default"), None)
    best = max(ok, key=lambda r: r["value"] or 0.0, default=None)
    if best is None or default is None or best is default:
        return default, best or default, False
    significant = beats(best, default, objective)
    return default, best if significant else default, significant


def vllm_config_yaml(model: str, config: dict, comment: str | None = None) -> str:
    """A file `vllm serve --config` accepts: kebab-case flag names, as launched; `comment` on top."""
    flags: dict[str, Any] = {"model": model}
    for key, value in config.items():
        if key != CPU_KVCACHE_SPACE and value is not None:
            flags[key.replace("_", "-")] = value
    return (f"# {comment}\n" if comment else "") + yaml.safe_dump(flags, sort_keys=False)


def headroom(meta: dict, config: dict, reason: str | None) -> dict | None:
    """What a config launched with a max-model-len below the model's context refuses (summary.json
    `headroom`): its max-model-len, the context, why it was tightened (`reason`, the trial's
    `model_len_reason`) and the comment best.yaml and the report carry. None when the config launches with
    the model's context (no max-model-len, or one at least the context)."""
    mml = config.get("max_model_len")
    bounds = meta.get("model_len") or {}  # workload.fit.ModelLenBounds; absent in studies made before it
    context = bounds.get("context") or meta["space"].get("context") or 0
    if mml is None or (context and mml >= context):
        return None
    why = reason or "sized to the workload's longest request"
    refused = refused_beyond(mml, bounds.get("max_chars_per_token") or 0, meta["vllm_version"])
    known = f"the model's context is {context}" if context else "the model's context is unknown"
    return {"max_model_len": mml, "context": context or None, "reason": why,
            "comment": f"max-model-len {mml} ({known}; tightened because {why}): {refused}"}


def summary(study: optuna.Study, rows: list[dict] | None = None) -> dict:
    """The study's recommendation (summary.json): the defaults and the best config (the confirmed pick when
    the study was confirmed), whether and by how much it beats them, where the budget went. `rows`: the
    study's `trial_row`s, when the caller has them."""
    meta = study.user_attrs["meta"]
    rows = [trial_row(t) for t in measured(study)] if rows is None else rows
    default, best, significant = choose_best(rows, meta["objective"])
    gain = (best["value"] / default["value"] - 1) if best and default and default["value"] else None
    confirmation = study.user_attrs.get("confirmation")
    if confirmation is not None:  # the confirmed recommendation replaces the search's
        best = next(r for r in rows if r["trial"] == confirmation["recommended_trial"])
        significant = confirmation["verdict"] == "confirmed"
        held, base = confirmation["recommended_goodput_rate"], confirmation["default_goodput_rate"]
        gain = held / base - 1 if significant and held and base else (0.0 if best is default else None)
    result = {
        "objective": meta["objective"], "slo": meta["slo"],
        "rate_unit": "x trace speed" if meta["workload"].get("trace") else "req/s",  # a trace's rates are speed-ups
        "default": _summary_entry(default), "best": _summary_entry(best),
        "best_beats_default": significant, "gain": gain, "confirmation": confirmation,
        "budget": budget_spent(study),
        "trials": len(rows), "failed": sum(r["status"] != "ok" for r in rows),
        "skipped": sum(1 for t in study.get_trials(deepcopy=False) if "skipped" in t.user_attrs),
        "model": meta["model"], "strategy": meta["strategy"], "vllm_version": meta["vllm_version"],
        "device": meta["device"],
    }
    if best is not None:
        result["best_command"] = serve_command(meta["model"], best["config"])
        reason = study.get_trials(deepcopy=False)[best["trial"]].user_attrs.get("model_len_reason")
        result["headroom"] = headroom(meta, best["config"], reason)
    return result


def write_outputs(study: optuna.Study, out: Path) -> dict:
    """best.yaml, best_command.sh, trials.csv and summary.json under `out`; returns the summary."""
    rows = [trial_row(t) for t in measured(study)]
    result = summary(study, rows)
    if result["best"] is not None:
        comment = (result.get("headroom") or {}).get("comment")
        (out / "best.yaml").write_text(vllm_config_yaml(result["model"], result["best"]["config"], comment))
        script = out / "best_command.sh"
        note = f"# {comment}\n" if comment else ""
        script.write_text(f"#!/bin/sh\n# servetune: the best config found\n{note}exec {result['best_command']}\n")
        script.chmod(0o755)
    with open(out / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv(v) for k, v in row.items()})
    write_json(out / "summary.json", result)
    return result


def _csv(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return " ".join(to_argv(value)) if isinstance(value, dict) else value
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 4)
    return value

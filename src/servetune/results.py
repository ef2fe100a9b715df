"""What a finished study recommends: a row per measured trial, the best config against vLLM's defaults (or the
confirmed pick), and the files a user runs and reads: best.yaml, best_command.sh, trials.csv, summary.json.
Depends only on the study and the outcome types; `tune` and `report` both use it."""

import csv
import io
import math
from pathlib import Path
from typing import Any

import yaml

from servetune.engine import serve_command
from servetune.engine.args import CPU_KVCACHE_SPACE, to_argv
from servetune.jsonio import write_atomic, write_json
from servetune.record import RecordedTrial, StudyMeta, StudyRecord
from servetune.workload.fit import refused_beyond


def trial_row(t: RecordedTrial) -> dict:
    """A measured trial as one row of trials.csv and of the report's table."""
    out = t.outcome
    startup = out.startup
    return {
        "trial": t.number, "role": t.record.role, "status": str(out.status),
        "config": out.config, "goodput_rate": out.goodput_rate,
        "goodput_bracket": list(out.goodput_bracket) if out.goodput_bracket else None,
        "request_throughput": out.request_throughput, "p99_ttft_ms": out.p99_ttft_ms,
        "p99_tpot_ms": out.p99_tpot_ms, "preemptions": out.preemptions,
        "kv_cache_tokens": startup.kv_cache_tokens if startup else None,
        "ready_s": startup.ready_s if startup else None,
        "failure": str(out.failure) if out.failure else None,
        "rejected_requests": out.rejected_requests, "why": t.record.why, "value": t.objective_value,
    }


def budget_spent(trials: list[RecordedTrial]) -> list[dict]:
    """Where the budget went and why: every launched trial (why it was proposed, what it measured) and every
    proposal skipped before launching (why), in order."""
    entries = []
    for t in trials:
        if t.record.skipped is not None:
            entries.append({"trial": t.number, "launched": False, "why": t.record.why or "TPE's proposal",
                            "config": t.params, "result": f"skipped: {t.record.skipped}"})
        elif (out := t.outcome) is not None:
            result = (f"failed ({out.failure.kind}): {out.failure.reason}" if not out.ok
                      else f"goodput {out.goodput_rate:.2f} {out.rate_unit}" if out.goodput_rate is not None
                      else f"throughput {out.request_throughput:.2f} req/s")
            entries.append({"trial": t.number, "launched": True, "why": t.record.why,
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


def headroom(meta: StudyMeta, config: dict, reason: str | None) -> dict | None:
    """What a config launched with a max-model-len below the model's context refuses (summary.json
    `headroom`): its max-model-len, the context, why it was tightened (`reason`, the trial's
    `model_len_reason`) and the comment best.yaml and the report carry. None when the config launches with
    the model's context (no max-model-len, or one at least the context)."""
    mml = config.get("max_model_len")
    context = meta.context
    if mml is None or (context and mml >= context):
        return None
    why = reason or "sized to the workload's longest request"
    refused = refused_beyond(mml, meta.max_chars_per_token, meta.vllm_version)
    known = f"the model's context is {context}" if context else "the model's context is unknown"
    return {"max_model_len": mml, "context": context or None, "reason": why,
            "comment": f"max-model-len {mml} ({known}; tightened because {why}): {refused}"}


def summary(record: StudyRecord, rows: list[dict] | None = None) -> dict:
    """The study's recommendation (summary.json): the tune's state, the defaults and the best config (the
    head-to-head's recommendation when there was one), whether and by how much it beats them, the rate it
    holds, where the budget went and what was not done. `rows`: the study's `trial_row`s, when the caller
    has them."""
    meta, trials = record.meta, record.trials()
    rows = [trial_row(t) for t in trials if t.measured] if rows is None else rows
    default, best, significant = choose_best(rows, meta.objective)
    gain = (best["value"] / default["value"] - 1) if best and default and default["value"] else None
    confirmation = record.confirmation
    if confirmation is not None:  # the head-to-head's recommendation replaces the search's
        best = next(r for r in rows if r["trial"] == confirmation.recommended_trial)
        significant = confirmation.confirmed
        held, base = confirmation.recommended_goodput_rate, confirmation.default_goodput_rate
        gain = held / base - 1 if significant and held and base else (0.0 if best is default else None)
    progress = record.progress
    result = {
        "state": progress.state, "not_done": progress.not_done,
        "time_limit_s": progress.time_limit_s, "elapsed_s": progress.elapsed_s,
        "objective": meta.objective, "slo": meta.slo,
        "confidence": meta.confidence,  # of each level's verdict (None: point p99s)
        "rate_unit": meta.rate_unit,  # a trace's rates are speed-ups
        "default": _summary_entry(default), "best": _summary_entry(best),
        "best_beats_default": significant, "gain": gain,
        "confirmation": confirmation.stored() if confirmation is not None else None,
        "budget": budget_spent(trials),
        "trials": len(rows), "failed": sum(r["status"] != "ok" for r in rows),
        "skipped": sum(1 for t in trials if t.record.skipped is not None),
        "model": meta.model, "strategy": meta.strategy, "vllm_version": meta.vllm_version,
        "device": meta.device,
    }
    if best is not None:
        result["best_command"] = serve_command(meta.model, best["config"])
        reason = trials[best["trial"]].record.model_len_reason
        result["headroom"] = headroom(meta, best["config"], reason)
    return result | {"answer": answer(result, rows)}


def answer(summary: dict, rows: list[dict]) -> str:
    """What to run, in a sentence or two: the recommended config, the rate it holds (decided at a stated
    confidence) or why there is none, against vLLM's defaults, and what was not done. The CLI and the report
    both print it."""
    best, default = summary["best"], summary["default"]
    state = {"running": "So far: ", "interrupted": "Interrupted: ", "time-limit": "At the time limit: "}.get(
        summary["state"], "")
    not_done = f" Not done: {'; '.join(summary['not_done'])}." if summary["not_done"] else ""
    if best is None:
        text = (f"no config ran to the end ({len(rows)} measured, all failed): the table says why." if rows
                else "nothing was measured yet.")
        return _sentence(state, text) + not_done
    goodput = summary["objective"] == "goodput"
    unit = summary["rate_unit"] if goodput else "req/s"
    key = "goodput_rate" if goodput else "request_throughput"
    is_default = default is not None and best["trial"] == default["trial"]
    who = "vLLM's defaults" if is_default else f"trial #{best['trial']}'s config"
    confirmation = summary["confirmation"] or {}
    rate = confirmation.get("recommended_goodput_rate", best[key]) if goodput else best[key]
    how = (f"decided at {summary['confidence']:.0%} confidence" if summary["confidence"]
           else "by its levels' p99s, before servetune's verdicts were statistical")
    holds = f"it holds {rate:.2f} {unit} within the SLOs ({how})" if goodput else f"{rate:.2f} req/s at full load"
    if goodput and not rate:
        low, high = next(r for r in rows if r["trial"] == best["trial"])["goodput_bracket"] or (0.0, 0.0)
        holds = (f"no rate held the SLOs (its levels failed or stayed undecided down to {high:.2f} {unit}); "
                 "the best estimate is below that rate")
    if confirmation.get("reason"):
        text = f"run {who}: {holds}; {confirmation['reason']}."
    elif default is None:
        text = f"vLLM's defaults did not run; the best config that did is {who}: {holds}."
    elif summary["best_beats_default"]:
        than = (f"{summary['gain']:+.0%} over their {default[key]:.2f} {unit}" if summary["gain"] is not None
                else "where they held no rate")
        text = f"trial #{best['trial']} beats vLLM's defaults: {holds}, {than}, beyond the measured resolution."
    else:
        top = max((r for r in rows if r["status"] == "ok"), key=lambda r: r["value"] or 0.0)
        text = f"keep vLLM's defaults: {holds}."
        if top["trial"] != default["trial"]:
            text += (f" No config beat them beyond the measured resolution: the highest, trial #{top['trial']}, "
                     f"measured {top['value']:.2f} {unit}.")
    return _sentence(state, text) + not_done


def _sentence(prefix: str, text: str) -> str:
    return prefix + text if prefix else text[0].upper() + text[1:]


def write_outputs(record: StudyRecord, out: Path) -> dict:
    """best.yaml, best_command.sh, trials.csv and summary.json under `out`, each written whole; returns the
    summary."""
    rows = [trial_row(t) for t in record.measured()]
    result = summary(record, rows)
    if result["best"] is not None:
        comment = (result.get("headroom") or {}).get("comment")
        write_atomic(out / "best.yaml", vllm_config_yaml(result["model"], result["best"]["config"], comment))
        note = f"# {comment}\n" if comment else ""
        write_atomic(out / "best_command.sh", f"#!/bin/sh\n# servetune: the best config found\n{note}exec "
                                              f"{result['best_command']}\n", mode=0o755)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]) if rows else ["trial"])
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv(v) for k, v in row.items()})
    write_atomic(out / "trials.csv", table.getvalue())
    write_json(out / "summary.json", result)
    return result


def _csv(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return " ".join(to_argv(value)) if isinstance(value, dict) else value
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 4)
    return value

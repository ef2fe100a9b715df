"""Synthetic trial outcomes for the tests, built through servetune's own models (`servetune.study.outcome`)."""

from typing import TYPE_CHECKING, Any

from servetune.measure.metrics import LevelMetrics
from servetune.study.outcome import Failure, LevelOutcome, TrialOutcome

if TYPE_CHECKING:
    from servetune.study.results import TrialRow

_NONE = {"request_goodput", "max_concurrency", "steady_request_rate", "keep_up_ratio", "keep_up_se", "per_turn",
         "ttft_ms_per_prompt_token", "ttft_ms_per_prompt_token_se"}


def level_metrics(**given: Any) -> LevelMetrics:
    """A level's metrics: the fields given, every other one 0 (None where a metric can be missing)."""
    fields = {name: None if name in _NONE else {} if name == "errors" else False if info.annotation is bool else 0
              for name, info in LevelMetrics.model_fields.items()}
    return LevelMetrics(**(fields | given))


def level(name: str = "search", rate: float = 1.0, *, passed: bool = True, reasons: list[str] | None = None,
          verdict: str | None = None, seed: int = 0, records: str = "level.jsonl", server: dict | None = None,
          **metrics: Any) -> LevelOutcome:
    """A level at `rate` whose metrics are `metrics` (see `level_metrics`); its verdict is `verdict`, else
    pass or fail as `passed` says."""
    verdict = verdict or ("pass" if passed else "fail")
    return LevelOutcome(name=name, rate=rate, seed=seed, verdict=verdict, passed=verdict == "pass",
                        reasons=reasons or [], metrics=level_metrics(offered_request_rate=rate, **metrics),
                        server=server, records=records, rejected=0, attempts=1)


def ok(config: dict | None = None, **facts: Any) -> TrialOutcome:
    return TrialOutcome(status="ok", config=config or {}, **facts)


def failed(config: dict | None = None, kind: str = "oom", reason: str = "out of memory", **facts: Any) -> TrialOutcome:
    return TrialOutcome.failed(config or {}, Failure(kind=kind, reason=reason, log="server.log"), **facts)


def row(trial: int, role: str = "search", **given: Any) -> "TrialRow":
    """A measured trial's row (`results.TrialRow`): the fields given, status ok, every other one None."""
    from servetune.study.results import TrialRow

    fields = {name: None for name, info in TrialRow.model_fields.items() if info.is_required()}
    return TrialRow(**(fields | {"trial": trial, "role": role, "status": "ok", "config": {}, "slo_p99": {}} | given))

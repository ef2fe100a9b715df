"""What the report reads from a study beside its results (`servetune.study.results`): the study itself, parameter
importances, and the JSON/CSV exports."""

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from servetune.jsonio import jsonable, write_atomic, write_json
from servetune.study.record import StudyRecord
from servetune.study.results import TrialRow
from servetune.study.storage import STUDY_NAME, StudyError, sqlite_file, study_exists

MIN_IMPORTANCE_TRIALS = 4  # completed trials with searched params before importances mean anything


def load_study(storage: str) -> StudyRecord:
    """The servetune study in `storage`; StudyError when there is none. Nothing is written into the storage
    before it is known to hold a servetune study (a missing or empty SQLite file stays as it is)."""
    path = sqlite_file(storage)
    if path is not None and not path.exists():
        raise StudyError(f"no servetune study in {storage}: no such file")
    if path is not None and path.is_file() and path.stat().st_size == 0:
        raise StudyError(f"no servetune study in {storage}: the file is empty")
    if not study_exists(storage, read_only=True):
        raise StudyError(f"no servetune study in {storage}")
    record = StudyRecord(optuna.load_study(storage=storage, study_name=STUDY_NAME))
    if not record.has_meta:
        raise StudyError(f"the study in {storage} was not written by servetune tune (no meta)")
    return record


def importances(record: StudyRecord) -> tuple[dict[str, float], str | None]:
    """Optuna's parameter importances for the objective, and a note when they are missing or shaky."""
    study = record.study
    searched = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.params]
    if len(searched) < MIN_IMPORTANCE_TRIALS:
        return {}, (f"Parameter importance needs at least {MIN_IMPORTANCE_TRIALS} completed searched trials; "
                    f"this study has {len(searched)}.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = optuna.importance.get_param_importances(study)
    shaky = [str(w.message) for w in caught if "importance" in str(w.message).lower()]
    return result, (f"Estimated from {len(searched)} completed trials; Optuna warns that it may be inaccurate "
                    f"({shaky[0]}).") if shaky else None


def write_trials_json(record: StudyRecord, path: Path) -> None:
    """Every trial: number, state, params, value and its whole record as stored (the full outcome)."""
    write_json(path, {"meta": record.stored_meta, "trials": record.exported()})


def write_levels_csv(trial_rows: list[TrialRow], path: Path) -> None:
    """One row per load level of every measured trial: its verdict, every metric and the server's counters."""
    table = []
    for row in trial_rows:
        for index, level in enumerate(row.levels):
            entry: dict[str, Any] = {
                "trial": row.trial, "role": str(row.role), "level": index, "name": str(level.name),
                "rate": level.rate, "verdict": str(level.verdict), "passed": level.passed,
                "reasons": "; ".join(level.reasons), "stopped": level.stopped,
            }
            entry |= level.metrics.model_dump()
            entry |= {f"server_{k}": v for k, v in (level.server or {}).items()}
            entry["records"] = level.records
            table.append(entry)
    columns = list(dict.fromkeys(k for entry in table for k in entry)) or ["trial"]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    for entry in table:
        writer.writerow({k: _cell(v) for k, v in entry.items()})
    write_atomic(path, text.getvalue())


def _cell(value: Any) -> Any:
    return json.dumps(jsonable(value)) if isinstance(value, (dict, list)) else jsonable(value)

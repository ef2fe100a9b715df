"""A tuning study: Optuna storage (SQLite by default, any SQLAlchemy URL) plus per-trial artifacts on disk.

Each trial's outcome lives in its Optuna user attributes (`outcome`: a `TrialOutcome` with its schema version,
validated when read back) and its raw files under `OUT/trials/NNNN/` (server log, per-level request records).
"""

import json
import sqlite3
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

from servetune.errors import ServetuneError
from servetune.outcome import TrialOutcome
from servetune.redact import redact

STUDY_NAME = "servetune"
optuna.logging.set_verbosity(optuna.logging.WARNING)


class StudyError(ServetuneError):
    """A study cannot be created or resumed as asked."""


def default_storage(out: Path) -> str:
    return f"sqlite:///{(out / 'study.db').resolve()}"


def sqlite_file(storage: str) -> Path | None:
    """The file of an SQLite storage URL (`sqlite:///path`); None for another database or an in-memory one."""
    try:
        url = sqlalchemy.engine.make_url(storage)
    except sqlalchemy.exc.ArgumentError:
        return None
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:") or url.database.startswith("file:"):
        return None
    return Path(url.database)


def study_exists(storage: str, read_only: bool = False) -> bool:
    """Whether `storage` holds a servetune study, found without writing into it: a missing SQLite file is not
    created, nor an empty one given Optuna's tables (`report`, and a `--resume` that finds no study, leave the
    storage as they found it). StudyError, one line, for a storage that cannot be opened, a file that is not
    an SQLite database and a corrupt one. `read_only`: an SQLite file is opened read-only, so not even the
    rollback of a write a killed run left unfinished (which a writer does on opening) happens."""
    path = sqlite_file(storage)
    if path is not None:
        return _sqlite_holds_study(path, read_only)
    try:
        engine = sqlalchemy.create_engine(storage)
        try:
            with engine.connect() as connection:
                return sqlalchemy.inspect(connection).has_table("studies") and connection.execute(
                    sqlalchemy.text("SELECT 1 FROM studies WHERE study_name = :name"), {"name": STUDY_NAME}
                ).first() is not None
        finally:
            engine.dispose()
    except Exception as e:  # a storage we cannot open: the caller reports it
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StudyError(redact(f"cannot open study storage {storage}: {reason}")) from None


_SQLITE_HEADER = b"SQLite format 3\x00"


def _sqlite_holds_study(path: Path, read_only: bool) -> bool:
    """Whether the SQLite file at `path` holds a servetune study (a missing or empty file holds none); its
    pages are checked (`PRAGMA quick_check`), so a corrupt file is named before a tuner writes into it."""
    try:
        if not path.exists() or path.stat().st_size == 0:
            return False
        with path.open("rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except OSError as e:
        raise StudyError(f"{path}: cannot read the study: {e.strerror}") from None
    if header != _SQLITE_HEADER:
        raise StudyError(f"{path} is not an SQLite database (it lacks SQLite's header), so not a study: move it "
                         "away or use another --out/--study")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode={'ro' if read_only else 'rw'}", uri=True)
        try:
            check = " ".join(connection.execute("PRAGMA quick_check").fetchone()[0].split())  # may span lines
            if check != "ok":
                raise StudyError(f"{path} is a corrupt SQLite database ({check}): restore it or use another "
                                 "--out/--study")
            tables = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'studies'")
            return tables.fetchone() is not None and connection.execute(
                "SELECT 1 FROM studies WHERE study_name = ?", (STUDY_NAME,)).fetchone() is not None
        finally:
            connection.close()
    except sqlite3.OperationalError as e:  # cannot open, locked, or (read-only) a hot journal to roll back
        unfinished = read_only and path.with_name(path.name + "-journal").exists()
        raise StudyError(f"{path}: cannot read the study: {e}" + (
            f" (a write left unfinished by a stopped run, in {path.name}-journal: `tune --resume` recovers it)"
            if unfinished else "")) from None
    except sqlite3.DatabaseError as e:
        raise StudyError(f"{path} is a corrupt SQLite database ({e}): restore it or use another --out/--study"
                         ) from None


def check_storage(storage: str, resume: bool) -> bool:
    """Whether `storage` holds a study; StudyError unless it opens and `resume` matches (an existing study
    needs `resume`, `resume` needs one). Cheap: the tuner calls it before probing vLLM, and again on opening."""
    exists = study_exists(storage)
    if exists and not resume:
        raise StudyError(f"{redact(storage)} already holds a study; pass --resume to continue it, or use another "
                         "--out/--study")
    if resume and not exists:
        raise StudyError(f"--resume: no study to resume in {redact(storage)}")
    return exists


def open_study(storage: str, sampler: optuna.samplers.BaseSampler, meta: dict[str, Any], resume: bool) -> optuna.Study:
    """Create the study, or with `resume` continue it. Refuses to mix studies (`check_storage`), and a
    resumed one must be for the same model, workload, SLOs and objective."""
    exists = check_storage(storage, resume)
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction="maximize", sampler=sampler,
                                load_if_exists=True)
    if exists:
        old = study.user_attrs.get("meta", {})
        for key in ("model", "workload", "slo", "objective"):
            if json.dumps(old.get(key), sort_keys=True) != json.dumps(meta.get(key), sort_keys=True):
                raise StudyError(f"--resume: the study in {redact(storage)} has another {key}: {old.get(key)!r}")
        requeue_interrupted(study)
    else:
        study.set_user_attr("meta", meta)
    return study


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a killed run are marked FAIL (interrupted) and queued again; completed
    trials are kept as they are."""
    again = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in again:
        requeue(study, t, "the tuner stopped during the trial")
    return [t.number for t in again]


def requeue(study: optuna.Study, t: FrozenTrial, why: str) -> None:
    """Mark a trial that never finished FAIL (`interrupted`: why) and queue its params again, same role."""
    study._storage.set_trial_user_attr(t._trial_id, "interrupted", why)
    study.tell(t.number, state=TrialState.FAIL)
    kept = {k: v for k, v in t.user_attrs.items() if k in ("role", "ladder", "reference", "why")}
    study.enqueue_trial(t.params, user_attrs=kept | {"planned": t.user_attrs.get("planned", t.params)},
                        skip_if_exists=False)


def trial_dir(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:04d}"


def outcome(t: FrozenTrial) -> TrialOutcome | None:
    """The trial's outcome, validated (StudyError for one this servetune cannot read), or None."""
    stored = t.user_attrs.get("outcome")
    if stored is None:
        return None
    try:
        return TrialOutcome.read(stored)
    except ValueError as e:  # pydantic's ValidationError included
        raise StudyError(f"trial {t.number}'s outcome cannot be read: {str(e).splitlines()[0]}") from None


def measured(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that launched a server (completed or failed), in order; not infeasible or interrupted ones."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and "outcome" in t.user_attrs]

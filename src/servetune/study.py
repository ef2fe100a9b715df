"""A tuning study: Optuna storage (SQLite by default, any SQLAlchemy URL) plus per-trial artifacts on disk.

What servetune keeps in the study beside Optuna's own facts is its record (`servetune.record`: each trial's
record with its outcome, the study's meta, progress and head-to-head); each trial's raw files lie under
`OUT/trials/NNNN/` (server log, per-level request records).
"""

import fcntl
import hashlib
import json
import os
import socket
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState

from servetune.errors import StudyError
from servetune.record import StudyMeta, StudyRecord
from servetune.redact import redact

__all__ = ["STUDY_NAME", "DEFINING", "StudyError", "StudyLock", "check_storage", "default_storage", "open_study",
           "requeue_interrupted", "sqlite_file", "study_exists", "trial_dir"]

STUDY_NAME = "servetune"
optuna.logging.set_verbosity(optuna.logging.WARNING)


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
        raise StudyError(redact(f"cannot open study storage {storage}: {_first_line(e)}")) from None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


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


# What defines a study, as its meta records it, and the option that sets each: a resumed study must have them
# all as it was made (the budget, the time limit and the parallelism may change).
DEFINING = {"model": "--model", "workload": "--workload", "slo": "--slo", "objective": "--objective",
            "strategy": "--strategy", "seed": "--seed", "user_engine_args": "--engine-arg",
            "references": "--reference-config", "optional_knobs": "--knob", "tokenizer": "--tokenizer",
            "levels": "the level options (--level-requests, --min-level-requests, --max-levels, --confidence, "
                      "--request-timeout)",
            "confirm": "--confirm/--no-confirm", "min_model_len": "--min-model-len"}


def open_study(storage: str, sampler: optuna.samplers.BaseSampler, meta: StudyMeta, resume: bool,
               backend: optuna.storages.BaseStorage | None = None) -> StudyRecord:
    """Create the study, or with `resume` continue it. Refuses to mix studies (`check_storage`), and a
    resumed one must have been made with every option that defines it (`DEFINING`) as given now. `backend`:
    Optuna storage to keep it in instead of `storage`'s (the simulated engine's in-memory one)."""
    exists = check_storage(storage, resume)
    study = optuna.create_study(storage=backend or storage, study_name=STUDY_NAME, direction="maximize",
                                sampler=sampler, load_if_exists=True)
    record = StudyRecord(study)
    if exists:
        old, new = record.stored_meta, meta.stored()
        if "levels" not in old:
            raise StudyError(f"--resume: the study in {redact(storage)} was made by an older servetune, whose "
                             "levels were not decided by a statistical test: start a new study (another --out)")
        for key, option in DEFINING.items():
            if _canonical(old.get(key)) != _canonical(new.get(key)):
                raise StudyError(f"--resume: {option} differs from the study's: it was {_shown(old.get(key))}, "
                                 f"now {_shown(new.get(key))}; resume with the options it was made with, or "
                                 "use another --out/--study")
        record.continued()
        requeue_interrupted(record)
    else:
        record.start(meta)
    return record


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


class StudyLock:
    """One tuner per study at a time: an exclusive lock on `out/.servetune.lock` (flock: released when the
    process ends, however it ends, so a crash leaves no stale lock) holding who took it; and for a PostgreSQL
    study, shared by hosts, a session advisory lock on the server too. A second tuner gets StudyError naming
    the holder."""

    FILE = ".servetune.lock"

    def __init__(self, out: Path, storage: str):
        self.path, self.storage = out / self.FILE, storage
        self.fd: int | None = None
        self.connection = None

    def acquire(self) -> "StudyLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode(errors="replace").strip()
                os.close(fd)
                raise StudyError(f"the study in {self.path.parent} is being tuned by {holder or 'another servetune'}"
                                 ": wait for it to end, or stop it (Ctrl-C), then --resume") from None
            try:
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed it on release since we opened it: take the new one
        os.ftruncate(fd, 0)
        since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
        self.fd = fd
        if self.storage.startswith("postgresql"):
            self._lock_server()
        return self

    def _lock_server(self) -> None:
        """A PostgreSQL advisory lock for the study, held by this process's own connection."""
        import sqlalchemy

        try:
            connection = sqlalchemy.create_engine(self.storage).connect()
        except Exception as e:  # a server we cannot reach: say so in one line, as `study_exists` does
            self.release()
            raise StudyError(redact(f"cannot open study storage {self.storage}: {_first_line(e)}")) from None
        key = int.from_bytes(hashlib.sha256(f"servetune:{STUDY_NAME}".encode()).digest()[:8], "big", signed=True)
        if not connection.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar():
            connection.close()
            self.release()
            raise StudyError(f"the study in {redact(self.storage)} is being tuned by another servetune (it holds "
                             "the study's lock on the database server): wait for it to end, then --resume")
        self.connection = connection

    def release(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # before unlocking: a tuner that opened it now retries (acquire)
            os.close(self.fd)  # the flock goes with it
            self.fd = None


def requeue_interrupted(record: StudyRecord) -> list[int]:
    """Trials left RUNNING by a killed run are marked FAIL (interrupted) and queued again; completed
    trials are kept as they are."""
    again = record.trials((TrialState.RUNNING,))
    for t in again:
        record.requeue(t, "the tuner stopped during the trial")
    return [t.number for t in again]


def trial_dir(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:04d}"

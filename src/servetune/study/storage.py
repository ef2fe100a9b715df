"""A tuning study: Optuna storage (SQLite by default, any SQLAlchemy URL) plus per-trial artifacts on disk.

What servetune keeps in the study beside Optuna's own facts is its record (`servetune.study.record`: each trial's
record with its outcome, the study's meta, progress and head-to-head); each trial's raw files lie under
`OUT/trials/NNNN/` (server log, per-level request records).
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState

from servetune.errors import StudyError
from servetune.private import private_dir
from servetune.redact import redact, shown_url
from servetune.study.record import StudyMeta, StudyRecord

__all__ = ["STUDY_NAME", "DEFINING", "StudyError", "StudyLock", "check_resumable", "check_storage", "default_storage",
           "open_study", "requeue_interrupted", "sqlite_file", "storage_url", "stored_meta", "study_exists",
           "trial_dir", "tuner_of"]

STUDY_NAME = "servetune"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage_url(storage: str) -> sqlalchemy.engine.URL:
    """`storage` read as SQLAlchemy reads it; StudyError, one line, for text that is not a database URL."""
    try:
        return sqlalchemy.engine.make_url(storage)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        raise StudyError(f"--study: {redact(storage)} is not a database URL (e.g. sqlite:///study.db, "
                         "postgresql+psycopg://user@host/db)") from None


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
        raise StudyError(f"cannot open study storage {shown_url(storage)}: {redact(_first_line(e))}") from None


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
        raise StudyError(f"{shown_url(storage)} already holds a study; pass --resume to continue it, or use another "
                         "--out/--study")
    if resume and not exists:
        raise StudyError(f"--resume: no study to resume in {shown_url(storage)}")
    return exists


# What defines a study, as its meta records it, and the option that sets each: a resumed study must have them
# all as it was made (the budget, the time limit and the parallelism may change).
DEFINING = {"model": "--model", "workload": "--workload", "slo": "--slo", "objective": "--objective",
            "strategy": "--strategy", "seed": "--seed", "user_engine_args": "--engine-arg",
            "references": "--reference-config", "optional_knobs": "--knob", "tokenizer": "--tokenizer",
            "levels": "the level options (--level-requests, --min-level-requests, --max-levels, --level-window, "
                      "--confidence, --request-timeout)",
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
        check_resumable(storage, record.stored_meta, meta.stored())
        record.continued()
        requeue_interrupted(record)
    else:
        record.start(meta)
    return record


def stored_meta(storage: str) -> dict[str, Any]:
    """The meta of the study in `storage` as stored, read without writing into it."""
    return StudyRecord(optuna.load_study(storage=storage, study_name=STUDY_NAME)).stored_meta


def check_resumable(storage: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """StudyError unless the study in `storage`, whose stored meta is `old`, was made with every option that defines
    it (`DEFINING`) as `new` (meta as stored) has it, by a servetune whose levels are decided as now."""
    if "levels" not in old:
        raise StudyError(f"--resume: the study in {shown_url(storage)} was made by an older servetune, whose "
                         "levels were not decided by a statistical test: start a new study (another --out)")
    for key, option in DEFINING.items():
        if _canonical(old.get(key)) != _canonical(new.get(key)):
            was, now = _shown(old.get(key), new.get(key))
            raise StudyError(f"--resume: {option} differs from the study's: it was {was}, now {now}; resume "
                             "with the options it was made with, or use another --out/--study")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


SHOWN = 160  # characters of each value a refused resume shows
_ABSENT = object()


def _differing(old: Any, new: Any) -> tuple[Any, Any]:
    """`old` and `new` cut to what differs: two mappings to the keys whose values differ (recursively; a key one
    of them lacks is left out of that one), anything else as it is."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return old, new
    keys = sorted((k for k in old.keys() | new.keys()
                   if _canonical(old.get(k, _ABSENT)) != _canonical(new.get(k, _ABSENT))), key=str)
    cut = {k: _differing(old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in keys}
    return ({k: a for k, (a, _) in cut.items() if a is not _ABSENT},
            {k: b for k, (_, b) in cut.items() if b is not _ABSENT})


def _shown(old: Any, new: Any) -> tuple[str, ...]:
    """Both values as a refused resume shows them: only what differs (`_differing`), as JSON; a text longer
    than SHOWN is cut to a window that starts shortly before where the two texts first differ."""
    texts = [json.dumps(value, sort_keys=True, default=str) for value in _differing(old, new)]
    at = next((i for i, (a, b) in enumerate(zip(*texts)) if a != b), min(map(len, texts)))
    start = max(0, at - SHOWN // 4)
    return tuple(text if len(text) <= SHOWN else
                 ("..." if start else "") + text[start:start + SHOWN] + ("..." if start + SHOWN < len(text) else "")
                 for text in texts)


class StudyLock:
    """One tuner per study and per output directory at a time. The study is locked where it is, whatever
    `--out`: an SQLite study by a lock file beside its database (`.NAME.lock`), a PostgreSQL one by an advisory
    lock on its database server (which hosts share), any other storage by a lock file in this user's own
    directory (`servetune.private`: this host and user only); the output directory by `out/.servetune.lock`. A
    lock file is flocked (released when the process ends, however it ends, so a crash leaves no stale lock) and
    holds who took it. A second tuner gets StudyError naming the holder; a lock file that cannot be written (a full
    disk) is removed and said in one line. The output directory's lock file also holds ROOM bytes for the outputs,
    given back (`give_room`) when the disk fills during the tune, for summary.json to say so. `made_out`: the tuner
    made the output directory, which is removed on release (a refusal included) if nothing was written into it."""

    FILE = ".servetune.lock"
    ROOM = 256 * 1024  # room kept for the outputs: a summary.json of a hundred trials

    def __init__(self, out: Path, storage: str, made_out: bool = False):
        self.out, self.storage, self.made_out = out, storage, made_out
        self.held: list[tuple[Path, int]] = []  # (lock file, its descriptor)
        self.room: tuple[int, int] | None = None  # (the descriptor of the lock file holding ROOM, its holder's line)
        self.connection: sqlalchemy.Connection | None = None

    def acquire(self) -> "StudyLock":
        """Take the study's lock, then the output directory's; StudyError (nothing held) if either is taken."""
        try:
            if (path := self._study_file()) is not None:
                self._take(path, f"the study in {shown_url(self.storage)}", "then --resume")
            self._take(self.out / self.FILE, f"{self.out} (the output directory of another study)",
                       "or use another --out", room=self.ROOM)
            if storage_url(self.storage).get_backend_name() == "postgresql":
                self._lock_server()
        except BaseException:
            self.release()
            raise
        return self

    def _study_file(self) -> Path | None:
        """The study's lock file: beside an SQLite database; for a server's study other than PostgreSQL's, in
        this user's own directory, named by the storage (without its password) and the study's name."""
        url = storage_url(self.storage)
        if url.get_backend_name() == "sqlite":
            database = sqlite_file(self.storage)
            return None if database is None else database.resolve().with_name(f".{database.name}.lock")
        if url.get_backend_name() == "postgresql":
            return None
        key = f"{url.render_as_string(hide_password=True)} {STUDY_NAME}"
        with private_dir("study-locks") as locks:
            return locks.path / f"study-{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"

    def _take(self, path: Path, what: str, then: str, room: int = 0) -> None:
        """Flock `path` (made if missing) and write who holds it, then `room` bytes; StudyError naming the holder if
        another process holds it, or naming the error if the file cannot be written (it is removed). A symlink, a
        file with other links or another user's is refused as it is (`_own_file`)."""
        while True:
            fd = _own_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode(errors="replace").strip("\0").strip()
                os.close(fd)
                raise StudyError(f"{what} is being tuned by {holder or 'another servetune'}: wait for it to end, or "
                                 f"stop it (Ctrl-C), {then}") from None
            try:
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed it on release since we opened it: take the new one
        self.held.append((path, fd))
        line = f"{_holder()}\n".encode()
        try:
            os.ftruncate(fd, 0)
            if os.write(fd, line) != len(line):
                raise OSError(0, "short write")
            if room:
                os.posix_fallocate(fd, len(line), room)
                self.room = fd, len(line)
        except OSError as e:
            raise StudyError(f"cannot write the lock file {path}: {e.strerror}: free some space there (or use "
                             "another --out/--study)") from None

    def _lock_server(self) -> None:
        """A PostgreSQL advisory lock for the study, held by this process's own connection (not pooled: closing
        it ends the session, and the lock with it), which names this process as its application so that a second
        tuner can say who holds the lock."""
        try:
            connection = sqlalchemy.create_engine(
                self.storage, poolclass=sqlalchemy.pool.NullPool,
                connect_args={"application_name": _holder(since=False)[:63]}).connect()
        except Exception as e:  # a server we cannot reach: say so in one line, as `study_exists` does
            raise StudyError(f"cannot open study storage {shown_url(self.storage)}: {redact(_first_line(e))}"
                             ) from None
        self.connection = connection
        key = int.from_bytes(hashlib.sha256(f"servetune:{STUDY_NAME}".encode()).digest()[:8], "big", signed=True)
        if not connection.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar():
            holder = connection.execute(sqlalchemy.text(
                "SELECT a.application_name, a.backend_start FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid::bigint = :high "
                "AND l.objid::bigint = :low AND l.database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())"), {"high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF}
            ).first()
            who = (f"{holder[0] or 'another servetune'} since {holder[1].isoformat(timespec='seconds')}" if holder
                   else "another servetune")
            raise StudyError(f"the study in {shown_url(self.storage)} is being tuned by {who} (it holds the study's "
                             "lock on the database server): wait for it to end, or stop it (Ctrl-C), then --resume")

    def give_room(self) -> None:
        """The room the output directory's lock file holds, given back to the disk (its holder's line kept)."""
        if self.room is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(*self.room)

    def release(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        for path, fd in reversed(self.held):
            with contextlib.suppress(OSError):  # before unlocking: a tuner that opened it now retries (`_take`)
                if os.path.samestat(os.fstat(fd), os.lstat(path)):
                    path.unlink()
            os.close(fd)  # the flock goes with it
        self.held, self.room = [], None
        if self.made_out:
            with contextlib.suppress(OSError):  # not empty: the tune wrote its outputs there
                self.out.rmdir()


def _own_file(path: Path) -> int:
    """`path` opened for a lock (made 0644 if missing), not through a symlink: a regular file of this user's with no
    other link; StudyError otherwise, the file left as it is."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise StudyError(f"cannot make the lock file {path}: {e.strerror}") from None
        fd = None
    st = None if fd is None else os.fstat(fd)
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        if fd is not None:
            os.close(fd)
        raise StudyError(f"{path} is not a lock file of this user's (a symlink, or a link to another file): remove "
                         "it, or use another --out/--study")
    assert fd is not None  # st is its
    return fd


def _holder(since: bool = True) -> str:
    """Who takes a lock: this process and host (and since when)."""
    when = f" since {datetime.now(UTC).isoformat(timespec='seconds')}" if since else ""
    return f"pid {os.getpid()} on {socket.gethostname()}{when}"


def tuner_of(out: Path) -> str | None:
    """Who holds the lock of the output directory `out` (`StudyLock`), as its file says: None when there is
    no lock file, or when it names a process of this host that no longer runs (a tuner killed with SIGKILL)."""
    try:
        holder = (out / StudyLock.FILE).read_text(errors="replace").strip()
    except OSError:
        return None
    words = holder.split()
    if len(words) >= 4 and words[0] == "pid" and words[2] == "on" and words[3] == socket.gethostname():
        try:
            os.kill(int(words[1]), 0)
        except ProcessLookupError:
            return None
        except (PermissionError, ValueError):
            pass
    return holder or None


def requeue_interrupted(record: StudyRecord) -> list[int]:
    """Trials left RUNNING by a killed run are marked FAIL (interrupted) and queued again; completed
    trials are kept as they are."""
    again = record.trials((TrialState.RUNNING,))
    for t in again:
        record.requeue(t, "the tuner stopped during the trial")
    return [t.number for t in again]


def trial_dir(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:04d}"

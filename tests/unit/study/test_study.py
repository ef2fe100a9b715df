"""Opening a study's storage: a file that is not one, or a corrupt one, is named as such; looking for a study
(`report`, a `--resume` that finds none) never writes into the storage. In the CLI:
tests/integration/test_study_integration.py."""

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest

from servetune.report import write_report
from servetune.study.storage import STUDY_NAME, StudyError, check_storage, default_storage, sqlite_file, study_exists


def a_study(path: Path) -> bytes:
    """A small servetune-named Optuna study in SQLite at `path`; its bytes."""
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name=STUDY_NAME, direction="maximize")
    study.set_user_attr("meta", {"model": "m"})
    for value in (1.0, 2.0):
        trial = study.ask()
        trial.suggest_int("x", 0, 10)
        study.tell(trial, value)
    return path.read_bytes()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sqlite_file_of_a_storage_url(tmp_path):
    assert sqlite_file(default_storage(tmp_path)) == (tmp_path / "study.db").resolve()
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql+psycopg://u@h/db") is None
    assert sqlite_file("no url") is None


def test_a_study_is_found_and_nothing_is_written(tmp_path):
    path = tmp_path / "study.db"
    a_study(path)
    before = digest(path)
    assert study_exists(f"sqlite:///{path}") and study_exists(f"sqlite:///{path}", read_only=True)
    assert check_storage(f"sqlite:///{path}", resume=True)
    assert digest(path) == before


def test_looking_in_a_missing_or_empty_file_writes_nothing(tmp_path):
    missing, empty = tmp_path / "missing.db", tmp_path / "empty.db"
    empty.touch()
    for path in (missing, empty):
        assert not study_exists(f"sqlite:///{path}")
        with pytest.raises(StudyError, match="--resume: no study to resume"):
            check_storage(f"sqlite:///{path}", resume=True)
    assert not missing.exists() and empty.stat().st_size == 0


@pytest.mark.parametrize(("damage", "message"), [
    (lambda data: b"this is not a database\n", r"is not an SQLite database \(it lacks SQLite's header\)"),
    (lambda data: data[:16] + bytes(4096 - 16) + data[4096:], "is a corrupt SQLite database"),
    (lambda data: data[: len(data) // 2], r"is a corrupt SQLite database \(database disk image is malformed\)"),
    # a data page scrambled: Optuna only said "An exception is raised during the commit ... exceeding max length"
    (lambda data: data[:8192] + bytes(b ^ 0x5A for b in data[8192:12288]) + data[12288:],
     r"is a corrupt SQLite database \(\*\*\* in database main \*\*\* Page 3"),
])
def test_a_file_that_is_not_a_study_or_is_corrupt_is_named(tmp_path, damage, message):
    path = tmp_path / "study.db"
    path.write_bytes(damage(a_study(tmp_path / "good.db")))
    before = digest(path)
    for read_only in (False, True):
        with pytest.raises(StudyError, match=message) as error:
            study_exists(f"sqlite:///{path}", read_only=read_only)
        assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)
    with pytest.raises(StudyError, match=message):
        check_storage(f"sqlite:///{path}", resume=False)
    assert digest(path) == before


def test_report_on_another_optuna_study_writes_nothing(tmp_path):
    path = tmp_path / "study.db"
    optuna.create_study(storage=f"sqlite:///{path}", study_name="not-servetune")
    before = digest(path)
    with pytest.raises(StudyError, match="no servetune study in"):
        write_report(f"sqlite:///{path}", tmp_path / "report")
    assert digest(path) == before


def test_a_write_left_unfinished_is_rolled_back_by_a_tuner_and_named_by_report(tmp_path):
    """A run killed mid-commit leaves a hot journal: opening for writing (tune, --resume) rolls it back, as
    Optuna would; the read-only check (report) cannot, and says so."""
    live = tmp_path / "live.db"
    a_study(live)
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA cache_size = 1")  # spill to the file mid-transaction, with the journal beside it
    writer.execute("BEGIN")
    writer.executemany("INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (1, ?, ?)",
                       [(f"k{i}", "x" * 200) for i in range(3000)])
    path = tmp_path / "study.db"
    shutil.copy(live, path)
    shutil.copy(tmp_path / "live.db-journal", tmp_path / "study.db-journal")  # the file as a kill -9 leaves it
    writer.rollback()
    writer.close()
    with pytest.raises(StudyError, match=r"cannot read the study: .*study\.db-journal: `tune --resume` recovers it"):
        study_exists(f"sqlite:///{path}", read_only=True)
    assert study_exists(f"sqlite:///{path}")
    assert not os.path.exists(tmp_path / "study.db-journal") or os.path.getsize(tmp_path / "study.db-journal") == 0

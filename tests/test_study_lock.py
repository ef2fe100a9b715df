"""One tuner per study, whatever the storage and the --out: a second tuner of a study that
another is tuning is refused, naming the holder, before it touches the study, and the first loses nothing: SQLite
through two --out directories, PostgreSQL (a real server, on loopback only), another server's storage (on this host);
two studies in one --out; a lock that cannot be written (a full disk) is one line and leaves no file."""

import errno
import os
import socket
import threading
from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest

from conftest import listening, loopback_only, postgres_server
from servetune.study.storage import STUDY_NAME, StudyError, StudyLock
from servetune.trial.run import LevelOptions
from servetune.tuner.loop import TuneOptions, tune
from servetune.workload import WorkloadSpec
from test_tune_stops import WORKLOAD, StandIn

HOLDER = rf"pid {os.getpid()} on {socket.gethostname()} since \S+"


class Held(StandIn):
    """A stand-in whose trials finish once `go` is set: a tuner mid-trial for as long as a test needs."""

    def __init__(self, out: Path):
        super().__init__({0: 5.0}, out)
        self.go, self.running = threading.Event(), threading.Event()

    def submit(self, job) -> Future:
        done, future = super().submit(job), Future()

        def finish() -> None:
            self.running.set()
            self.go.wait(120)
            future.set_result(done.result())

        threading.Thread(target=finish, daemon=True).start()
        return future


def options(model, out: Path, storage: str | None, **kw) -> TuneOptions:
    """A one-trial grid tune of the tiny model (`kw` overrides), no head-to-head."""
    return TuneOptions(**{"model": str(model), "workload": WorkloadSpec.model_validate(WORKLOAD), "out": out,
                          "storage": storage, "slo": {"tpot_p99_ms": 25}, "strategy": "grid", "budget": 1,
                          "confirm": False, "levels": LevelOptions(requests=20, max_levels=1), **kw})


def refused_while_tuned(tiny_model, tmp_path: Path, storage: str) -> str:
    """A tune of the study in `storage` through --out tmp_path/first, mid-trial; a --resume of it through
    tmp_path/second is refused and leaves the running trial as it was; then the first ends with its trial measured.
    The refusal's message."""
    first = Held(tmp_path / "first")
    ended = {}
    thread = threading.Thread(target=lambda: ended.update(
        summary=tune(options(tiny_model, tmp_path / "first", storage), executor=first)))
    thread.start()
    try:
        assert first.running.wait(120)
        states = [t.state for t in optuna.load_study(study_name=STUDY_NAME, storage=storage).trials]
        assert optuna.trial.TrialState.RUNNING in states
        with pytest.raises(StudyError) as refused:
            tune(options(tiny_model, tmp_path / "second", storage, resume=True),
                 executor=StandIn({0: 9.0}, tmp_path / "second"))
        assert [t.state for t in optuna.load_study(study_name=STUDY_NAME, storage=storage).trials] == states
        assert not (tmp_path / "second").exists()  # the --out it made removed, its lock with it
    finally:
        first.go.set()
        thread.join(120)
    assert ended["summary"].state == "complete" and ended["summary"].trials == 1  # nothing lost
    return str(refused.value)


def test_a_second_tuner_of_a_sqlite_study_through_another_out_is_refused(tiny_model, tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    message = refused_while_tuned(tiny_model, tmp_path, storage)
    assert message.startswith(f"the study in {storage} is being tuned by pid {os.getpid()} on ")
    assert message.endswith("wait for it to end, or stop it (Ctrl-C), then --resume")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "shared.db"]  # no lock left


@pytest.mark.integration
def test_a_second_tuner_of_a_postgresql_study_is_refused_naming_the_holder_and_no_password(tiny_model, tmp_path):
    password = "se/cr@t: p%41ss w0rd"
    with postgres_server(password) as (storage, postmaster):
        assert loopback_only(listening({postmaster})), listening({postmaster})
        message = refused_while_tuned(tiny_model, tmp_path, storage)
    port = storage.rsplit(":", 1)[1].split("/")[0]
    assert message.startswith(f"the study in postgresql+psycopg://postgres:***@127.0.0.1:{port}/servetune is being "
                              f"tuned by pid {os.getpid()} on {socket.gethostname()} since ")
    assert "(it holds the study's lock on the database server)" in message
    assert "cr@t" not in message and "cr%40t" not in message


def test_the_study_of_another_server_is_locked_on_this_host(tmp_path):
    storage = "mysql+pymysql://alice:p%40ss@db.example/tunes"
    held = StudyLock(tmp_path / "a", storage)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    held.acquire()
    try:
        with pytest.raises(StudyError, match=rf"^the study in mysql\+pymysql://alice:\*\*\*@db.example/tunes is being "
                                             rf"tuned by {HOLDER}: wait"):
            StudyLock(tmp_path / "b", storage).acquire()
        assert StudyLock(tmp_path / "b", storage.replace("tunes", "other")).acquire().release() is None
    finally:
        held.release()
    assert StudyLock(tmp_path / "b", storage).acquire().release() is None


def test_two_studies_in_one_out_are_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    held = StudyLock(out, f"sqlite:///{tmp_path / 'a.db'}").acquire()
    try:
        with pytest.raises(StudyError, match=rf"^{out} \(the output directory of another study\) is being tuned by "
                                             rf"{HOLDER}: .*or use another --out$"):
            StudyLock(out, f"sqlite:///{tmp_path / 'b.db'}").acquire()
        assert not (tmp_path / ".b.db.lock").exists()  # the study's lock it had taken is given back
    finally:
        held.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and list(out.iterdir()) == []


def test_a_lock_that_cannot_be_written_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    def no_space(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("servetune.study.storage.os.write", no_space)
    with pytest.raises(StudyError, match=rf"^cannot write the lock file {tmp_path}/\.study\.db\.lock: No space left "
                                         r"on device: free some space there \(or use another --out/--study\)$"):
        StudyLock(tmp_path, f"sqlite:///{tmp_path / 'study.db'}").acquire()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_on_a_full_disk_the_lock_is_refused_and_no_file_is_left(full_disk):
    with pytest.raises(StudyError, match="cannot write the lock file .*: No space left on device"):
        StudyLock(full_disk, f"sqlite:///{full_disk / 'study.db'}").acquire()
    assert [p.name for p in full_disk.iterdir()] == ["filler"]


def test_the_lock_of_another_servers_study_is_never_made_through_a_planted_symlink(tmp_path, monkeypatch):
    """The study-lock directory of a non-SQLite, non-PostgreSQL study in TMPDIR, planted by a
    neighbour as a symlink to a directory of theirs, is not followed: the tune's lock lies in this user's own."""
    import tempfile

    shared, victim = tmp_path / "shared", tmp_path / "victim"
    shared.mkdir()
    victim.mkdir()
    (shared / "servetune-study-locks").symlink_to(victim)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    (tmp_path / "out").mkdir()
    held = StudyLock(tmp_path / "out", "mysql+pymysql://alice@db.example/tunes").acquire()
    try:
        assert list(victim.iterdir()) == []
    finally:
        held.release()


@pytest.mark.parametrize("planted", ["symlink", "hardlink"])
def test_a_lock_file_planted_as_a_link_to_another_file_is_refused_and_the_file_left_as_it_was(tmp_path, planted):
    """`out/.servetune.lock` as a link to a file of someone's: the tuner is refused in one line; the file keeps its
    bytes (it is neither truncated nor written) and stays."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    if planted == "symlink":
        (out / StudyLock.FILE).symlink_to(victim)
    else:
        os.link(victim, out / StudyLock.FILE)
    with pytest.raises(StudyError, match=rf"^{out}/\.servetune\.lock is not a lock file of this user's "):
        StudyLock(out, f"sqlite:///{tmp_path / 'study.db'}").acquire()
    assert victim.read_text() == "precious\n"
    assert (out / StudyLock.FILE).is_symlink() == (planted == "symlink")

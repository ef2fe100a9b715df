"""One tuner per study, whatever the storage and the --out: a second tuner of a study that
another is tuning is refused, naming the holder, before it touches the study, and the first loses nothing: SQLite
through two --out directories, another server's storage (on this host); two studies in one --out; a lock that cannot
be written is one line and leaves no file; a lock planted as a link is refused. On PostgreSQL and a full disk:
tests/integration/test_study_lock_integration.py."""

import errno
import os
import socket

import pytest

from servetune.study.storage import StudyError, StudyLock
from support.standins import refused_while_tuned

HOLDER = rf"pid {os.getpid()} on {socket.gethostname()} since \S+"


def test_a_second_tuner_of_a_sqlite_study_through_another_out_is_refused(tiny_model, tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    message = refused_while_tuned(tiny_model, tmp_path, storage)
    assert message.startswith(f"the study in {storage} is being tuned by pid {os.getpid()} on ")
    assert message.endswith("wait for it to end, or stop it (Ctrl-C), then --resume")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "shared.db"]  # no lock left


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

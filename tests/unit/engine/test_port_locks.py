"""The port locks: in this user's own directory (`servetune.private`), never one a neighbour planted or can reach;
a released lock leaves no file; a launch's compile cache lies in this user's own directory. Across processes (a
second user, a killed servetune, the CLI): tests/integration/test_port_locks_integration.py."""

import os
import stat
import tempfile
from pathlib import Path

import pytest

from servetune.engine.ports import port_locks, release_port, reserve_port
from servetune.private import NotPrivate


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch):
    """A temporary directory of the test's own as TMPDIR, no runtime directory: where a neighbour plants things."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return shared


def test_a_released_port_leaves_no_lock_file_and_the_directory_is_this_users_alone():
    port, fd = reserve_port()
    path = port_locks() / f"{port}.lock"
    assert path.exists()
    release_port(port, fd)
    assert not path.exists()
    for directory in (port_locks(), port_locks().parent):
        st = directory.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_a_lock_directory_a_neighbour_planted_as_a_symlink_is_never_followed(tmp_path, shared_tmp):
    """`ln -s VICTIM TMPDIR/servetune-port-locks` (and the new name too); a reservation neither
    makes nor removes a file in VICTIM (its unheld `db.lock` stays)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "db.lock").write_text("not servetune's")
    (shared_tmp / "servetune-port-locks").symlink_to(victim)
    port, fd = reserve_port()
    release_port(port, fd)
    assert [p.name for p in victim.iterdir()] == ["db.lock"]
    (shared_tmp / f"servetune-{os.geteuid()}" / "port-locks").rmdir()
    (shared_tmp / f"servetune-{os.geteuid()}" / "port-locks").symlink_to(victim)
    with pytest.raises(NotPrivate, match="port-locks is not a directory of this user's alone"):
        reserve_port()
    assert [p.name for p in victim.iterdir()] == ["db.lock"]


def test_a_lock_directory_others_can_write_is_refused_in_one_line(shared_tmp):
    own = shared_tmp / f"servetune-{os.geteuid()}"
    own.mkdir(mode=0o700)
    own.chmod(0o777)
    with pytest.raises(NotPrivate) as refused:
        reserve_port()
    assert str(refused.value) == (f"{own} is not a directory of this user's alone (owner uid {os.geteuid()}, mode "
                                  "0777): remove it, or set TMPDIR to a directory of yours")


def test_a_servers_compile_cache_lies_in_this_users_own_directory(tmp_path, shared_tmp, monkeypatch):
    """torch's default compile cache, TMPDIR/torchinductor_USER, is a name a neighbour can take first (or, in a
    TMPDIR of theirs, swap): what it holds is read by anyone, and the kernels in it are loaded by the server. A
    launch's cache is this user's own (servetune.private), unless the user chose one."""
    from servetune.engine import launcher
    from servetune.testing.installed import VLLM_CPU

    monkeypatch.setattr(launcher, "probe", lambda python: VLLM_CPU)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cache = Path(launcher.Engine("m", {}, tmp_path / "server.log").env()["TORCHINDUCTOR_CACHE_DIR"])
    assert cache == shared_tmp / f"servetune-{os.geteuid()}" / "torchinductor"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and cache.stat().st_uid == os.geteuid()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert launcher.Engine("m", {}, tmp_path / "server.log").env()["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")

"""The port locks: in this user's own directory (`servetune.private`), never one a neighbour planted or can reach;
a released lock leaves no file, a killed servetune's is swept by the next reservation."""

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from servetune.engine.ports import port_locks, release_port, reserve_port
from servetune.private import NotPrivate

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a second user")
@pytest.mark.integration
def test_a_second_user_neither_shares_nor_reaches_the_first_users_locks():
    """root holds a port; a forked child that became `nobody` reserves and releases ports in a directory of its
    own, and can neither list root's directory nor remove root's lock file."""
    port, fd = reserve_port()
    mine = port_locks()
    try:
        child = os.fork()
        if child == 0:  # the child reports through its exit status only
            try:
                os.setgid(65534)
                os.setuid(65534)
                other, other_fd = reserve_port()
                theirs = port_locks()
                release_port(other, other_fd)
                try:
                    os.listdir(mine)
                    os._exit(3)
                except PermissionError:
                    pass
                try:
                    os.unlink(mine / f"{port}.lock")
                    os._exit(5)
                except PermissionError:
                    pass
                os._exit(0 if theirs != mine else 6)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (mine / f"{port}.lock").exists()
    finally:
        release_port(port, fd)


@pytest.mark.integration
def test_the_lock_file_of_a_killed_servetune_is_swept_by_the_next_reservation():
    """A process killed while holding a port leaves its file (unlocked); the next reservation removes it."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        port, _ = reserve_port()
        os.write(write, str(port).encode())
        os.kill(os.getpid(), 9)  # holding the lock
    os.waitpid(child, 0)
    os.close(write)
    stale = port_locks() / f"{int(os.read(read, 16))}.lock"
    os.close(read)
    assert stale.exists()
    port, fd = reserve_port()
    try:
        assert not stale.exists()
    finally:
        release_port(port, fd)


@pytest.mark.integration
def test_a_tune_whose_lock_directory_is_not_its_own_is_refused_in_one_line_before_any_work(tiny_model, tmp_path):
    """A neighbour's `TMPDIR/servetune-UID` (here: one open to everyone): `servetune tune` exits 2 naming it, with
    nothing made in --out."""
    shared = tmp_path / "shared"
    (shared / f"servetune-{os.geteuid()}").mkdir(parents=True)
    (shared / f"servetune-{os.geteuid()}").chmod(0o777)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"} | {"TMPDIR": str(shared)}
    proc = subprocess.run([sys.executable, "-m", "servetune", "tune", "--model", str(tiny_model), "--workload",
                           str(ROOT / "examples" / "chat.yaml"), "--slo", "tpot_p99_ms=50", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"error: {shared}/servetune-{os.geteuid()} is not a directory of this user's alone (owner uid "
        f"{os.geteuid()}, mode 0777): remove it, or set TMPDIR to a directory of yours"]
    assert not (tmp_path / "out").exists()


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


@pytest.mark.integration
def test_importing_torch_leaves_no_compile_cache_in_the_temporary_directory(tiny_model, tmp_path):
    """Importing torch (here for the tokenizer) makes TMPDIR/torchinductor_USER and points TORCHINDUCTOR_CACHE_DIR at
    it; a launch from that process took it for the user's choice, so a neighbour could read and plant the kernels the
    server loads. servetune's process keeps the cache in this user's own directory before anything imports torch."""
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "XDG_RUNTIME_DIR")}
    proc = subprocess.run([sys.executable, "-m", "servetune", "bench", "--base-url", "http://127.0.0.1:9", "--model",
                           str(tiny_model), "--input-len", "8", "--output-len", "4", "--num-prompts", "2", "--json",
                           str(tmp_path / "o.json")], capture_output=True, text=True, env=env | {"TMPDIR": str(shared)},
                          timeout=120)
    assert "cannot reach an OpenAI-compatible server" in proc.stderr  # past the tokenizer
    assert sorted(p.name for p in shared.iterdir()) == [f"servetune-{os.geteuid()}"]
    assert sorted(p.name for p in (shared / f"servetune-{os.geteuid()}").iterdir()) == ["torchinductor"]

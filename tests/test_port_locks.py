"""The host-wide port locks: any user's servetune can take a port, and a released lock leaves no file."""

import os
import stat
import socket

import pytest

from servetune.engine import launcher
from servetune.engine.launcher import release_port, reserve_port


def test_a_released_port_leaves_no_lock_file_and_the_directory_is_sticky_and_world_writable():
    port, fd = reserve_port()
    path = launcher.port_locks() / f"{port}.lock"
    assert path.exists()
    release_port(port, fd)
    assert not path.exists()
    assert stat.S_IMODE(launcher.port_locks().stat().st_mode) == 0o1777


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a second user")
def test_a_second_user_takes_ports_beside_the_first(monkeypatch):
    """root holds a port (its lock file stays while held); a forked child that became `nobody` reserves and
    releases ports in the same directory, and does not get root's."""
    port, fd = reserve_port()
    offered = iter([port])
    monkeypatch.setattr(launcher, "free_port", lambda host: next(offered, 0) or socket_port())
    try:
        child = os.fork()
        if child == 0:  # the child reports through its exit status only
            try:
                os.setgid(65534)
                os.setuid(65534)
                other, other_fd = reserve_port()
                release_port(other, other_fd)
                os._exit(0 if other != port else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(child, 0)
    finally:
        release_port(port, fd)
    assert os.waitstatus_to_exitcode(status) == 0


def socket_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    stale = launcher.port_locks() / f"{int(os.read(read, 16))}.lock"
    os.close(read)
    assert stale.exists()
    port, fd = reserve_port()
    try:
        assert not stale.exists()
    finally:
        release_port(port, fd)

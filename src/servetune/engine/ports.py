"""Free loopback ports for servers, each reserved by a lock file while its server runs, so that trials side by side
(in one servetune or several of this user's) never hand one port to two servers. The lock files lie in this user's
own directory (`servetune.private`): nothing another user plants there is followed, made or removed. A port that
another user's server takes first is retried by the launcher."""

import fcntl
import os
import socket
from pathlib import Path

from servetune.private import NotPrivate, PrivateDir, private_dir

LOCKS = "port-locks"


def port_locks() -> Path:
    """The directory of this user's port locks (made, and checked this user's alone, when first needed)."""
    with private_dir(LOCKS) as locks:
        return locks.path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def reserve_port(host: str = "127.0.0.1") -> tuple[int, int]:
    """A free port that no other servetune process of this user holds: (port, fd of its lock file); give it back
    with `release_port`. The lock (flock, released when the fd closes or the process dies) is on a file named by
    the port; the stale files of killed servetunes are swept first."""
    with private_dir(LOCKS) as locks:
        _sweep_stale_locks(locks)
        while True:
            port = free_port(host)
            name = f"{port}.lock"
            fd = locks.open(name, os.O_CREAT | os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.path.samestat(os.fstat(fd), locks.lstat(name)):
                    return port, fd
            except (BlockingIOError, FileNotFoundError):
                pass
            os.close(fd)  # held by another, or unlinked by its releaser since we opened it


def _sweep_stale_locks(locks: PrivateDir) -> None:
    """Remove the lock files nobody holds: those of a servetune that was killed (SIGKILL) before releasing."""
    for name in locks.names():
        if not name.endswith(".lock"):
            continue
        try:
            fd = locks.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), locks.lstat(name)):
                locks.unlink(name)
        except OSError:  # held, or gone already
            pass
        finally:
            os.close(fd)


def release_port(port: int, fd: int) -> None:
    """Remove the lock file `reserve_port` made and unlock."""
    try:
        with private_dir(LOCKS) as locks:
            locks.unlink(f"{port}.lock")
    except (OSError, NotPrivate):  # gone already, or the directory is no longer this user's alone: left as it is
        pass
    finally:
        os.close(fd)

"""Directories of this user's alone, for lock files and caches: `$XDG_RUNTIME_DIR/servetune/NAME` where that runtime
directory is this user's own, else `$TMPDIR/servetune-UID/NAME`, each made 0700. Every step is opened without
following a symlink and checked (a directory, this user's, closed to others) before anything is made or removed in
it, and what is made or removed goes through the open descriptor: whatever a neighbour plants or renames in a shared
temporary directory is refused, never followed (what PostgreSQL and systemd do with their runtime files)."""

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servetune.errors import ServetuneError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotPrivate(ServetuneError):
    """A directory servetune would keep its lock files in is not this user's alone."""


class PrivateDir:
    """An open directory of this user's alone (`private_dir`); names in it are opened and removed through it,
    never through a symlink."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """`os.open` of `name` in this directory, not through a symlink."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    def names(self) -> list[str]:
        return os.listdir(self.fd)


def _base() -> tuple[Path, str]:
    """(the directory the user's own goes in, its name there): the runtime directory where it is this user's alone,
    else the temporary directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        try:
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                return Path(runtime), "servetune"
        except OSError:
            pass
    return Path(tempfile.gettempdir()), f"servetune-{os.geteuid()}"


def _enter(parent: int, name: str, path: Path) -> int:
    """The directory `name` in `parent` (made 0700 if missing), opened and checked; NotPrivate otherwise."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as e:
        raise NotPrivate(f"cannot make {path}: {e.strerror}") from None
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        raise NotPrivate(f"{path} is not a directory of this user's alone ({e.strerror}: a symlink or a file?): "
                         f"remove it, or set TMPDIR to a directory of yours") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise NotPrivate(f"{path} is not a directory of this user's alone (owner uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):04o}): remove it, or set TMPDIR to a directory of yours")
    return fd


@contextmanager
def private_dir(name: str) -> Iterator[PrivateDir]:
    """This user's own directory `name` (see the module), open for as long as this lasts; NotPrivate, one line
    naming it, when a step of it is not this user's alone or cannot be made."""
    base, own = _base()
    try:
        parent = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise NotPrivate(f"cannot open the temporary directory {base}: {e.strerror}") from None
    try:
        top = _enter(parent, own, base / own)
    finally:
        os.close(parent)
    try:
        fd = _enter(top, name, base / own / name)
    finally:
        os.close(top)
    try:
        yield PrivateDir(fd, base / own / name)
    finally:
        os.close(fd)

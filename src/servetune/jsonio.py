"""Strict JSON out: infinite rates as "inf" (JSON has no Infinity), paths and enums as text. Every output is
written whole or not at all (a temporary file renamed into place): a stopped run never leaves a truncated one, and a
full disk leaves the file that was there before."""

import errno
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROBE_BYTES = 4096  # what `check_writable` writes: a disk already full is refused before the work


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary file in the same directory, renamed into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(jsonable(value), indent=2) + "\n")


def check_writable(path: Path) -> None:
    """Make `path`'s directory and check that a file of PROBE_BYTES can be written there as `path`, before any
    work that would be lost if it could not (a full disk too): OSError (with the path) otherwise, and the
    directories it made removed."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a directory")
    existing = next(p for p in path.parents if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file, not a directory")
    made = [p for p in path.parents if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".check")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(PROBE_BYTES))
        finally:
            os.unlink(tmp)
    except OSError:
        for directory in made:  # the deepest first
            if directory.exists():
                directory.rmdir()
        raise


def write_or_beside(path: Path, write: Callable[[Path], None], what: str) -> tuple[Path | None, str | None]:
    """`write(path)`; if that fails (a full disk, a directory gone read-only), `write` to a file of the same name in
    a directory of this process's own in the temporary directory (`kept_dir`), readable by this user alone. (Where
    it went, None if nowhere; None, or a sentence saying where `what` is and why not at `path`.)"""
    try:
        write(path)
        return path, None
    except OSError as e:
        failed = f"{what} could not be written to {path} ({e.strerror or e})"
    try:
        fallback = kept_dir() / path.name
        write(fallback)
        os.chmod(fallback, 0o600)
    except OSError as e:
        return None, f"{failed} nor to the temporary directory ({e.strerror or e})"
    return fallback, f"{failed}; they are in {fallback}"


_kept: list[Path] = []


def kept_dir() -> Path:
    """This process's directory for what could not be written where asked: made 0700 under a name nobody else can
    have taken (`tempfile.mkdtemp`), again if it was removed."""
    if not (_kept and _kept[-1].is_dir()):
        _kept.append(Path(tempfile.mkdtemp(prefix=f"servetune-kept-{os.getpid()}-")))
    return _kept[-1]

"""Strict JSON out: infinite rates as "inf" (JSON has no Infinity), paths and enums as text. Every output is
written whole or not at all (a temporary file renamed into place): a stopped run never leaves a truncated one."""

import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


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
    """Make `path`'s directory and check a file can be written there as `path`, before any work that would
    be lost if it could not: OSError (with the path) otherwise."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a directory")
    existing = next(p for p in path.parents if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file, not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".check")
    os.close(fd)
    os.unlink(tmp)


def write_json_or_beside(path: Path, value: Any) -> Path:
    """`write_json` to `path`; if that fails (a full disk, a directory gone read-only), to a file of the same
    name in the temporary directory instead. Returns where it went."""
    try:
        write_json(path, value)
        return path
    except OSError:
        fallback = Path(tempfile.gettempdir()) / f"servetune-{os.getpid()}-{path.name}"
        write_json(fallback, value)
        return fallback

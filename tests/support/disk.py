"""A disk made full: the tests of what servetune does when a write meets ENOSPC."""

import os
from pathlib import Path


def fill(path: Path) -> None:
    """Write zeros to `path` until its file system has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(65536)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)

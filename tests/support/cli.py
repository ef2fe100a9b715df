"""servetune's command line, run as a user runs it."""

import subprocess
import sys

SERVETUNE = [sys.executable, "-m", "servetune"]


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`servetune ARGS...` run to its end, what it printed captured."""
    return subprocess.run([*SERVETUNE, *args], capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The last line `proc` printed to stderr."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, proc
    return lines[-1]

"""Run a command so that it never outlives the process that started this guard.

Usage: python _guard.py CMD [ARG ...], with SERVETUNE_GUARD_PARENT set to the starter's pid (so that a starter
that dies before the guard is up is seen). Start it as the leader of a new process group. The guard asks the
kernel for SIGTERM when its parent dies (even by SIGKILL), and on SIGTERM/SIGINT/SIGHUP, or when CMD
exits, it stops the whole group: TERM, a grace period (SERVETUNE_GRACE_S, default 5 s), then KILL (the shared
memory the killed processes mapped removed after them); then it removes the directory SERVETUNE_GUARD_SCRATCH names
(CMD's temporary one).
CMD itself gets SIGTERM from the kernel if the guard is killed before it can do that.
A standalone script, so it needs nothing but the standard library.
"""

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
GUARD_PARENT_ENV = "SERVETUNE_GUARD_PARENT"  # the pid of the process that started the guard
GUARD_SCRATCH_ENV = "SERVETUNE_GUARD_SCRATCH"  # a directory the guard removes once the group has stopped
KILL_WAIT_S = 5.0  # the longest the KILLed processes are waited for (one stuck in the kernel may never go)


def _stop_group(grace_s: float) -> None:
    """TERM every other process of this group, wait, then KILL them (`kill_others`)."""
    pgid = os.getpgid(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not members(pgid):
            return
        time.sleep(0.1)
    kill_others(pgid)


def kill_others(pgid: int) -> None:
    """KILL the processes of group `pgid` but this one, then remove the shared memory (/dev/shm) they mapped that
    nobody maps any more: vLLM, killed, leaves its message queues' segments behind (~400 MB a launch)."""
    held, deadline = shared_memory(members(pgid)), time.monotonic() + KILL_WAIT_S
    while (others := members(pgid)) and time.monotonic() < deadline:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    release(held)


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def members(pgid: int) -> list[int]:
    """The live processes of group `pgid` but this one."""
    me, found = os.getpid(), []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != me:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(pid))
    return found


def shared_memory(pids: list[int]) -> set[str]:
    """The /dev/shm files the processes `pids` map."""
    return {path for pid in pids for path in _mapped(pid) if path.startswith("/dev/shm/")}


def _mapped(pid: str | int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return set()


def release(paths: set[str]) -> None:
    """Remove each of `paths` that no process maps."""
    if not paths:
        return
    mapped = set().union(*(_mapped(pid) for pid in os.listdir("/proc") if pid.isdigit()))
    for path in paths - mapped:
        with contextlib.suppress(OSError):
            os.unlink(path)


def die_with(parent: int) -> bool:
    """Ask the kernel for SIGTERM when this process's parent (pid `parent`) dies, even by SIGKILL. False
    if it died already, before the request took effect. The stop signals are unblocked first: a process started
    from a thread that blocks them (a Ray worker's) inherits that mask and would never see its parent die."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == parent


def main() -> int:
    if not die_with(int(os.environ.pop(GUARD_PARENT_ENV, os.getppid()))):  # its parent died before it asked
        return 1
    grace_s = float(os.environ.get("SERVETUNE_GRACE_S", "5"))

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    code = 1
    try:
        guard = os.getpid()
        child = subprocess.Popen(sys.argv[1:], preexec_fn=lambda: die_with(guard))  # TERM if this guard is killed
        code = child.wait()
    except KeyboardInterrupt:
        code = 143
    finally:
        _stop_group(grace_s)
        if scratch := os.environ.get(GUARD_SCRATCH_ENV):
            shutil.rmtree(scratch, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

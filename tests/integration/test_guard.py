"""The guard that every vLLM server runs under (`engine/_guard.py`): its command never outlives the process that
started it, even one killed by SIGKILL from a thread that blocks the stop signals (as a Ray worker's threads do)."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import alive, wait_for
from servetune.engine import launcher

pytestmark = pytest.mark.integration  # starts processes

GUARD = Path(launcher.__file__).with_name("_guard.py")


@pytest.mark.parametrize("blocked", [False, True], ids=["signals-open", "sigterm-blocked"])
def test_a_guarded_command_dies_with_the_process_that_started_it(tmp_path, blocked):
    starter = tmp_path / "starter.py"
    starter.write_text(textwrap.dedent(f"""
        import signal, subprocess, sys, threading, time

        def launch():
            if {blocked}:
                signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM, signal.SIGINT, signal.SIGHUP}})
            guard = subprocess.Popen([sys.executable, {str(GUARD)!r}, "sleep", "600"], start_new_session=True)
            print(guard.pid, flush=True)
            guard.wait()

        threading.Thread(target=launch).start()
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(starter)], stdout=subprocess.PIPE, text=True)
    guard = int(proc.stdout.readline())
    assert wait_for(lambda: any(_argv0(pid) == "sleep" for pid in _group(guard)), 20)  # the guard's command is up
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        assert wait_for(lambda: not alive(guard), 20), "the guard outlived the process that started it"
        assert wait_for(lambda: not _group(guard), 20), "the guarded command outlived its guard"
    finally:
        for pid in _group(guard):
            os.kill(pid, signal.SIGKILL)


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def _pgid(pid: str) -> int | None:
    try:
        return os.getpgid(int(pid))
    except OSError:
        return None


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p.name) == pgid
            and alive(int(p.name))]


def test_a_guard_whose_starter_died_before_it_was_up_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a starter already dead when the guard asks to die with it
    guard = subprocess.run([sys.executable, str(GUARD), "touch", str(marker)], start_new_session=True,
                           env=os.environ | {"SERVETUNE_GUARD_PARENT": str(gone.pid)}, timeout=30)
    assert guard.returncode == 1 and not marker.exists()
    subprocess.run([sys.executable, str(GUARD), "touch", str(marker)], start_new_session=True, check=True,
                   env=os.environ | {"SERVETUNE_GUARD_PARENT": str(os.getpid())}, timeout=30)
    assert marker.exists()


def test_a_server_stopped_while_an_interrupt_unwinds_gets_the_short_grace(tmp_path, monkeypatch):
    """servetune took 5.6 s (tune) and 9-14 s (verify) to exit after SIGTERM, a vLLM that is
    still starting up waiting out the whole grace before its KILL; stopped by an interrupt, a server gets
    STOP_GRACE_S, so that servetune exits within a supervisor's 5 s."""
    from servetune.interrupt import Interrupted
    from servetune.testing.installed import VLLM_CPU

    graces = []
    monkeypatch.setattr(launcher, "probe", lambda python: VLLM_CPU)
    monkeypatch.setattr(launcher, "_kill_group", lambda proc, grace_s: graces.append(grace_s))
    engine = launcher.Engine("m", {}, tmp_path / "server.log")
    engine.proc = subprocess.Popen(["true"])  # a stand-in: `_kill_group` is stood in for
    engine.stop()
    for stop in (Interrupted(signal.SIGTERM), KeyboardInterrupt()):
        engine.proc = subprocess.Popen(["true"])
        try:
            raise stop
        except KeyboardInterrupt:
            engine.stop()
    assert graces == [launcher.GRACE_S, launcher.STOP_GRACE_S, launcher.STOP_GRACE_S]
    assert launcher.STOP_GRACE_S < 5 and launcher.GRACE_S > launcher.STOP_GRACE_S


STUBBORN = textwrap.dedent("""
    import signal, sys, time
    from multiprocessing import shared_memory
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as vLLM while it starts up
    segment = shared_memory.SharedMemory(create=True, size=1 << 20)  # as vLLM's message queues
    print(segment.name, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("killer", ["servetune", "guard"])
def test_a_server_killed_after_its_grace_leaves_no_shared_memory(killer):
    """A vLLM killed while it starts up left its message queues' shared memory in /dev/shm (two segments, ~400 MB,
    a launch here): what the group's processes map when they are killed is removed once nobody maps it, whether
    servetune kills the group (`_kill_group`) or the guard does (servetune gone)."""
    command = [sys.executable, "-c", STUBBORN]
    if killer == "guard":
        command = [sys.executable, str(GUARD), *command]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env=os.environ | {"SERVETUNE_GRACE_S": "0.5"})
    segment = Path("/dev/shm") / proc.stdout.readline().strip()
    try:
        assert segment.exists()
        if killer == "servetune":
            launcher._kill_group(proc, grace_s=0.5)
        else:
            proc.send_signal(signal.SIGTERM)  # what the guard gets when servetune dies
            proc.wait(timeout=30)
        assert wait_for(lambda: not _group(proc.pid), 10)
        assert not segment.exists()
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)
        segment.unlink(missing_ok=True)

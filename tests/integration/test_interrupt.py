"""Stopping on a signal (`servetune.interrupt`): the stop it raises reaches the main code wherever the signal lands."""

import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration  # starts processes


def test_a_stop_that_lands_in_a_finalizer_is_raised_again_outside_it():
    """Python runs a signal's handler wherever the main thread is, a weakref callback or `__del__` included, and an
    exception raised there is printed and dropped: a tune sent SIGTERM while the garbage collector ran such a
    callback went on to launch its next server. The dropped stop is raised again, outside the finalizer, within
    moments."""
    script = textwrap.dedent("""
        import signal, time, weakref
        from servetune.interrupt import Interrupted, handle_signals
        handle_signals()

        class Thing:
            pass

        def finalizer(ref):
            signal.raise_signal(signal.SIGTERM)
            sum(range(100000))  # the handler runs here, inside the callback

        thing = Thing()
        ref = weakref.ref(thing, finalizer)
        try:
            del thing
            went_on = time.monotonic() + 5
            while time.monotonic() < went_on:  # a tune's work after the callback
                sum(range(1000))
            print("went on")
        except Interrupted as e:
            print("stopped", e.exit_code)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "stopped 143", proc.stderr
    assert "Exception ignored" not in proc.stderr


def test_a_launch_outside_the_cli_unwinds_on_a_stop_signal_nobody_handles_and_keeps_a_handler_someone_set():
    """A server launched by a library's caller (a bench script, a trial's worker process) is stopped by the `with`
    that launched it when SIGTERM comes: the signal, left at its default, would end the process without unwinding.
    A handler the caller set for a stop signal is theirs and stays."""
    script = textwrap.dedent("""
        import signal
        from servetune.interrupt import Interrupted, handle_unhandled_signals
        signal.signal(signal.SIGHUP, lambda signum, frame: print("caller's own", signum))
        handle_unhandled_signals()
        signal.raise_signal(signal.SIGHUP)
        try:
            signal.raise_signal(signal.SIGTERM)
            print("went on")
        except Interrupted as e:
            print("stopped", e.exit_code)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[:2] == [f"caller's own {int(signal.SIGHUP)}", "stopped 143"], proc.stderr

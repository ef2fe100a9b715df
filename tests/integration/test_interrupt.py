"""Stopping on a signal (`servetune.interrupt`): the stop it raises reaches the main code wherever the signal lands."""

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

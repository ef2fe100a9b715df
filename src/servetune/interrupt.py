"""Stopping on a signal: SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread, so a bench or a
tune unwinds as on Ctrl-C (servers stopped by their `finally`, outputs written) and exits 128 + the signal.
Installed explicitly, whatever the parent set: a script's `cmd &` starts a program with SIGINT ignored."""

import _thread
import signal
import sys
import threading


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal; `exit_code` is the shell's 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.exit_code = signum, 128 + signum


def exit_code(e: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (a plain KeyboardInterrupt), else the signal's own code."""
    return e.exit_code if isinstance(e, Interrupted) else 128 + signal.SIGINT


def handle_signals() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise `Interrupted` from now on (main thread only). Python runs the handler
    wherever the main thread is, and drops what it raises inside a finalizer (a weakref callback, `__del__`, run by
    the garbage collector): a stop dropped there is signalled again, to be raised outside it."""

    def on_signal(signum, frame):
        raise Interrupted(signum)

    dropped = sys.unraisablehook

    def raise_again(unraisable) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            # from another thread, a moment later: the main thread takes it once out of here (else it comes back)
            threading.Timer(0.05, _thread.interrupt_main, args=(unraisable.exc_value.signum,)).start()
        else:
            dropped(unraisable)

    sys.unraisablehook = raise_again
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

"""Stopping on a signal, all of it here: SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread, so a
bench or a tune unwinds as on Ctrl-C (servers stopped by the `with` that launched them, outputs written) and exits
128 + the signal. The CLI installs that explicitly, whatever the parent set (a script's `cmd &` starts a program with
SIGINT ignored); a launch installs it only for the stop signals nobody handles (a library's caller keeps its own).
An event loop takes the signals over while it runs (`cancelled_by_signals`)."""

import _thread
import asyncio
import signal
import sys
import threading
from collections.abc import Awaitable
from typing import TypeVar

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
T = TypeVar("T")


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal; `exit_code` is the shell's 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.exit_code = signum, 128 + signum


def exit_code(e: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (a plain KeyboardInterrupt), else the signal's own code."""
    return e.exit_code if isinstance(e, Interrupted) else 128 + signal.SIGINT


def _on_signal(signum, frame):
    raise Interrupted(signum)


def handle_signals() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise `Interrupted` from now on (main thread only). Python runs the handler
    wherever the main thread is, and drops what it raises inside a finalizer (a weakref callback, `__del__`, run by
    the garbage collector): a stop dropped there is signalled again, to be raised outside it."""
    dropped = sys.unraisablehook

    def raise_again(unraisable) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            # from another thread, a moment later: the main thread takes it once out of here (else it comes back)
            threading.Timer(0.05, _thread.interrupt_main, args=(unraisable.exc_value.signum,)).start()
        else:
            dropped(unraisable)

    sys.unraisablehook = raise_again
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)


def handle_unhandled_signals() -> None:
    """Make SIGTERM and SIGHUP raise `Interrupted` where nobody handles them (their default, which would end the
    process without unwinding), in the main thread; SIGINT already raises KeyboardInterrupt by default. For a
    server launched outside the CLI (a bench script, a trial's worker process)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)


async def cancelled_by_signals(work: Awaitable[T]) -> T:
    """Await `work` with SIGINT, SIGTERM and SIGHUP, where Python handles them, taken by the event loop: the signal
    cancels the work, which then raises `Interrupted`. Raised by the handler itself, the interrupt can land inside a
    transport's callback, where the loop takes it for that connection's error and the load goes on (a bench sent
    SIGTERM ran to its end and exited 0). The handlers are put back after."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None  # awaited in a task (asyncio.run's)
    caught: list[signal.Signals] = []
    taken = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    taken = {sig: handler for sig, handler in taken.items() if callable(handler)}

    def cancel(sig: signal.Signals) -> None:
        caught.append(sig)
        task.cancel()

    for sig in list(taken):
        try:
            loop.add_signal_handler(sig, cancel, sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            del taken[sig]
    try:
        result = await work
    except asyncio.CancelledError:
        if not caught:
            raise
    finally:
        for sig, handler in taken.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
    if caught:  # also where the work took the cancel as a stop and returned what it had
        raise Interrupted(caught[0])
    return result

"""SIGINT, SIGTERM and SIGHUP as one clean stop, for the programs that start local clusters.

Python turns only SIGINT into an exception; SIGTERM and SIGHUP kill the process on the spot, and a
second Ctrl-C lands in the middle of the clean-up the first one started. Both leave masters,
workers, their tasks and network namespaces running. Inside `handled()` (or after `install()`):

- the first of these signals raises `Interrupted` in the main thread: a KeyboardInterrupt, so
  `finally` blocks, pytest's fixture finalizers and click's abort all run as for Ctrl-C;
- inside `deferred()` (the clean-up itself: `synapse.local.cluster.down`) a signal waits until
  the block ends, so a half-done `down` never leaves a cluster half stopped;
- once one has been raised, repeats for the next REPEAT_GRACE_S seconds only say that the
  clean-up goes on (a user pressing Ctrl-C again, a closing terminal's SIGHUP after Ctrl-C);
- a signal that was ignored when the handlers were installed stays ignored (`nohup`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: After the first interrupt, repeats within this many seconds are reported and otherwise ignored.
REPEAT_GRACE_S = 60.0


class Interrupted(KeyboardInterrupt):
    """The program was asked to stop by a signal; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    """Process-wide, touched only from the main thread (where Python runs signal handlers)."""

    raised_at: float | None = None  #: monotonic time the last Interrupted was raised
    deferring = 0  #: depth of `deferred()` blocks the main thread is in
    pending: int | None = None  #: a signal that arrived inside `deferred()`, raised at its end
    doing = "stopping what it started"  #: said to a user who signals again


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:  # the terminal has gone (SIGHUP): nobody to tell
        pass


def _handler(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    recent = _State.raised_at is not None and time.monotonic() - _State.raised_at < REPEAT_GRACE_S
    if recent:
        _say(f"\n{name}: still {_State.doing}; please wait\n")
        return
    if _State.deferring:
        if _State.pending is None:
            _State.pending = signum
            _say(f"\n{name}: {_State.doing} first\n")
        return
    _State.raised_at = time.monotonic()
    raise Interrupted(signum)


def install(doing: str = "") -> Callable[[], None]:
    """Handle SIGINT, SIGTERM and SIGHUP as the module says; returns a function that puts the
    previous handlers back. Only the main thread can install handlers: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if doing:
        _State.doing = doing
    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _handler)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return restore


@contextmanager
def handled(doing: str = "") -> Iterator[None]:
    """`install()` for the length of a block."""
    restore = install(doing)
    try:
        yield
    finally:
        restore()


@contextmanager
def deferred() -> Iterator[None]:
    """Hold back an interrupt while the block runs; raise it at the end unless one was raised
    already (then the block is part of the clean-up that one started)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
        if not _State.deferring and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            _State.raised_at = time.monotonic()
            raise Interrupted(signum)  # the interrupt the block held back

"""A run's stop signals: SIGTERM, SIGINT and SIGHUP, which once.run.wrapper forwards to the
command while it runs, and Stop, which notes them where no command runs (a claim, a final
write, between a catch-up's periods) instead of dying of them.

Imports only signal: a single `once run` notes them from its claim on, and a claim that
loses pays for no more (the wrapper is imported only by a run that won); the guard and the
kept guard take FORWARDED from here, and threading's fork hook would double the cost of every
command the kept guard forks (caught() imports it, in once's own process).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Outcome.message of a command that a stop signal kept from starting (Stop).
NOT_STARTED = "not started"


class Stop:
    """The first stop signal (SIGTERM, SIGINT, SIGHUP) that a run got: no command starts
    after it, the wrapper's run() forwards it to the one in hand, and what is left of a run of
    several commands (catch-up's periods, --all-shards' shards) is left for the next fire
    (docs/concepts/liveness.md). caught() notes one that comes where no command runs (a
    claim, a final write), run() one that comes while its command runs, or a Ctrl-C on the
    terminal that the command had (which sends SIGINT to the command's process group
    alone)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def note(self, number: int) -> None:
        if self.signal is None:
            self.signal = number

    @contextmanager
    def caught(self) -> Iterator[Stop]:
        """Note the stop signals instead of dying of them (a signal ignored when once started
        stays ignored); the main thread's alone (signal handlers are)."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in FORWARDED}
        for sig, handler in previous.items():
            if handler != signal.SIG_IGN:
                signal.signal(sig, lambda number, _frame: self.note(number))
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def signal_name(number: int) -> str:
    """A signal's name (SIGTERM), for a `once:` line."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

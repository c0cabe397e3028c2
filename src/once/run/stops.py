"""A run's stop signals: SIGTERM, SIGINT and SIGHUP, which once.run.wrapper forwards to the
command while it runs, and Stop, which notes them where no command runs (a claim, a final
write, between a catch-up's periods) instead of dying of them.

held_back: a single `once run`'s (and `once rerun`'s) from its claim to its final write.

Imports only signal (once's messages when it says a line): every run loads it before its
claim, and a claim that loses pays for no more (the wrapper is imported only by a run that
won); the guard and the kept guard take FORWARDED from here, and threading's fork hook would
double the cost of every command the kept guard forks (caught() imports it, in once's own
process).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

if TYPE_CHECKING:
    from once.messages import Voice

    class _Run(Voice, Protocol):
        stop: Stop | None  # once.run.flow.Settings'

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
    alone): those were forwarded, the command had them.

    overdue: a single run's (held_back): it holds a signal back only while a claim or a
    final write is in hand, and is called (in a thread of its own) when that takes longer
    than `grace` seconds, or at once with a second signal: it ends the process."""

    def __init__(self, grace: float = 0.0,
                 overdue: Callable[[int], object] | None = None) -> None:
        self.signal: int | None = None
        self.forwarded = False  # the first was the command's too
        self.grace, self.overdue = grace, overdue
        self._timer: Any = None

    def note(self, number: int, forwarded: bool = False) -> None:
        if self.signal is None:
            self.signal, self.forwarded = number, forwarded

    def _caught(self, number: int) -> None:
        if self.overdue is not None and self.signal is not None:
            self.overdue(number)  # a second: no more waiting
        self.note(number)
        if self.overdue is not None and self._timer is None:
            import threading

            self._timer = threading.Timer(self.grace, self.overdue, (number,))
            self._timer.daemon = True
            self._timer.start()

    def held_back(self) -> int | None:
        """The signal caught outside a command (none was forwarded), its timer stopped: the
        caller acts on it now."""
        if self._timer is not None:
            self._timer.cancel()
        return None if self.signal is None or self.forwarded else self.signal

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
                signal.signal(sig, lambda number, _frame: self._caught(number))
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


# How long a single run holds a stop signal back while its claim or final write is in hand:
# a ledger that answers finishes it; one that does not is left as before the signal was held
# back (a claim taken goes stale), rather than keep an orchestrator's grace period waiting.
STOP_GRACE = 5.0


@contextmanager
def held_back(run: _Run) -> Iterator[None]:
    """A stop signal held back (run.stop) from the claim to the final write: one that came
    between the claim's commit and the command's start, or while the result was written,
    left the period's row running, taken over only after --stale-after (a done period then
    ran again). Then it acts as it would have: once dies of it, before its pings and hooks.
    No command starts after it; past STOP_GRACE, or at a second signal, once ends where it
    is (_overdue). One the command had (forwarded) leaves once to end as the command did. A
    catch-up's (--all-shards') Stop holds it for the whole run already."""
    if run.stop is not None:
        yield
        return
    stop = Stop(STOP_GRACE, lambda number: _overdue(number, run))
    with stop.caught():
        run.stop = stop
        try:
            yield
        finally:
            run.stop = None
    held = stop.held_back()
    if held is not None:
        signal.signal(held, signal.SIG_DFL)
        die_of(held)


def die_of(number: int) -> NoReturn:
    """End once as signal `number` does at the handler now set: death at the default,
    KeyboardInterrupt at Python's for SIGINT. As PID 1 (a container's init), whom the kernel
    spares its own signals at their default (it went on, and exited 0), the status that
    death would have given: 128+N."""
    signal.raise_signal(number)
    raise SystemExit(128 + number)


def _overdue(number: int, run: _Run) -> None:
    """A held stop signal whose claim or write is not done within STOP_GRACE (the ledger slow
    or gone), or a second one: once ends now (status 128+N), as it did before it held them."""
    from once.messages import ERROR, say

    what = " ".join(str(run.context[key]) for key in ("job", "period") if key in run.context)
    say(f"{what}: stopped by {signal_name(number)} while the ledger was being written (it had "
        f"not answered within {STOP_GRACE:g}s, or a second signal came); the period is left "
        f"as the ledger has it: a claim it took goes stale after --stale-after", run, ERROR,
        "stopped")
    os._exit(128 + number)

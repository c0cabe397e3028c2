"""The clock and the rules every lease deadline follows, shared by the CLI, run.flow, the API,
the lease and the wrapper.

Kept apart from once.run.wrapper so that a `once run` that skips (and the CLI's option checks)
never imports the wrapper's process machinery.
"""

from __future__ import annotations

import _thread
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# --kill-after when it is not given; shortened to fit a short --stale-after (max_grace).
DEFAULT_KILL_AFTER = 10.0


def _lease_clock() -> Callable[[], float]:
    """CLOCK_BOOTTIME where there is one (Linux): unlike the monotonic clock it goes on
    counting while the machine is suspended, so an owner that wakes from a suspend knows at
    once that its lease ran out meanwhile. Elsewhere the monotonic clock."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            time.clock_gettime(boottime)
        except OSError:
            pass
        else:
            return lambda: time.clock_gettime(boottime)
    return time.monotonic


# Every lease deadline is computed and compared on this clock, in every process.
lease_now: Callable[[], float] = _lease_clock()


# The deadline of this thread's statements (statements_until). threading.local is this, but
# `threading` would be imported with it, and its fork hook, run in every child a catch-up's
# kept guard forks (once.run.keeper), doubled the CPU of each command's fork (0.4 ms).
_bound = _thread._local()


@contextmanager
def statements_until(deadline: float) -> Iterator[None]:
    """The ledger statements this thread sends in the block wait no longer than `deadline`
    (on the lease clock): a renewal is bounded by the lease it renews, whatever the
    statements' own timeouts (once.ledger.watchdog cancels it there)."""
    outer = getattr(_bound, "until", None)
    _bound.until = deadline if outer is None else min(outer, deadline)
    try:
        yield
    finally:
        _bound.until = outer


def statement_bound() -> float | None:
    """The deadline statements_until set for this thread's statements (None: none)."""
    return getattr(_bound, "until", None)


def max_grace(stale_after: float) -> float:
    """The longest --kill-after that fits a lease: a third of --stale-after.

    SIGKILL goes out at the lease's deadline (the last renewal sent + --stale-after) and
    SIGTERM --kill-after before it. Renewals are sent every third of --stale-after, so a
    third leaves the renewal due before the SIGTERM a whole interval to be answered: a live
    owner whose ledger answers is never stopped.
    """
    return stale_after / 3


def statement_timeout(stale_after: float) -> float:
    """How long one ledger statement or connect may take: well below --stale-after, so that
    nothing hangs past a lease's deadline, and never under a second or over ten. Also the
    least an owner's bounded statement (once.run.lease.Lease.call) is given past its limit."""
    return max(1.0, min(10.0, stale_after / 3))


def kill_after_problem(kill_after: float, stale_after: float) -> str:
    """Why a --kill-after that was asked for does not fit --stale-after ('' when it does)."""
    if kill_after <= max_grace(stale_after):
        return ""
    return (f"--kill-after {kill_after:g}s does not fit --stale-after {stale_after:g}s: the "
            f"command must be dead by the lease's deadline, so the grace is at most a third "
            f"of --stale-after ({max_grace(stale_after):.3g}s)")

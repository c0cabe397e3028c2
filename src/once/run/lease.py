"""The claim as its owner holds it: renewed on a heartbeat, lost on 'no row' or at its deadline,
and the bounded call every ledger statement of an owner goes through. No SQL here.

Shared by the wrapper of `once run` and the Python API (once.api), which renews from a
thread of its own. Every time here is on the lease clock (once.deadlines.lease_now), which
counts suspended time. Imports only the standard library and once.deadlines, once.run.guard.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Callable
from typing import TypeVar

from once.deadlines import lease_now, statement_timeout, statements_until
from once.run.stops import FORWARDED

T = TypeVar("T")


# An owner steps down at its lease's deadline less the command's grace (once.run.machine),
# waking at least every second: one that gets to it later than this past the deadline itself
# was stopped (SIGSTOP, a suspend) or starved meanwhile, whatever its renewals met.
STALLED = 1.0


class NoAnswer(Exception):
    """The ledger did not answer a statement before the lease's deadline."""


class Lease:
    """The claim as its owner sees it: renewed by a callback, lost on 'no row' or deadline.

    sent_at and every time here are on the lease clock (once.deadlines.lease_now).
    """

    def __init__(self, renew: Callable[[], bool], stale_after: float, sent_at: float) -> None:
        self._renew = renew
        self.stale_after = stale_after
        self.deadline = sent_at + stale_after
        self.last_sent = self.claimed_at = sent_at
        self.lost = False
        self.last_error: str = ""
        # What kind of failure that was (a LedgerError's `failure`: unreachable, transient,
        # unfit, slow, permanent; "no-answer"; "locked", with what it waited on in `waited_on`),
        # so that a `once:` line names it (once.run.attempt).
        self.failure = ""
        self.waited_on = ""  # a row lock: what another session held that a statement waited on
        # What the final write's tries waited on before its last got no answer ("no-answer"):
        # the lock, not an unreachable server, is what its line names (once.run.attempt).
        self.write_waited_on = ""
        # The heartbeat thread was left behind in a statement (or on its way to one): its
        # connection is its own from then on (never closed under it, never shared).
        self.stranded = False
        self.stepping_down = False  # the command is being stopped: see step_down_reason
        self.overslept = False  # a renewal came due only past the deadline: see renew_once
        # Held while a statement is in the ledger: the heartbeat thread and the final write
        # share one connection, and a renewal stuck in a hung server must not be joined by
        # another statement on it.
        self.lock = threading.Lock()

    @property
    def interval(self) -> float:
        return self.stale_after / 3

    def pause(self, ok: bool) -> float:
        """How long after the last renewal was sent the next one goes out: an interval; after
        a failure a quarter of one (at most 1 s, never hammering a dead server), so that a
        renewal that failed once (a killed connection, a lock held for a moment) is retried
        well before the step-down's SIGTERM, due an interval after it."""
        return self.interval if ok else min(self.interval / 4, 1.0)

    def next_renewal(self, ok: bool) -> float:
        """When the next renewal goes out (this lease's clock): a pause after the last one
        was sent."""
        return self.last_sent + self.pause(ok)

    @property
    def expired(self) -> bool:
        return lease_now() >= self.deadline

    def renew_once(self) -> bool:
        """One renewal; True when it succeeded. Sets `lost` when the row is no longer ours.

        Past the deadline nothing is sent: the claim may be another's by now, and a heartbeat
        would make a gone owner look alive for one more promise. A renewal first due then
        means that this process could not run (stopped, suspended, starved), not that the
        ledger failed."""
        if self.expired:
            self._overslept()
            return False
        if self.stepping_down:  # the command is being stopped: a renewal only holds it up
            return False
        with self.lock:
            sent = self.last_sent = lease_now()
            try:
                with statements_until(self.deadline):  # no wait outlives the lease
                    ours = self._renew()
            except Exception as exc:  # keep trying until the deadline
                # Once the owner steps down its reason stands (a stop; a renewal that got no
                # answer, which the bound's shutdown then fails), but for the lock it waited on.
                if not self.overslept and (not self.stepping_down or getattr(exc, "lock", "")):
                    self.failed(exc)
                return False
        if ours:
            # An answer that came too late (past the deadline, or once the command was being
            # stopped) does not undo a step-down, nor the reason it gives.
            if not (self.expired or self.stepping_down):
                self.last_error = ""
            self.deadline = max(self.deadline, sent + self.stale_after)
        else:
            self.lost = True
        return ours

    def failed(self, exc: BaseException) -> None:
        """Keep what a statement of this lease's met, for the `once:` line: a LedgerError's
        failure, or "locked" when it waited on a lock another session held (`waited_on`)."""
        self.last_error = str(exc)
        self.waited_on = getattr(exc, "lock", "")
        self.failure = "locked" if self.waited_on else getattr(exc, "failure", "unreachable")

    @staticmethod
    def now() -> float:
        """The clock of every lease deadline (once.deadlines.lease_now)."""
        return lease_now()

    def call(self, action: Callable[[], T], until: float | None = None) -> T:
        """Run one ledger statement under the lock; raise NoAnswer at `until` (default: the
        deadline).

        A driver may wait for ever on a server that stopped answering (psycopg has no
        client-side statement timeout): the statement then runs on a helper thread, which is
        left behind. Past `until` it still gets a short wait of its own.
        """
        floor = statement_timeout(self.stale_after)
        limit = self.deadline if until is None else until
        if not self.lock.acquire(timeout=max(floor, limit - lease_now())):
            raise NoAnswer("a renewal got no answer from the ledger")
        bound = lease_now() + max(floor, limit - lease_now())
        box: list[T] = []
        error: list[BaseException] = []
        done = threading.Event()

        def work() -> None:
            try:
                # PostgreSQL's watchdog cancels the statement just before the bound, so that
                # the server's answer (a row lock it waited on) comes by it: a statement left
                # waiting could land after once has said that it was not recorded.
                with statements_until(bound):
                    box.append(action())
            except BaseException as exc:  # handed to the caller
                error.append(exc)
            finally:
                self.lock.release()
                done.set()

        worker = _Worker.get()
        worker.submit(work)
        if not done.wait(max(0.0, bound - lease_now())):
            worker.abandon()  # stuck in the driver: later calls get a worker of their own
            raise NoAnswer("the final write got no answer from the ledger")
        if error:
            raise error[0]
        return box[0]

    def keep_alive(self, stop: threading.Event) -> None:
        """Renew every stale_after/3, counted from when the last renewal was sent (sooner
        after a failure, but never hammering a dead server), until stop is set, the row is
        lost or the deadline passes. For a thread of its own (the Python API's)."""
        ok = True
        while not (self.lost or self.expired):
            if stop.wait(max(0.0, self.next_renewal(ok) - self.now())):
                return
            ok = self.renew_once()

    def step_down_reason(self, overslept: float = 0.0) -> None:
        """The owner steps down: keep the reason. With no error seen, a renewal is still
        waiting for an answer; but a step-down that comes STALLED past the deadline, or past
        it from a wait that overran by STALLED (`overslept`: the caller woke that much later
        than it meant to), once renewals have begun, says that this process was stopped (or
        starved) meanwhile, whatever its renewals met then (a statement waits no longer than
        the deadline): a renewal the stop caught in flight got no answer as nothing here ran."""
        self.stepping_down = True
        late = lease_now() - self.deadline
        if self.lost:
            return
        stalled = late > STALLED or (late > 0 and overslept > STALLED)
        if stalled and self.last_sent > self.claimed_at:
            self.overslept = True
            how = (f"it stepped down {late:.1f}s after it" if late > STALLED
                   else f"it woke {overslept:.1f}s late")
            self.last_error = (f"its deadline passed while this process was stopped or "
                               f"suspended ({how})")
            self.failure = ""
        elif not self.lock.locked():
            self._overslept()
        elif not self.last_error:
            self.last_error = "a renewal got no answer from the ledger"
            self.failure = "no-answer"

    def _overslept(self) -> None:
        """No renewal failed, none is under way, and the deadline came: this process did not
        get to renew in time."""
        if not self.last_error:
            self.overslept = True
            self.last_error = ("its deadline passed before this process could renew (it was "
                               "stopped or suspended, or its claim took that long)")


class _Worker:
    """One thread that runs the statements Lease.call bounds, one after another: a catch-up
    writes a result per period, and a thread each cost more than the write. A worker left
    stuck in a hung statement is abandoned (its statement may still finish) and replaced."""

    _current: _Worker | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="once-finish")
        self.thread.start()

    @classmethod
    def get(cls) -> _Worker:
        with cls._guard:
            worker = cls._current
            # A fork (the Python API's) has no threads: its parent's worker is not its own.
            if worker is None or worker.pid != os.getpid() or not worker.thread.is_alive():
                worker = cls._current = _Worker()
            return worker

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def abandon(self) -> None:
        with self._guard:
            if _Worker._current is self:
                _Worker._current = None

    def _serve(self) -> None:
        # Signals are the main thread's business: keep them from interrupting a statement.
        signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
        while True:
            self.jobs.get()()

"""The watchdogs of the ledger's connections: of PostgreSQL's statements on the hot path
(once.ledger.postgres: one thread that cancels a statement at its first time limit and shuts
its connection's socket down at its second), of the commits that create, upgrade or prune the
ledger (watched_commit: the same limits), and of one whole read of `once serve`
(ReadWatchdog: its connection's socket shut down when the read outlasts its time).

Imports only the stdlib and the lease clock and its statements' bound (once.deadlines): a
connection's socket is its target's backend's to find (Dialect.socket_of).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from once.deadlines import lease_now, statement_bound

if TYPE_CHECKING:
    import psycopg

    from once.ledger.url import Target


def cancel(conn: psycopg.Connection[Any], timeout: float) -> None:
    """Cancel the statement in flight on conn (on a thread of its own: a server that does not
    answer may hold the request up to `timeout`)."""
    def send() -> None:
        with suppress(Exception):  # the socket's shutdown is the backstop
            cancel_safe = getattr(conn, "cancel_safe", None)  # psycopg 3.2
            if cancel_safe is not None:
                cancel_safe(timeout=max(1.0, timeout))
            else:
                conn.cancel()

    threading.Thread(target=send, daemon=True, name="once-cancel").start()


class _StatementWatchdog:
    """One thread for every statement's time limits, started with the first: a thread a
    statement (threading.Timer) cost half a millisecond each, two a period in a catch-up.
    Statements may be in flight on several connections at once (a renewal left stuck in a
    hung server, and the next statement on a fresh connection)."""

    def __init__(self) -> None:
        self.forked()
        # A fork has no thread, and may have copied the lock while the parent's thread held it.
        os.register_at_fork(after_in_child=self.forked)

    def forked(self) -> None:
        self._changed = threading.Condition()
        # token -> (its next deadline, the socket, the cancel still to send, the shutdown's)
        self._armed: dict[int, tuple[float, int, Callable[[], None] | None, float]] = {}
        self._cancelled: set[int] = set()
        self._tokens = 0
        self._watching = False
        # When the watcher looks next, at the latest (monotonic; inf: not before it is told,
        # 0: at once, as it starts): a statement whose deadline comes after that leaves it
        # asleep. A catch-up's statements, two a period, each woke it (a thread switch each)
        # only for it to wait again.
        self._wakes_at = 0.0

    def arm(self, fd: int, cancel_after: float, shut_after: float,
            cancel: Callable[[], None]) -> int:
        """Call cancel after cancel_after seconds, shut fd down after shut_after; sooner where
        the statement's thread is bounded (bounded)."""
        cancel_after, shut_after = bounded(cancel_after, shut_after)
        with self._changed:
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, daemon=True, name="once-watchdog").start()
            now = time.monotonic()
            deadline = now + cancel_after
            self._tokens += 1
            self._armed[self._tokens] = (deadline, fd, cancel, now + shut_after)
            if deadline < self._wakes_at:  # else it wakes in time anyway, and looks again
                self._wakes_at = deadline
                self._changed.notify()
            return self._tokens

    def disarm(self, token: int) -> bool:
        """Whether the statement's cancel was sent."""
        with self._changed:
            self._armed.pop(token, None)  # the thread wakes at the old deadline, finds nothing
            cancelled = token in self._cancelled
            self._cancelled.discard(token)
            return cancelled

    def _watch(self) -> None:
        with self._changed:
            try:
                while True:
                    now = time.monotonic()
                    for token, (deadline, fd, cancel, shut) in list(self._armed.items()):
                        if deadline > now:
                            continue
                        if cancel is not None:
                            self._cancelled.add(token)
                            self._armed[token] = (shut, fd, None, shut)
                            cancel()
                        else:
                            del self._armed[token]
                            shut_down(fd)
                    self._wakes_at = min((armed[0] for armed in self._armed.values()),
                                         default=math.inf)
                    self._changed.wait(None if self._wakes_at == math.inf
                                       else self._wakes_at - now)
            finally:  # never left without a watcher: the next statement starts another
                self._watching = False
                self._wakes_at = 0.0


WATCHDOG = _StatementWatchdog()

# How long before its bound a bounded statement is cancelled (at most: half the time left), so
# that the server's answer, which says what it waited for (a row lock), comes by the bound.
CANCEL_ANSWER = 0.5


def bounded(cancel_after: float, shut_after: float) -> tuple[float, float]:
    """A statement's limits (seconds from now), cut to the deadline its thread's statements
    are bounded by (once.deadlines.statements_until: a renewal's lease): cancelled
    CANCEL_ANSWER before it (a renewal sent late, halfway to it), its socket shut down at it.
    Without such a deadline, or with limits inside it, they are as given."""
    bound = statement_bound()
    if bound is None:
        return cancel_after, shut_after
    left = max(0.0, bound - lease_now())
    return min(cancel_after, max(left - CANCEL_ANSWER, left / 2)), min(shut_after, left)


def limits(statement_timeout: float) -> tuple[float, float]:
    """(when a PostgreSQL statement is cancelled, when its socket is shut down), in seconds,
    for a ledger's statement timeout (once.deadlines.statement_timeout): 15 s and 20 s with
    the default --stale-after, never under 3.75 s and 5 s."""
    limit = max(5.0, 2 * statement_timeout)
    return 0.75 * limit, limit


# What PostgreSQL says when a commit's wait for a synchronous standby is cancelled: the
# transaction stands on the primary alone. Its words are translated; its severity is not.
_UNCONFIRMED_SEVERITY = "WARNING"


def watched_commit(conn: psycopg.Connection[Any], commit: Callable[[], None],
                   statement_timeout: float) -> float | None:
    """Run `commit` (of a transaction on conn) under the statements' limits: a commit that
    waits for a synchronous standby that is down is cancelled at the first (its wait ends and
    the transaction stands on the primary alone), one whose server does not answer fails at
    the second. None when the commit was answered in time; the first limit when it was
    cancelled in its wait for a standby (no synchronous standby confirmed it)."""
    warnings: list[str] = []

    def noticed(notice: Any) -> None:
        if notice.severity_nonlocalized == _UNCONFIRMED_SEVERITY:
            warnings.append(str(notice.message_primary))

    cancel_at, shut_at = limits(statement_timeout)
    conn.add_notice_handler(noticed)
    token = WATCHDOG.arm(conn.pgconn.socket, cancel_at, shut_at,
                         lambda: cancel(conn, shut_at - cancel_at))
    try:
        commit()
    finally:
        cancelled = WATCHDOG.disarm(token)
        with suppress(Exception):  # a connection the watchdog shut down
            conn.remove_notice_handler(noticed)
    return cancel_at if cancelled and warnings else None


class ReadWatchdog:
    """Shuts a connection's socket down when the whole read on it outlasts its time (once
    serve's --read-timeout, a second past the statement timeout: a server that answers says
    why itself)."""

    def __init__(self, timeout: float, target: Target) -> None:
        self.timeout, self.target = timeout, target
        self.fired = False
        self.done = False
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None

    def arm(self, dbapi_conn: object) -> None:
        fd = _socket_of(self.target, dbapi_conn)
        if fd is None:
            return
        self.timer = threading.Timer(self.timeout + 1.0, self._fire, (fd,))
        self.timer.daemon = True
        self.timer.start()

    def _fire(self, fd: int) -> None:
        with self.lock:
            if not self.done:
                self.fired = True
                shut_down(fd)

    def cancel(self) -> None:
        with self.lock:
            self.done = True
        if self.timer is not None:
            self.timer.cancel()


def _socket_of(target: Target, dbapi_conn: object) -> int | None:
    """The connection's socket, None when it has none or cannot say: any object is asked (a
    SQLAlchemy connection's driver connection)."""
    with suppress(Exception):
        return target.backend.socket_of(dbapi_conn)
    return None


def shut_down(fd: int) -> None:
    """Shut a connection's socket down under its driver: the pending read fails at once
    (the watchdogs of PostgreSQL's statements and of once serve's reads)."""
    import socket

    with suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()

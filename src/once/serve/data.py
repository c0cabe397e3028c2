"""What `once serve` shows, read from the ledger in bounded time and without writing.

Every read is one read-only snapshot that gives up within about --read-timeout: the connect
is bounded by the driver's connect timeout, each statement by a server-side statement timeout
(PostgreSQL) or the driver's read timeout (MySQL/MariaDB, SQLite's busy timeout), and the
whole read by a watchdog that shuts the connection's socket down, so that a server that stops
answering (stopped, hung, partitioned) fails the read instead of holding it. Unlike the
commands, a read never creates or upgrades the ledger's tables: `once serve` changes nothing.

The data come from once.report's functions, so that the pages say what the commands say:
`/metrics` is `once metrics`, `/api/status` is `once status --json`, a job's page holds
`once history`, `once check` and `once status --timeline`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from once import report
from once.ledger import LedgerError, Target, describe, queries
from once.ledger import schema as tables
from once.ledger.engines import serve_engine
from once.ledger.reads import NoLedger, Snapshot
from once.periods import Period

STRIP = 30  # periods in each job's strip on the overview


@dataclass
class Fleet:
    """Every job (of the namespace) at the database's now, for `/`, `/api/status`, `/metrics`."""

    now: datetime
    states: list[report.JobState] = field(default_factory=list)
    strips: dict[str, list[tuple[Period, str]]] = field(default_factory=dict)
    metrics: str = ""


@dataclass
class JobPage:
    """One job for `/job/NAME`: its state, timeline, check findings and history."""

    now: datetime
    state: report.JobState
    cells: list[tuple[Period, str]]
    findings: list[report.Finding]
    tz: str
    entries: list[dict[str, Any]]


def read_fleet(target: Target, namespace: str | None, timeout: float,
               strips: bool = True, metrics: bool = False) -> Fleet:
    try:
        with read_only(target, timeout) as conn:
            snap = Snapshot.over(conn, target)
            states, now = report.survey_jobs(snap, None, namespace)
            fleet = Fleet(now, states)
            if strips:
                fleet.strips = {s.name: report.timeline_cells(snap, s, STRIP)
                                for s in states}
            if metrics:
                fleet.metrics = report.metrics_text(conn, states)
            return fleet
    except NoLedger:
        return Fleet(datetime.now(UTC), metrics=report.exposition([], {}))


def read_job(target: Target, name: str, timeout: float, limit: int = 100) -> JobPage | None:
    """The job's page; None when the job has never run."""
    try:
        with read_only(target, timeout) as conn:
            snap = Snapshot.over(conn, target)
            states, now = report.survey_jobs(snap, [name], None)
            found = report.attempt_entries(conn, target, name, limit)
            if not states or found is None:
                return None
            state = states[0]
            cells = report.timeline_cells(snap, state, None)
    except NoLedger:
        return None
    tz, entries = found
    verdict = sorted(report.findings([state]), key=lambda f: f.order)
    return JobPage(now, state, cells, verdict, tz, entries)


def ping(target: Target, timeout: float) -> None:
    """Raise LedgerError unless the ledger answers a read (an absent ledger answers)."""
    with suppress(NoLedger), read_only(target, timeout) as conn:
        queries.schema_version(conn)


@contextmanager
def read_only(target: Target, timeout: float) -> Iterator[Connection]:
    """One read-only snapshot, given up on within about `timeout` seconds (LedgerError)."""
    if target.dialect == "sqlite" and not os.path.exists(target.path):
        raise NoLedger  # connecting would create an empty file
    eng = serve_engine(target, timeout)
    watchdog = _Watchdog(timeout)
    try:
        with eng.connect() as conn:
            watchdog.arm(conn)
            try:
                if target.dialect != "sqlite":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ",
                                                  postgresql_readonly=True)
                with conn.begin():
                    queries.begin_read_only(conn, target, timeout)
                    version = queries.schema_version(conn)
                    if version < tables.SCHEMA_VERSION:
                        raise LedgerError(
                            f"the ledger {target.redacted} has schema version {version}, "
                            f"older than this once's {tables.SCHEMA_VERSION}: the next once "
                            f"run or `once schema` upgrades it (once serve never writes)")
                    yield conn
            finally:
                watchdog.cancel()  # before the socket is closed and its number reused
    except LedgerError as exc:  # once.ledger.reads' (the survey's), or ours
        if not watchdog.fired:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: no answer within "
                          f"{timeout:g}s") from exc
    except SQLAlchemyError as exc:
        if queries.is_missing_table(target, exc):
            raise NoLedger from None
        why = (f"no answer within {timeout:g}s" if watchdog.fired
               else describe(getattr(exc, "orig", None) or exc))
        raise LedgerError(f"cannot read the ledger {target.redacted}: {why}") from exc
    finally:
        eng.dispose()


class _Watchdog:
    """Shuts the connection's socket down when the whole read outlasts its time."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.fired = False
        self.done = False
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None

    def arm(self, conn: Connection) -> None:
        fd = _socket_of(conn)
        if fd is None:
            return
        # A second after the statement timeout: a server that answers says why itself.
        self.timer = threading.Timer(self.timeout + 1.0, self._fire, (fd,))
        self.timer.daemon = True
        self.timer.start()

    def _fire(self, fd: int) -> None:
        from once.ledger.base import shut_down

        with self.lock:
            if not self.done:
                self.fired = True
                shut_down(fd)

    def cancel(self) -> None:
        with self.lock:
            self.done = True
        if self.timer is not None:
            self.timer.cancel()


def _socket_of(conn: Connection) -> int | None:
    raw = conn.connection.dbapi_connection
    with suppress(Exception):
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is not None:
            return int(pgconn.socket)
        sock = getattr(raw, "_sock", None)  # PyMySQL
        if sock is not None:
            return int(sock.fileno())
    return None  # SQLite: a local file, bounded by its busy timeout

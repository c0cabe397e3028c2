"""The survey's reads in plain SQL on the driver's own connection: what `once status` and
`once check` read (jobs, due counts, open rows, latest done rows, failures' last lines,
timelines, and through once.ledger.catchup's LedgerRows the gap finder's counts), without
SQLAlchemy, whose import alone cost more than half of these commands' 0.5 s.

`Snapshot.open` is one read-only, consistent snapshot on a connection of its own (SQLite: a
connection that cannot write; PostgreSQL and MySQL: REPEATABLE READ, READ ONLY);
`Snapshot.over` reads through a SQLAlchemy connection's driver connection, inside the
transaction its caller opened (once serve, once metrics). Each method sends one named
statement (a few for long name lists) and hands back rows with the stored column names, times
as aware UTC datetimes.

Imports only the stdlib and once.ledger's records, url and catchup; the driver when it
connects; SQLAlchemy (once.ledger.schema) only to upgrade an older schema, as the next
`once run` would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any, NamedTuple

from once.ledger.catchup import LedgerRows
from once.ledger.records import (
    SCHEMA_VERSION,
    LedgerError,
    db_time,
    describe,
    from_db_time,
    schema_missing,
)
from once.ledger.url import Target

CHUNK = 200  # jobs per COUNT statement (SQLite allows 500 terms in a compound SELECT)
NAMES = 500  # names per IN list
LAST_LINE_SCAN = 2000  # how much of the end of a stored output is read to find its last line


class NoLedger(Exception):
    """The ledger's tables do not exist yet: nothing has run."""


class RunData(NamedTuple):
    """A once_runs row as the reports read it (once.report.model.RunRow)."""

    job: str
    period: str
    status: str
    attempt: int
    fence: int
    owner: str
    period_start: datetime
    period_end: datetime
    started_at: datetime
    heartbeat_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    stale_after: float


class JobData(NamedTuple):
    """A once_jobs row: the schedule the job's latest claim left."""

    job: str
    kind: str
    schedule: str
    tz: str
    lag: int
    max_attempts: int
    stale_after: float
    fires: int
    first_period_start: datetime
    shards: int


class TimelineData(NamedTuple):
    period: str
    status: str
    heartbeat_at: datetime
    stale_after: float


RUN_FIELDS = RunData._fields
_RUN_TIMES = (6, 7, 8, 9, 10)
_RUN_COLUMNS = ", ".join(RUN_FIELDS)

SCHEMA_VERSION_READ = "SELECT value FROM once_meta WHERE name = 'schema_version'"
DB_NOW = {"sqlite": "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
          "postgresql": "SELECT clock_timestamp()", "mysql": "SELECT UTC_TIMESTAMP(6)"}
JOBS = ("SELECT job, kind, schedule, tz, {lag}, max_attempts, stale_after, fires, "
        "first_period_start, shards FROM once_jobs")
DONE_COUNT = ("SELECT {i}, count(*) FROM once_runs WHERE job = %(j{i})s AND status = 'done' "
              "AND period_start >= %(a{i})s AND period_start < %(b{i})s")
OPEN_ROWS = (f"SELECT {_RUN_COLUMNS} FROM once_runs WHERE job IN ({{names}}) "
             f"AND status IN ('running', 'failed') ORDER BY job, period_start")
# Each job's latest done row: one index seek per job (once_runs_job_status_start).
LAST_DONE = (f"SELECT {', '.join('r.' + c for c in RUN_FIELDS)} FROM once_jobs j "
             f"JOIN once_runs r ON r.job = j.job AND r.status = 'done' AND r.period_start = "
             f"(SELECT max(l.period_start) FROM once_runs l "
             f"WHERE l.job = j.job AND l.status = 'done') WHERE j.job IN ({{names}})")
OUTPUT_END = {"sqlite": f"substr(output, -{LAST_LINE_SCAN})",
              "postgresql": f"right(output, {LAST_LINE_SCAN})",
              "mysql": f"right(output, {LAST_LINE_SCAN})"}
FAILURE_ENDS = ("SELECT job, period, attempt, {end} FROM once_attempts WHERE {match}")
TIMELINE = ("SELECT period, status, heartbeat_at, stale_after FROM once_runs "
            "WHERE job = %(job)s AND period_start >= %(lo)s AND period_start < %(hi)s")


class Snapshot:
    """One consistent, read-only snapshot of the ledger on a driver connection.

    Also the `ledger` of once.ledger.catchup's LedgerRows (`_read`, `_time`,
    `_from_db_time`), so that the reports find gaps with catch-up's own statements.
    """

    def __init__(self, target: Target, dbapi_conn: Any) -> None:
        self.target, self.dialect, self.conn = target, target.dialect, dbapi_conn

    @classmethod
    @contextmanager
    def open(cls, target: Target) -> Iterator[Snapshot]:
        """A snapshot on a connection of its own; a ledger whose schema is older than this
        once's is upgraded first (`once schema`), as the next `once run` would do."""
        if target.dialect == "sqlite" and not os.path.exists(target.path):
            raise NoLedger  # connecting would create an empty file
        for tries in (1, 2):
            snap = cls(target, _connect(target))
            try:
                snap._begin()
                if tries == 2 or snap.schema_version() >= SCHEMA_VERSION:
                    yield snap
                    return
            finally:
                snap._close()
            from once.ledger import schema  # SQLAlchemy: only to upgrade

            schema.ensure(target)

    @classmethod
    def over(cls, sqlalchemy_conn: Any, target: Target) -> Snapshot:
        """Read through a SQLAlchemy connection's driver connection, in its transaction."""
        return cls(target, sqlalchemy_conn.connection.driver_connection)

    # -- the reads

    def schema_version(self) -> int:
        """The ledger's schema version (0 when it has none yet)."""
        rows = self._read(SCHEMA_VERSION_READ, {})
        return int(rows[0][0] or 0) if rows else 0

    def db_now(self) -> datetime:
        """The database's clock, which wrote every heartbeat."""
        return self._from_db_time(self._read(DB_NOW[self.dialect], {})[0][0])

    def job_rows(self, names: Sequence[str] | None, namespace: str | None) -> list[Any]:
        """The once_jobs rows of the named jobs (all of them, or those of a namespace)."""
        sql = JOBS.format(lag="`lag`" if self.dialect == "mysql" else "lag")
        if names:
            found: list[tuple[Any, ...]] = []
            for chunk in chunks(names, NAMES):
                found += self._read(f"{sql} WHERE job IN ({_marks(len(chunk))})",
                                    _named(chunk))
        else:
            found = self._read(sql, {})
        rows = [JobData._make((*r[:8], self._from_db_time(r[8]), r[9])) for r in found]
        if namespace and not names:
            rows = [r for r in rows if r.job.startswith(namespace + ":")]
        return sorted(rows, key=lambda r: r.job)

    def done_counts(self, ranges: Sequence[tuple[str, datetime, datetime]]) -> list[int]:
        """The done rows of each (job, a, b) whose period starts in [a, b): one COUNT over an
        index range per job (once_runs_job_status_start), CHUNK jobs per statement."""
        counts = [0] * len(ranges)
        for offset in range(0, len(ranges), CHUNK):
            chunk = ranges[offset:offset + CHUNK]
            params: dict[str, Any] = {}
            for i, (job, a, b) in enumerate(chunk):
                params[f"j{i}"] = job
                params[f"a{i}"], params[f"b{i}"] = self._time(a), self._time(b)
            sql = " UNION ALL ".join(DONE_COUNT.format(i=i) for i in range(len(chunk)))
            for i, n in self._read(sql, params):
                counts[offset + int(i)] = int(n)
        return counts

    def open_rows(self, names: Sequence[str]) -> list[Any]:
        """The running and failed rows of the jobs, by job and period start."""
        return [row for chunk in chunks(names, NAMES)
                for row in self._runs(OPEN_ROWS.format(names=_marks(len(chunk))), _named(chunk))]

    def last_done_rows(self, names: Sequence[str]) -> list[Any]:
        """Each job's latest done row, by period start."""
        return [row for chunk in chunks(names, NAMES)
                for row in self._runs(LAST_DONE.format(names=_marks(len(chunk))), _named(chunk))]

    def failure_output_ends(self, keys: Sequence[tuple[str, str, int]]) -> list[Any]:
        """(job, period, attempt, output_end) of these attempts: primary-key lookups."""
        found = []
        for chunk in chunks(keys, 100):
            match = " OR ".join(f"(job = %(j{i})s AND period = %(p{i})s AND attempt = %(a{i})s)"
                                for i in range(len(chunk)))
            params = {f"{k}{i}": v for i, key in enumerate(chunk)
                      for k, v in zip("jpa", key, strict=True)}
            found += self._read(FAILURE_ENDS.format(end=OUTPUT_END[self.dialect], match=match),
                                params)
        return found

    def timeline_rows(self, job: str, lo: datetime, hi: datetime) -> list[Any]:
        """(period, status, heartbeat_at, stale_after) of the job's rows starting in [lo, hi)."""
        rows = self._read(TIMELINE, {"job": job, "lo": self._time(lo), "hi": self._time(hi)})
        return [TimelineData(p, s, self._from_db_time(h), a) for p, s, h, a in rows]

    def rows(self, job: str) -> LedgerRows:
        """The job's rows as once.gaps.GapFinder reads them (catch-up's statements)."""
        return LedgerRows(self, job)  # type: ignore[arg-type]

    # -- LedgerRows' ledger, and the plumbing

    def _runs(self, sql: str, params: dict[str, Any]) -> list[Any]:
        when = self._from_db_time
        return [RunData._make(when(v) if i in _RUN_TIMES and v is not None else v
                              for i, v in enumerate(row))
                for row in self._read(sql, params)]

    def _read(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        try:
            if self.dialect == "sqlite":
                from once.ledger.sqlite import pyformat_to_named

                return [tuple(r) for r in
                        self.conn.execute(pyformat_to_named(sql), params).fetchall()]
            cur = self.conn.cursor()
            try:
                cur.execute(sql, params)
                return [tuple(r) for r in cur.fetchall()]
            finally:
                cur.close()
        except Exception as exc:
            if schema_missing(self.dialect, exc, columns=False):
                raise NoLedger from None
            if not _driver_error(exc):
                raise
            raise LedgerError(f"cannot read the ledger {self.target.redacted}: "
                              f"{describe(exc)}") from exc

    def _time(self, instant: datetime) -> Any:
        return db_time(self.dialect, instant)

    def _from_db_time(self, value: Any) -> datetime:
        if isinstance(value, str):
            from once.ledger.sqlite import sqlite_time

            value = sqlite_time(value)
        return from_db_time(value)

    def _begin(self) -> None:
        if self.dialect == "sqlite":
            self._read("BEGIN", {})  # a deferred transaction: one snapshot of a WAL ledger
        elif self.dialect == "mysql":
            self._read("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", {})
            self._read("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY", {})
        # PostgreSQL: the connection is REPEATABLE READ, read only; its first read begins

    def _close(self) -> None:
        with suppress(Exception):  # a dead connection is gone anyway
            if self.dialect == "sqlite":
                self.conn.execute("ROLLBACK")
            else:
                self.conn.rollback()
        with suppress(Exception):
            self.conn.close()


def _connect(target: Target) -> Any:
    """A connection for the reports; a failure to connect is LedgerError (exit 75)."""
    try:
        if target.dialect == "sqlite":
            return sqlite_read_only(target.path)
        if target.dialect == "postgresql":
            import psycopg

            args = dict(target.connect_args)
            conn = psycopg.connect(args.pop("conninfo"), prepare_threshold=None,
                                   connect_timeout=10, **args)
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            return conn
        import pymysql

        return pymysql.connect(**{"connect_timeout": 10, **target.connect_args},
                               autocommit=False)
    except LedgerError:
        raise
    except Exception as exc:
        if not (_driver_error(exc) or isinstance(exc, (OSError, ValueError))):
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc


def _driver_error(exc: BaseException) -> bool:
    """An error of the database or its driver (any of the three), by its class's module."""
    return any(type(exc).__module__.partition(".")[0] == m
               for m in ("sqlite3", "psycopg", "pymysql"))


def sqlite_read_only(path: str) -> Any:
    """A connection that cannot write: reports work for an account that may only read the
    ledger (a monitoring user), and never create or change a file.

    A WAL ledger with no writer at work has no shared-memory file (`-shm`), and a read-only
    connection cannot create one where it may not write: SQLite then refuses to read at all.
    The file is then opened as immutable, which needs no shared memory; that is sound here
    because a writer at work would have made the `-shm` file.
    """
    import sqlite3
    from urllib.parse import quote

    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False,
                           isolation_level=None)
    try:
        probe_sqlite(conn)
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=30,
                           check_same_thread=False, isolation_level=None)


def probe_sqlite(dbapi_conn: Any) -> None:
    """Read from a new sqlite3 connection: raises when a read-only one cannot read (a WAL
    ledger whose shared-memory file it may not create)."""
    dbapi_conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()


def chunks(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    items = list(items)
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _marks(n: int) -> str:
    return ", ".join(f"%(n{i})s" for i in range(n))


def _named(names: Sequence[str]) -> dict[str, Any]:
    return {f"n{i}": name for i, name in enumerate(names)}



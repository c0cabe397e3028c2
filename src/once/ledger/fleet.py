"""What the survey reads across jobs, in plain SQL on the driver's own connection: what `once
status`, `once check`, `once metrics` and `once serve` read (jobs, due counts, open rows,
latest done rows, failures' last lines, timelines, the attempts' counts, and through
once.ledger.gap_rows' LedgerRows the gap finder's counts), without SQLAlchemy, whose import
alone would cost these commands most of their time.

`Snapshot.open` is one read-only, consistent snapshot on a connection of its own (SQLite: a
connection that cannot write; PostgreSQL and MySQL: REPEATABLE READ, READ ONLY);
`Snapshot.over` reads through a SQLAlchemy connection's driver connection, inside the
transaction its caller opened (once serve). Each method sends one named
statement (a few for long name lists) and hands back once.ledger.rows' records (or plain
tuples), times as aware UTC datetimes.

Imports only the stdlib and once.ledger's records, url, dialects (each backend's connection,
fragments and instants), rows and gap_rows; the driver when it connects; SQLAlchemy
(once.ledger.schema) only to upgrade an older schema, as the next `once run` would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from once.ledger.dialects import of
from once.ledger.gap_rows import LedgerRows
from once.ledger.records import (
    LOCK_WAIT,
    SCHEMA_VERSION,
    LedgerError,
    describe,
    lock_wait_said,
    newer_schema,
)
from once.ledger.rows import (
    JOB_COLUMNS,
    LAST_LINE_SCAN,
    RUN_COLUMNS,
    STATE_PERIOD,
    UNUSUAL_ATTEMPT,
    JobRow,
    RunRow,
    TimelineRow,
    chunks,
)
from once.ledger.url import Target

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy import Connection as SqlalchemyConnection

    from once.ledger.dbapi import Connection, Params, Row
    from once.ledger.dialect import Dialect

CHUNK = 200  # jobs per COUNT statement (SQLite allows 500 terms in a compound SELECT)
NAMES = 500  # names per IN list


class NoLedger(Exception):
    """The ledger's tables do not exist yet: nothing has run."""


_RUN_COLUMNS = ", ".join(RUN_COLUMNS)

SCHEMA_VERSION_READ = "SELECT value FROM once_meta WHERE name = 'schema_version'"
JOBS = (f"SELECT {', '.join('{lag}' if c == 'lag' else c for c in JOB_COLUMNS)} "
        f"FROM once_jobs")
DONE_COUNT = ("SELECT {i}, count(*) FROM once_runs WHERE job = %(j{i})s AND status = 'done' "
              "AND period_start >= %(a{i})s AND period_start < %(b{i})s")
OPEN_ROWS = (f"SELECT {_RUN_COLUMNS} FROM once_runs WHERE job IN ({{names}}) "
             f"AND status IN ('running', 'failed') ORDER BY job, period_start")
# Each job's latest done row: one index seek per job (once_runs_job_status_start). Several
# done rows at that start (a sharded period's) come in key order: the caller keeps the last.
LAST_DONE = (f"SELECT {', '.join('r.' + c for c in RUN_COLUMNS)} FROM once_jobs j "
             f"JOIN once_runs r ON r.job = j.job AND r.status = 'done' AND r.period_start = "
             f"(SELECT max(l.period_start) FROM once_runs l "
             f"WHERE l.job = j.job AND l.status = 'done') WHERE j.job IN ({{names}}) "
             f"ORDER BY r.job, r.period")
# PostgreSQL: one backward index seek per job (once_runs_done_start, its own), the latest
# start's rows in key order, the last taken: what LAST_DONE's caller keeps (a tenth of a
# second less over 10,000 jobs than the max and then the rows at it).
LAST_DONE_PG = (f"SELECT {', '.join('r.' + c for c in RUN_COLUMNS)} FROM unnest(%(names)s::text[]) "
                f"n CROSS JOIN LATERAL (SELECT * FROM once_runs l WHERE l.job = n "
                f"AND l.status = 'done' ORDER BY l.period_start DESC, l.period DESC LIMIT 1) r")
# `once metrics`' counts of each job's attempts (not `once state --set`'s records), by status:
# (job, status, attempts, later ones that were no rerun, reruns, interrupted ones).
_TALLY = ("SELECT job, status, count(*), "
          "sum(CASE WHEN attempt > 1 AND reason IS NULL THEN 1 ELSE 0 END), "
          "sum(CASE WHEN reason IS NOT NULL THEN 1 ELSE 0 END), "
          "sum(CASE WHEN outcome = 'interrupted' THEN 1 ELSE 0 END) "
          f"FROM once_attempts WHERE job IN ({{names}}) AND period <> '{STATE_PERIOD}'")
ATTEMPT_TALLY = f"{_TALLY} GROUP BY job, status"
# The same from two reads that touch no plain attempt's row (SQLite, PostgreSQL): each job's
# attempts counted in indexes (all of them in once_attempts_job_started, less `once state
# --set`'s records, a range of the primary key), and the others, read through the partial
# index once_attempts_unusual. A plain attempt (done, the first, no rerun, not interrupted)
# adds one to `done` and nothing else: done = the attempts - the others + the others done.
# One count per job, as DONE_COUNTS: PostgreSQL read a GROUP BY of the IN list whole.
_TOTALS = ("(SELECT count(*) FROM once_attempts a WHERE a.job = {n}) - (SELECT count(*) "
           f"FROM once_attempts s WHERE s.job = {{n}} AND s.period = '{STATE_PERIOD}')")
ATTEMPT_TOTALS = {
    "sqlite": f"SELECT n.value, {_TOTALS.format(n='n.value')} FROM json_each(%(names)s) n",
    "postgresql": f"SELECT n, {_TOTALS.format(n='n')} FROM unnest(%(names)s::text[]) n"}
UNUSUAL_TALLY = f"{_TALLY} AND ({UNUSUAL_ATTEMPT}) GROUP BY job, status"
FAILURE_ENDS = ("SELECT job, period, attempt, {end} FROM once_attempts WHERE {match}")
TIMELINE = ("SELECT period, status, heartbeat_at, stale_after FROM once_runs "
            "WHERE job = %(job)s AND period_start >= %(lo)s AND period_start < %(hi)s")

# A list of names given as one parameter: a JSON list (SQLite) or an array (PostgreSQL).
NAME_LIST = {"sqlite": "SELECT value FROM json_each(%(names)s)",
             "postgresql": "SELECT unnest(%(names)s::text[])"}
# The ranges of DONE_COUNTS and TIMELINES, given as one parameter (SQLite: a JSON list) or one
# array each (PostgreSQL), as rows v(i, j, a, b), i from 0 in their order (SQLite: json_extract
# and no MATERIALIZED, which would need 3.38 and 3.35).
_RANGES = {"sqlite": "WITH v(i, j, a, b) AS (SELECT key, json_extract(value, '$[0]'), "
                     "json_extract(value, '$[1]'), json_extract(value, '$[2]') "
                     "FROM json_each(%(v)s))",
           "postgresql": "WITH v(j, a, b, i) AS (SELECT j, a, b, i - 1 FROM unnest("
                         "%(j)s::text[], %(a)s::text[]::timestamptz[], "
                         "%(b)s::text[]::timestamptz[]) "
                         "WITH ORDINALITY AS u(j, a, b, i))"}
DONE_COUNTS = {d: f"{w} SELECT v.i, (SELECT count(*) FROM once_runs r WHERE r.job = v.j AND "
                  f"r.status = 'done' AND r.period_start >= v.a AND r.period_start < v.b) "
                  f"FROM v ORDER BY v.i" for d, w in _RANGES.items()}
TIMELINES = {d: f"{w} SELECT v.i, r.period, r.status, r.heartbeat_at, r.stale_after FROM v "
                f"JOIN once_runs r ON r.job = v.j AND r.period_start >= v.a "
                f"AND r.period_start < v.b" for d, w in _RANGES.items()}
DONE_START = ("SELECT period_start FROM once_runs WHERE job = %(job)s AND status = 'done' "
              "AND period_start >= %(lo)s AND period_start < %(hi)s")
DONE_STARTS = {d: f"{w} SELECT v.i, r.period_start FROM v JOIN once_runs r ON r.job = v.j "
                  f"AND r.status = 'done' AND r.period_start >= v.a AND r.period_start < v.b"
               for d, w in _RANGES.items()}
# Whether the server is a PostgreSQL standby, and then how far behind its primary: 0 while it
# streams and has replayed all it received (an idle primary sends no commits to time it by),
# else the age of the latest commit it replayed (NULL: none since it started).
IN_RECOVERY = "SELECT pg_is_in_recovery()"
REPLAY_LAG = """
    SELECT CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
                     AND EXISTS (SELECT FROM pg_stat_wal_receiver
                                 WHERE coalesce(status, 'streaming') = 'streaming')
                THEN 0::float8
                ELSE extract(epoch FROM clock_timestamp()
                                        - pg_last_xact_replay_timestamp())::float8 END"""


class Standby(NamedTuple):
    """The ledger read is a PostgreSQL standby's copy (docs/how-to/high-availability.md)."""

    lag: float | None  # seconds behind its primary (None: unknown)


class Snapshot:
    """One consistent, read-only snapshot of the ledger on a driver connection.

    Also the `ledger` of once.ledger.gap_rows's LedgerRows (its RowSource), so that the
    reports find gaps with catch-up's own statements.
    """

    def __init__(self, target: Target, dbapi_conn: Connection) -> None:
        self.target, self.dialect, self.conn = target, target.dialect, dbapi_conn
        self.backend = of(target)
        # Times read, by the value the driver gave: jobs of a schedule share their periods'
        # bounds, so a fleet's reads hand back the same few values tens of thousands of times.
        self._times: dict[Any, datetime] = {}

    @classmethod
    @contextmanager
    def open(cls, target: Target) -> Iterator[Snapshot]:
        """A snapshot on a connection of its own; a ledger whose schema is older than this
        once's is upgraded first (`once schema`), as the next `once run` would do."""
        if of(target).absent(target):
            raise NoLedger  # connecting would create an empty file
        for tries in (1, 2):
            snap = cls(target, _connect(target))
            try:
                snap._begin()
                version = snap.schema_version()
                if version > SCHEMA_VERSION:
                    raise newer_schema(version)
                if tries == 2 or version == SCHEMA_VERSION:
                    yield snap
                    return
            finally:
                snap._close()
            from once.ledger import schema  # SQLAlchemy: only to upgrade

            schema.ensure(target)

    @classmethod
    def over(cls, sqlalchemy_conn: SqlalchemyConnection, target: Target) -> Snapshot:
        """Read through a SQLAlchemy connection's driver connection, in its transaction."""
        # In the caller's transaction: the driver's connection is there (never None).
        return cls(target, cast("Connection", sqlalchemy_conn.connection.driver_connection))

    # -- the reads

    def schema_version(self) -> int:
        """The ledger's schema version (0 when it has none yet)."""
        rows = self._read(SCHEMA_VERSION_READ, {})
        return int(rows[0][0] or 0) if rows else 0

    def db_now(self) -> datetime:
        """The database's clock, which wrote every heartbeat."""
        return self._from_db_time(self._read(self.backend.now_sql, {})[0][0])

    def standby(self) -> Standby | None:
        """Whether the ledger read is a standby's (PostgreSQL), and its replay lag; None on
        a primary and the other backends. A server that cannot tell the lag (Aurora's
        replicas lack the functions) is read as a standby of unknown lag."""
        if not self.backend.standbys or not self._read(IN_RECOVERY, {})[0][0]:
            return None
        try:
            # A savepoint: a refusal leaves the snapshot whole (only PostgreSQL has standbys).
            with cast("psycopg.Connection[Any]", self.conn).transaction():
                lag = self._read(REPLAY_LAG, {})[0][0]
        except LedgerError:
            return Standby(None)
        return Standby(None if lag is None else max(0.0, float(lag)))

    def job_rows(self, names: Sequence[str] | None, namespace: str | None) -> list[JobRow]:
        """The once_jobs rows of the named jobs (all of them, or those of a namespace)."""
        sql = JOBS.format(lag=self.backend.quote("lag"))
        if names:
            found: list[Row] = []
            for chunk in chunks(names, NAMES):
                found += self._read(f"{sql} WHERE job IN ({_marks(len(chunk))})",
                                    _named(chunk))
        else:
            found = self._read(sql, {})
        rows = [JobRow.read(r, self._from_db_time) for r in found]
        if namespace and not names:
            rows = [r for r in rows if r.job.startswith(namespace + ":")]
        return sorted(rows, key=lambda r: r.job)

    def done_counts(self, ranges: Sequence[tuple[str, datetime, datetime]]) -> list[int]:
        """The done rows of each (job, a, b) whose period starts in [a, b): one COUNT over an
        index range per job (once_runs_job_status_start). SQLite and PostgreSQL: every range
        in one statement (a JSON list, arrays), which plans once, not once per CHUNK (a fleet
        of 10,000 jobs spent 4 s planning 100 statements of 200 COUNTs); MySQL: CHUNK a
        statement."""
        if not ranges:
            return []
        if self.dialect in DONE_COUNTS:
            return [int(n) for _, n in self._read(DONE_COUNTS[self.dialect],
                                                  self._range_params(ranges))]
        counts = [0] * len(ranges)
        for offset in range(0, len(ranges), CHUNK):
            chunk = ranges[offset:offset + CHUNK]
            params: Params = {}
            for i, (job, a, b) in enumerate(chunk):
                params[f"j{i}"] = job
                params[f"a{i}"], params[f"b{i}"] = self._time(a), self._time(b)
            sql = " UNION ALL ".join(DONE_COUNT.format(i=i) for i in range(len(chunk)))
            for i, n in self._read(sql, params):
                counts[offset + int(i)] = int(n)
        return counts

    def open_rows(self, names: Sequence[str]) -> list[RunRow]:
        """The running and failed rows of the jobs, by job and period start (SQLite and
        PostgreSQL: in one statement, the names as one JSON list or array; a fleet's 10,000
        names in 20 IN lists cost SQLite 0.1 s)."""
        return [RunRow.read(row, self._from_db_time) for row in self._for_names(OPEN_ROWS, names)]

    def last_done_rows(self, names: Sequence[str]) -> list[RunRow]:
        """Each job's latest done row, by period start (of a sharded period's, the last in
        key order: PostgreSQL sends it alone, the others every one, the last of a job after
        the others)."""
        if self.dialect == "postgresql" and names:
            found = self._read(LAST_DONE_PG, {"names": self._names(names)})
        else:
            found = self._for_names(LAST_DONE, names)
        return [RunRow.read(row, self._from_db_time) for row in found]

    def attempt_tallies(self, names: Sequence[str]) -> list[Row]:
        """(job, status, attempts, later attempts that were no rerun, reruns, interrupted
        attempts) of the jobs' attempts, by job and status, `once state --set`'s records left
        out (they ran nothing). SQLite and PostgreSQL count the plain attempts in an index
        and read the others alone (ATTEMPT_TOTALS); MySQL, without partial indexes, reads
        every attempt's row."""
        if self.dialect not in ATTEMPT_TOTALS:
            return self._for_names(ATTEMPT_TALLY, names)
        if not names:
            return []
        totals = {job: int(n) for job, n in self._read(ATTEMPT_TOTALS[self.dialect],
                                                       {"names": self._names(names)})}
        found = self._for_names(UNUSUAL_TALLY, names)
        for job, _status, n, *_ in found:
            totals[job] -= int(n)
        return found + [(job, "done", n, 0, 0, 0) for job, n in totals.items() if n]

    def failure_output_ends(self, keys: Sequence[tuple[str, str, int]]) -> list[Row]:
        """(job, period, attempt, output_end) of these attempts: primary-key lookups."""
        found = []
        for chunk in chunks(keys, 100):
            match = " OR ".join(f"(job = %(j{i})s AND period = %(p{i})s AND attempt = %(a{i})s)"
                                for i in range(len(chunk)))
            params = {f"{k}{i}": v for i, key in enumerate(chunk)
                      for k, v in zip("jpa", key, strict=True)}
            end = self.backend.output_end("output", LAST_LINE_SCAN)
            found += self._read(FAILURE_ENDS.format(end=end, match=match), params)
        return found

    def timeline_rows(self, job: str, lo: datetime, hi: datetime) -> list[TimelineRow]:
        """(period, status, heartbeat_at, stale_after) of the job's rows starting in [lo, hi)."""
        rows = self._read(TIMELINE, {"job": job, "lo": self._time(lo), "hi": self._time(hi)})
        return [TimelineRow(p, s, self._from_db_time(h), a) for p, s, h, a in rows]

    def timelines_rows(self, ranges: Sequence[tuple[str, datetime, datetime]]
                       ) -> list[list[TimelineRow]]:
        """timeline_rows of each (job, lo, hi), in one statement (SQLite, PostgreSQL: a page
        of once serve's strips is one read, not one per job) or one each (MySQL)."""
        if not ranges:
            return []
        if self.dialect not in TIMELINES:
            return [self.timeline_rows(*r) for r in ranges]
        found: list[list[TimelineRow]] = [[] for _ in ranges]
        for i, p, s, h, a in self._read(TIMELINES[self.dialect], self._range_params(ranges)):
            found[int(i)].append(TimelineRow(p, s, self._from_db_time(h), a))
        return found

    def done_starts(self, ranges: Sequence[tuple[str, datetime, datetime]]
                    ) -> list[list[datetime]]:
        """The period starts of the done rows of each (job, lo, hi) whose period starts in
        [lo, hi), in order: in one statement (SQLite, PostgreSQL) or one each (MySQL)."""
        found: list[list[datetime]] = [[] for _ in ranges]
        if self.dialect in DONE_STARTS and ranges:
            for i, start in self._read(DONE_STARTS[self.dialect], self._range_params(ranges)):
                found[int(i)].append(self._from_db_time(start))
        else:
            for starts, (job, lo, hi) in zip(found, ranges, strict=True):
                starts += (self._from_db_time(r[0]) for r in self._read(DONE_START, {
                    "job": job, "lo": self._time(lo), "hi": self._time(hi)}))
        return [sorted(starts) for starts in found]

    def _range_params(self, ranges: Sequence[tuple[str, datetime, datetime]]
                      ) -> Params:
        """(job, a, b) ranges as one parameter (SQLite: a JSON list) or one array each
        (PostgreSQL: the instants as ISO text, which psycopg binds 3-4 times faster than
        timestamptz: 40,000 of them cost 0.25 s)."""
        texts: dict[int, str] = {}  # jobs of one schedule share their bounds' very objects

        def text(instant: datetime) -> str:
            # By id, not by value: an aware datetime's hash asks its zone for the offset.
            # The ranges hold the instants, so no id is reused while this runs.
            if (known := texts.get(id(instant))) is None:
                # PostgreSQL (arrays) binds an instant as a datetime.
                known = texts[id(instant)] = str(cast(datetime, self._time(instant)).isoformat()
                                                 if self.backend.arrays else self._time(instant))
            return known

        if not self.backend.arrays:  # SQLite: a JSON list (the dialects without: chunks)
            return {"v": _json([[j, text(a), text(b)] for j, a, b in ranges])}
        return {"j": [r[0] for r in ranges], "a": [text(r[1]) for r in ranges],
                "b": [text(r[2]) for r in ranges]}

    def rows(self, job: str) -> LedgerRows:
        """The job's rows as once.gaps.GapFinder reads them (catch-up's statements)."""
        return LedgerRows(self, job)

    # -- LedgerRows' ledger, and the plumbing

    @property
    def HEARTBEAT_AGE(self) -> str:  # named as the Ledger's class attribute
        return self.backend.ledger_class().HEARTBEAT_AGE

    def _for_names(self, sql: str, names: Sequence[str]) -> list[Row]:
        """The rows of a statement whose `{names}` is an IN list of these names: one
        statement (SQLite and PostgreSQL: the names as one JSON list or array), or one per
        NAMES of them."""
        if not names:
            return []
        if self.dialect in NAME_LIST:
            return self._read(sql.format(names=NAME_LIST[self.dialect]),
                              {"names": self._names(names)})
        return [row for chunk in chunks(names, NAMES)
                for row in self._read(sql.format(names=_marks(len(chunk))), _named(chunk))]

    def _read(self, sql: str, params: Params) -> list[Row]:
        with self._errors():
            return self.backend.fetch(self.conn, sql, params)

    def _send(self, sql: str) -> None:
        """A statement that returns no rows (a SET)."""
        with self._errors():
            self.conn.cursor().execute(sql)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            if self.backend.schema_missing(exc, columns=False):
                raise NoLedger from None
            if not _driver_error(exc):
                raise
            raise LedgerError(f"cannot read the ledger {self.target.redacted}: "
                              f"{failed_read(self.backend, exc)}") from exc

    def _names(self, names: Sequence[str]) -> str | list[str]:
        """Names as one parameter: a JSON list (SQLite) or an array (PostgreSQL)."""
        return _json(list(names)) if self.dialect == "sqlite" else list(names)

    def _time(self, instant: datetime) -> datetime | str:
        return self.backend.bind(instant)

    def _from_db_time(self, value: Any) -> datetime:
        if (instant := self._times.get(value)) is None:
            instant = self._times[value] = self.backend.from_db(value)
        return instant

    def _begin(self) -> None:
        for sql in self.backend.snapshot_begin:  # PostgreSQL: none, its connection is
            self._read(sql, {})  # REPEATABLE READ, read only, and its first read begins
        for sql in self.backend.lock_waits(LOCK_WAIT):  # a table another session
            self._send(sql)  # locked (`LOCK TABLE`, DDL in an open transaction)

    def _close(self) -> None:
        with suppress(Exception):  # a dead connection is gone anyway
            self.backend.rollback(self.conn)
        with suppress(Exception):
            self.conn.close()


def _connect(target: Target) -> Connection:
    """A connection for the reports; a failure to connect is LedgerError (exit 75)."""
    try:
        return of(target).snapshot_connection(target)
    except LedgerError:
        raise
    except Exception as exc:
        if not (_driver_error(exc) or isinstance(exc, (OSError, ValueError))):
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc


def failed_read(backend: Dialect, exc: BaseException) -> str:
    """What a report's read that failed with exc says: a lock it waited on, where it did. A
    consistent read takes no row's lock: a table's, held by `LOCK TABLE` or by DDL."""
    if backend.lock_waited(exc):
        return f"{lock_wait_said('a table', LOCK_WAIT)} ({describe(exc)})"
    return describe(exc)


def _driver_error(exc: BaseException) -> bool:
    """An error of the database or its driver (any of the three), by its class's module."""
    return any(type(exc).__module__.partition(".")[0] == m
               for m in ("sqlite3", "psycopg", "pymysql"))


def _json(value: object) -> str:
    import json  # the reports' alone (SQLite's lists)

    return json.dumps(value)


def _marks(n: int) -> str:
    return ", ".join(f"%(n{i})s" for i in range(n))


def _named(names: Sequence[str]) -> Params:
    return {f"n{i}": name for i, name in enumerate(names)}



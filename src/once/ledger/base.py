"""The ledger as `once run` speaks to it: the flow every dialect shares (`Ledger`) and the
statements that read the same in all of them; the dialect modules (sqlite, postgres, mysql)
hold the rest of the SQL text.

The ledger talks to the database through the driver alone (sqlite3, psycopg 3, PyMySQL):
importing SQLAlchemy costs about 200 ms per cron fire. SQLAlchemy Core owns the tables and
their DDL (once.ledger.schema); when a statement finds a table or column missing, the ledger
asks once.ledger.schema to create or upgrade them once and tries again.

Every time stored comes from the database's clock, so hosts with skewed clocks agree on
staleness. Every decision is fenced:

- a claim inserts the `(job, period)` row, or takes over a row that is `failed` with attempts
  left or `running` with a stale heartbeat; the takeover's WHERE clause holds the very condition
  the winner destroys, so of any number of concurrent claimers exactly one wins;
- the job's fence counter in `once_jobs` is bumped in the claim's own transaction, so fences
  grow strictly per job whatever the period or the machine (and claims of one job serialise on
  that row, which also keeps MariaDB free of insert deadlocks);
- a renewal or a finish names the attempt it owns and status `running`; zero rows means the
  claim was lost.

Imports only the stdlib and the ledger's own url, records and catchup modules: no driver
(each dialect module imports its own, when it connects) and no SQLAlchemy (once.ledger.schema
is imported only when the tables must be created).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from once.ledger.catchup import LedgerRows
from once.ledger.records import (
    Claim,
    CommandDrift,
    Job,
    LedgerError,
    busy_server,
    db_time,
    describe,
    from_db_time,
    schema_missing,
    transient,
)
from once.ledger.url import Dialect, Target
from once.outcomes import Status

T = TypeVar("T")


# -- the connection --------------------------------------------------------------------------


class Ledger:
    """One connection to the ledger and the few statements `once run` sends through it.

    Subclasses hold the SQL text per dialect; this class holds the flow. Not thread-safe:
    the runner's heartbeat thread and the main thread take turns, never overlap.
    """

    dialect: ClassVar[Dialect]
    statement_timeout: float = 10.0

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        self.target = target
        self.statement_timeout = timeout
        self._conn: Any = None

    # connection life

    def connect(self, patient: bool = False) -> None:
        """Open the connection now (the first statement would otherwise do it).

        patient: a server that is out of connections or still starting (a fleet firing at
        :00, a restart) is tried again with jittered exponential backoff for up to
        `connect_patience` seconds; any other failure (a bad password, an unknown database)
        fails at once. Renewals and final writes have retry loops of their own.
        """
        if self._conn is not None:
            return
        give_up = time.monotonic() + (self.connect_patience if patient else 0.0)
        pause = 0.05
        with self._errors("cannot connect to"):
            while True:
                try:
                    self._conn = self._open()
                    return
                except Exception as exc:
                    if not busy_server(exc) or time.monotonic() + pause > give_up:
                        raise
                import random  # only on this rare path

                time.sleep(random.uniform(pause / 2, pause))
                pause = min(1.0, pause * 2)

    @property
    def connect_patience(self) -> float:
        """How long a claim waits for a busy server: three statement timeouts (a tenth of the
        default --stale-after), from 3 s to 30 s: below --stale-after, and short enough that
        a fire which cannot get in by then is not worth making."""
        return 3.0 * self.statement_timeout

    def reconnect(self) -> None:
        """Drop the connection (it may be dead) and open a fresh one."""
        self.close()
        self.connect()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):  # a dead connection may fail to close; it is gone anyway
                conn.close()

    def abandon(self) -> None:
        """Forget the connection without closing it: a statement that got no answer still
        waits on it on another thread (once.lease.Lease.call), and closing a connection under
        a statement can crash the process (SQLite: SIGSEGV). The next statement opens a
        fresh one; the old one goes with the process."""
        self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the statements

    def claim(self, job: Job, key: str, start: datetime, end: datetime, owner: str,
              rerun: bool = False, reason: str | None = None,
              command_hash: str | None = None, require_same_command: bool = False,
              max_clock_skew: float = 0.0) -> Claim:
        """Insert `(job, key)` as running, or take it over; else say who holds it.

        A running row is taken over only when its heartbeat is older than the *owner's*
        --stale-after (stored in the row by the claim that won it); the caller's own
        --stale-after becomes the promise of the row it wins. A won claim also carries the
        job's watermark (`--state`) as it stood.

        Raises CommandDrift (--require-same-command) and ClockSkew (a server's clock and ours
        disagree by more than max_clock_skew seconds; 0: not checked) before anything is
        written.
        """
        params = {
            "job": job.name, "period": key, "owner": owner, "kind": job.kind,
            "schedule": job.schedule, "tz": job.tz, "lag": job.lag,
            "max_attempts": job.max_attempts, "stale_after": job.stale_after,
            "shards": job.shards, "period_start": self._time(start),
            "period_end": self._time(end), "rerun": rerun, "reason": reason,
            "command_hash": command_hash,
            "require_same": bool(require_same_command and command_hash),
            "max_skew": float(max_clock_skew),
        }

        def attempt() -> Claim:
            # Our clock is read as late as possible: the statement compares it with its own.
            params["host_now"] = self._time(datetime.now(UTC))
            return self._claim(params)

        return self._with_schema(attempt)

    def renew(self, job: str, key: str, attempt: int) -> bool:
        """Refresh the heartbeat of our attempt; False when the row is no longer ours."""
        params = {"job": job, "period": key, "attempt": attempt}
        with self._errors("cannot renew the claim in"):
            self.connect()
            return self._renew(params)

    def finish(self, job: str, key: str, attempt: int, status: Status,
               exit_code: int | None, outcome: str, state: str | None = None,
               state_version: int = 0, output: str | None = None) -> bool:
        """Record done or failed for our attempt; False when the row is no longer ours.

        `outcome` (done, failed, timed-out, exec-failed, interrupted) and `output` (the tail
        of the command's output) go to the history only.
        With `state` (only for done), the job's watermark is set in the same atomic write,
        and only if it is still at `state_version` (else nothing is written: False).
        """
        params = {"job": job, "period": key, "attempt": attempt, "status": status,
                  "exit_code": exit_code, "outcome": outcome, "state": state,
                  "state_version": state_version, "output": output}
        with self._errors("cannot record the result in"):
            self.connect()
            if state is not None and status == "done":
                written = self._finish_with_state(params)
            else:
                written = self._finish(params)
            # A retried write whose first try committed though its answer was lost (a
            # watchdog, a dropped connection) matches no running row: the row then says
            # finished by our own attempt, and that is what the ledger holds.
            recorded = written or self._finished_by(params) is not None
        self.release(job, key)
        return recorded

    def release(self, job: str, key: str) -> None:
        """Let go of a won period's liveness lock (SQLite) once its result is recorded or
        lost; nothing elsewhere. Closing the ledger releases every lock it holds."""

    # A fenced-out attempt's output goes into its own once_attempts row, which no other
    # attempt writes; the period's row is not touched.
    KEEP_OUTPUT = """
        UPDATE once_attempts SET output = %(output)s
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND output IS NULL"""

    def keep_output(self, job: str, key: str, attempt: int, output: str) -> None:
        """Store the output of our attempt after it was fenced out."""
        params = {"job": job, "period": key, "attempt": attempt, "output": output}
        with self._errors("cannot store the output in"):
            self.connect()
            self._write(self.KEEP_OUTPUT, params)

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        """One statement that changes rows, committed."""
        raise NotImplementedError

    FINISHED_BY = """
        SELECT status FROM once_runs
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status IN ('done', 'failed')"""

    def _finished_by(self, params: dict[str, Any]) -> str | None:
        """The status our attempt left in the row, if it finished it (None: not ours)."""
        rows = self._fetch(self.FINISHED_BY, params)
        return str(rows[0][0]) if rows else None

    def finish_on(self, connection: Any, job: str, key: str, attempt: int) -> bool:
        """Mark our attempt done on the caller's own connection, inside its open transaction
        (psycopg 3, sqlite3 or PyMySQL), so that the work and the marker commit together.
        Nothing is committed here; False when the row is no longer ours."""
        params = {"job": job, "period": key, "attempt": attempt, "status": "done",
                  "exit_code": 0, "outcome": "done", "state": None, "state_version": 0,
                  "output": None}
        return self._finish_on(connection, params)

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def set_state(self, job: str, value: str, owner: str, seed: Job | None = None,
                  first_period_start: datetime | None = None) -> int:
        """Set the watermark deliberately (`once state --set`); return its new version.

        Recorded in the history as a `(state)` row, so that `once history` shows it. With
        `seed`, a job that has never run is registered first, in the same transaction, with
        that schedule, expected from `first_period_start` on, fence 0 and no fire (its first
        claim then takes fence 1 and the schedule it runs with); the tables are created if
        there are none. Without it, a job that has never run is a LedgerError.
        """
        params: dict[str, Any] = {"job": job, "state": value, "owner": owner,
                                  "reason": f"state set: {value[:200]}", "seed": seed is not None}
        if seed is not None:
            assert first_period_start is not None
            params.update(kind=seed.kind, schedule=seed.schedule, tz=seed.tz, lag=seed.lag,
                          max_attempts=seed.max_attempts, stale_after=seed.stale_after,
                          shards=seed.shards, period_start=self._time(first_period_start))
            return self._with_schema(lambda: self._set_state(params), "cannot set the state in")
        with self._errors("cannot set the state in"):
            self.connect()
            return self._set_state(params)

    # reads for rerun and --state (one round trip each, still no SQLAlchemy)

    JOB_INFO = """
        SELECT kind, schedule, tz, lag, max_attempts, stale_after, shards FROM once_jobs
        WHERE job = %(job)s"""

    STATE = """SELECT state, state_version FROM once_jobs WHERE job = %(job)s"""

    LAST_COMMAND = """
        SELECT command_hash FROM once_attempts
        WHERE job = %(job)s AND command_hash IS NOT NULL
        ORDER BY started_at DESC LIMIT 1"""

    # Catch-up's reads (once.gaps finds the periods that need a run from them): index seeks
    # and ranges on once_runs_job_status_start, one round trip each.

    JOB_SPAN = """
        SELECT (SELECT first_period_start FROM once_jobs WHERE job = %(job)s),
               (SELECT max(period_start) FROM once_runs WHERE job = %(job)s AND status = 'done'),
               (SELECT max(period_start) FROM once_runs
                WHERE job = %(job)s AND status = 'running'),
               (SELECT max(period_start) FROM once_runs
                WHERE job = %(job)s AND status = 'failed')"""

    # Seconds since a row's heartbeat, by the database's clock (per dialect).
    HEARTBEAT_AGE: ClassVar[str] = ""

    OPEN_ROWS = """
        SELECT period, period_start, status, attempt, {age}, stale_after FROM once_runs
        WHERE job = %(job)s AND status IN ('running', 'failed')
          AND period_start >= %(lo)s AND period_start < %(hi)s
        ORDER BY period_start"""


    def job_span(self, job: str) -> tuple[datetime | None, datetime | None]:
        """(the job's first period start, the start of its latest row of any status), UTC;
        (None, None) for a job that has never run."""
        rows = self._read(self.JOB_SPAN, {"job": job})
        if not rows or rows[0][0] is None:
            return None, None
        first, *latest = (self._from_db_time(v) for v in rows[0] if v is not None)
        return first, max(latest, default=None)

    def open_rows(self, job: str, lo: datetime,
                  hi: datetime) -> list[tuple[str, datetime, str, int, bool]]:
        """The running and failed rows whose period starts in [lo, hi), oldest first:
        (key, period start, status, attempt, whether it is a running row past its owner's
        promise by the database's clock)."""
        rows = self._read(self.OPEN_ROWS.format(age=self.HEARTBEAT_AGE),
                          {"job": job, "lo": self._time(lo), "hi": self._time(hi)})
        return [(key, self._from_db_time(start), status, int(attempt),
                 status == "running" and age is not None and float(age) > float(stale_after))
                for key, start, status, attempt, age, stale_after in rows]

    def rows(self, job: str) -> LedgerRows:
        """The job's rows as once.gaps.GapFinder reads them."""
        return LedgerRows(self, job)

    def job_info(self, name: str) -> Job | None:
        """The job as its latest claim left it in once_jobs (None: never claimed)."""
        rows = self._read(self.JOB_INFO, {"job": name})
        if not rows:
            return None
        kind, sched, tz, lag, max_attempts, stale_after, shards = rows[0]
        return Job(name, kind, sched, tz, lag, max_attempts, float(stale_after), shards)

    def state(self, job: str) -> tuple[str | None, int]:
        """The job's watermark and its version ((None, 0) when never set)."""
        rows = self._read(self.STATE, {"job": job})
        return (rows[0][0], int(rows[0][1])) if rows else (None, 0)

    def last_command(self, job: str) -> str | None:
        """The command hash of the job's latest attempt (for --require-same-command)."""
        rows = self._read(self.LAST_COMMAND, {"job": job})
        return rows[0][0] if rows else None

    def _read(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._errors("cannot read"):
            self.connect(patient=True)
            try:
                return self._fetch(sql, params)
            except Exception as exc:
                if schema_missing(self.dialect, exc):
                    return []  # no tables yet: nothing has run
                raise

    # per dialect

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _from_db_time(self, value: Any) -> datetime:
        """A time the driver read, as an aware UTC datetime (naive values are UTC)."""
        return from_db_time(value)

    def _open(self) -> Any:
        raise NotImplementedError

    def _claim(self, params: dict[str, Any]) -> Claim:
        raise NotImplementedError

    def _renew(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _finish(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _set_state(self, params: dict[str, Any]) -> int:
        raise NotImplementedError

    def _time(self, instant: datetime) -> Any:
        """A period bound as the dialect's column holds it (once.ledger.records.db_time)."""
        return db_time(self.dialect, instant)

    # plumbing

    def _with_schema(self, action: Callable[[], T], doing: str = "cannot claim in") -> T:
        with self._errors(doing):
            self.connect(patient=True)
            try:
                return action()
            except Exception as exc:
                if not schema_missing(self.dialect, exc):
                    raise
        # First use (or an older schema): create or upgrade it, then try once more.
        from once.ledger import schema  # imported here only: it pulls in SQLAlchemy

        # One connection at a time: a stampede of first uses, each holding its claim's
        # connection while it waits for the schema lock on another, would need twice as many
        # as there are processes (MariaDB's default max_connections is 151, PostgreSQL's 100).
        self.close()
        schema.ensure(self.target)
        with self._errors(doing):
            self.reconnect()
            return action()

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except (LedgerError, CommandDrift):
            raise
        except Exception as exc:
            where = self.target.redacted
            error = LedgerError(f"{doing} the ledger {where}: {describe(exc)}")
            error.transient = transient(exc)
            raise error from exc


def shut_down(fd: int) -> None:
    """Shut a connection's socket down under its driver: the pending read fails at once
    (the watchdogs of PostgreSQL's statements and of once serve's reads)."""
    import socket

    with suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()

"""The ledger as `once run` speaks to it: the flow every dialect shares (`Ledger`) and the
statements that read the same in all of them; sqlite, postgres and mysql hold the rest.

Every decision is fenced: a claim inserts the `(job, period)` row or takes over one whose
condition it destroys (exactly one of any number of claimers wins); the job's fence counter
is bumped in the claim's own transaction; a renewal or a finish names its attempt and claim;
`finish_on` marks the attempt's own once_attempts row, which no heartbeat writes.
docs/concepts/ledger.md and docs/concepts/liveness.md say the rest.

Imports the stdlib and the ledger's records and gap_rows alone: no driver (each dialect imports
its own when it connects), no SQLAlchemy (once.ledger.schema, only to create) and no backend:
a ledger speaks through its target's (Target.backend, a once.ledger.dialect.Dialect), which
the registry, once.ledger.dialects, put there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from once.deadlines import lease_now
from once.ledger.gap_rows import LedgerRows
from once.ledger.records import (
    SCHEMA_VERSION,
    Claim,
    CommandDrift,
    Job,
    LedgerError,
    attempt_cap,
    busy_server,
    cut_tail,
    describe,
    from_db_time,
    new_claim_id,
    newer_schema,
)
from once.outcomes import Status

if TYPE_CHECKING:
    from once.ledger.dbapi import Connection, Params, Row
    from once.ledger.url import Dialect, Target

T = TypeVar("T")
OutputLimit = tuple[int, str]  # at most this many bytes of a tail, and why (cut_tail's words)


# -- the connection --------------------------------------------------------------------------


class Ledger:
    """One connection to the ledger and the few statements `once run` sends through it.

    Subclasses hold the SQL text per dialect; this class holds the flow. Not thread-safe:
    the wrapper's heartbeat thread and the main thread take turns, never overlap.
    """

    dialect: ClassVar[Dialect]
    statement_timeout: float = 10.0
    # When the latest claim's statement was sent, on the lease clock: its lease starts there
    # (its heartbeat is written after it), not before a first use created the tables.
    claim_sent: float = 0.0

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        self.target = target
        self.statement_timeout = timeout
        self._conn: Connection | None = None
        self.backend = target.backend  # its connections, instants and error rules

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
        waits on it on another thread (once.run.lease.Lease.call), and closing a connection under
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
            "claim_id": new_claim_id(),
            "schedule": job.schedule, "tz": job.tz, "lag": job.lag,
            "max_attempts": job.max_attempts, "attempt_cap": attempt_cap(job.max_attempts),
            "stale_after": job.stale_after, "shards": job.shards,
            "no_overlap": int(job.no_overlap), "period_start": self._time(start),
            "period_end": self._time(end), "rerun": rerun, "reason": reason,
            "command_hash": command_hash,
            "require_same": bool(require_same_command and command_hash),
            "max_skew": float(max_clock_skew),
        }

        def attempt() -> Claim:
            # Our clock is read as late as possible: the statement compares it with its own.
            params["host_now"] = self._time(datetime.now(UTC))
            self.claim_sent = lease_now()
            return self._claim(params)

        return self._with_schema(attempt)

    def renew(self, job: str, key: str, claim: Claim) -> bool:
        """Refresh the heartbeat of our attempt; False when the row is no longer ours."""
        return self.renewed("cannot renew the claim in", self.RENEW, _ours(job, key, claim))

    def renewed(self, doing: str, sql: str, params: Params) -> bool:
        """A renewal (an attempt's heartbeat, a lease's): one statement as its own transaction
        (_single), sent at once, without a patient connect (a late renewal is a lost one);
        True when it changed the row, still ours."""
        with self._errors(doing):
            self.connect()
            return self._single(sql, params) == 1

    def finish(self, job: str, key: str, claim: Claim, status: Status,
               exit_code: int | None, outcome: str, state: str | None = None,
               state_version: int = 0, output: str | None = None,
               output_limit: OutputLimit | None = None) -> bool:
        """Record done or failed for our attempt; False when the row is no longer ours.

        `outcome` (done, failed, timed-out, exec-failed, interrupted) and `output` (the tail
        of the command's output) go to the history (an interrupted one is also counted in the
        row, against the attempt cap but not --max-attempts); the tail is cut to what the server
        takes (records.cut_tail), and to `output_limit` (bytes, and why) when given.
        With `state` (only for done), the job's watermark is set in the same atomic write,
        and only if it is still at `state_version` (else nothing is written: False).
        """
        # An interrupted attempt (a forwarded signal) is counted in once_runs.interrupted, so
        # that the retry rule does not count it against --max-attempts.
        params = {**_ours(job, key, claim), "status": status, "exit_code": exit_code,
                  "outcome": outcome, "state": state, "state_version": state_version,
                  "output": output, "interrupted": int(outcome == "interrupted")}
        def write() -> bool:
            self._fit_output(self.OUTPUT_STATEMENT, params, output_limit)
            if state is not None and status == "done":
                written = self._finish_with_state(params)
            else:
                written = self._finish(params)
            # A retried write whose first try committed though its answer was lost (a
            # watchdog, a dropped connection) matches no running row: the row then says
            # finished by our own attempt, and that is what the ledger holds.
            return written or self._finished_by(params) is not None

        # A column it names missing: an upgrade left unfinished (MySQL), made first.
        recorded = self._with_schema(write, "cannot record the result in", patient=False)
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
          AND claim_id = %(claim_id)s AND output IS NULL"""

    def keep_output(self, job: str, key: str, claim: Claim, output: str) -> None:
        """Store the output of our attempt after it was fenced out."""
        params = {**_ours(job, key, claim), "output": output}
        with self._errors("cannot store the output in"):
            self.connect()
            self._fit_output(self.KEEP_OUTPUT, params)
            self._write(self.KEEP_OUTPUT, params)

    # The statement of a finish that carries the tail (MySQL: its own; the others: one).
    OUTPUT_STATEMENT: ClassVar[str] = ""

    def _fit_output(self, sql: str, params: Params,
                    limit: OutputLimit | None = None) -> None:
        """Cut params["output"] to `limit` (bytes, and why), and to what the server takes in
        `sql` with these params; one cut, whichever is tighter, from the tail as it came."""
        output = params["output"]
        if not output:
            return
        fitted = output if limit is None else cut_tail(output, *limit)
        room = self._output_room(sql, params)
        if room is not None and room[2](fitted) > room[0]:
            fitted = cut_tail(output, *room)
            if room[2](fitted) > room[0]:
                fitted = ""  # not even the note fits (a packet of a few hundred bytes)
        params["output"] = fitted

    def _output_room(self, sql: str,
                     params: Params) -> tuple[int, str, Callable[[str], int]] | None:
        """What the server takes of the tail in `sql`: (bytes, why, how a text's bytes are
        counted). None: no limit the tail can reach (PostgreSQL's values end at 1 GB,
        SQLite's at 1 GB by default); a refusal still cuts it (once.run.attempt)."""
        return None

    def _write(self, sql: str, params: Params) -> None:
        """One statement that changes rows, committed."""
        raise NotImplementedError

    FINISHED_BY = """
        SELECT status FROM once_runs
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND claim_id = %(claim_id)s AND status IN ('done', 'failed')"""

    STORED_VERSION = "SELECT value FROM once_meta WHERE name = 'schema_version'"

    @staticmethod
    def refuse_newer(row: Row | None) -> None:
        """Raise the newer-schema refusal if the STORED_VERSION row says so: read only when a
        gated statement wrote nothing (the gate itself costs no round trip)."""
        version = int(row[0]) if row and row[0] is not None else 0
        if version > SCHEMA_VERSION:
            raise newer_schema(version)

    def _finished_by(self, params: Params) -> str | None:
        """The status our attempt left in the row, if it finished it (None: not ours)."""
        rows = self._fetch(self.FINISHED_BY, params)
        return str(rows[0][0]) if rows else None

    # connection: Any, the caller's own, of its driver's class (each dialect's names it).
    def finish_on(self, connection: Any, job: str, key: str, claim: Claim) -> bool:
        """Mark our attempt done on the caller's own connection, inside its open transaction
        (psycopg 3, sqlite3 or PyMySQL), so that the work and the marker commit together: in
        our once_attempts row, which no renewal writes. Nothing is committed here; False when
        another attempt took the period over (it marked our row)."""
        return self._finish_on(connection, _ours(job, key, claim))

    def finish_marked(self, job: str, key: str, claim: Claim) -> bool:
        """After finish_on: record done in once_runs once the marker has committed (or a claim
        or an earlier try did); False when no committed marker is there (rolled back, or the
        caller's transaction still open): nothing written."""
        params = _ours(job, key, claim)
        with self._errors("cannot record the result in"):
            self.connect()
            recorded = self._finish_marked(params) or self._finished_by(params) is not None
        if recorded:
            self.release(job, key)
        return recorded

    # SQLite has one writer at a time: a write of ours waits for a caller's open transaction.
    ONE_WRITER: ClassVar[bool] = False

    def in_transaction(self, connection: Any) -> bool:
        """The caller's connection holds an open transaction (a marker's fate is not known)."""
        raise NotImplementedError

    def _finish_on(self, connection: Any, params: Params) -> bool:
        raise NotImplementedError

    def _finish_marked(self, params: Params) -> bool:
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
        # The (state) row's claim_id is its own: once_attempts.claim_id is required (schema
        # 5), which is what refuses an older once's `state --set`.
        params: Params = {"job": job, "state": value, "owner": owner,
                                  "reason": f"state set: {value[:200]}", "seed": seed is not None,
                                  "claim_id": new_claim_id()}
        if seed is not None:
            assert first_period_start is not None
            params.update(kind=seed.kind, schedule=seed.schedule, tz=seed.tz, lag=seed.lag,
                          max_attempts=seed.max_attempts, stale_after=seed.stale_after,
                          shards=seed.shards, no_overlap=int(seed.no_overlap),
                          period_start=self._time(first_period_start))
            return self._with_schema(lambda: self._set_state(params), "cannot set the state in")
        with self._errors("cannot set the state in"):
            self.connect()
            return self._set_state(params)

    # reads for rerun and --state (one round trip each, still no SQLAlchemy)

    JOB_INFO = """
        SELECT kind, schedule, tz, lag, max_attempts, stale_after, shards, no_overlap
        FROM once_jobs WHERE job = %(job)s"""

    STATE = """SELECT state, state_version FROM once_jobs WHERE job = %(job)s"""

    LAST_COMMAND = """
        SELECT command_hash FROM once_attempts
        WHERE job = %(job)s AND command_hash IS NOT NULL
        ORDER BY started_at DESC LIMIT 1"""

    RENEW: ClassVar[str] = ""  # each dialect's: the attempt's heartbeat, fenced
    # Seconds since a row's heartbeat, by the database's clock (per dialect).
    HEARTBEAT_AGE: ClassVar[str] = ""
    # A row whose heartbeat is within its owner's promise, by the database's clock.
    FRESH: ClassVar[str] = ""

    # --no-overlap: the live attempt of another period of the job, if any (read under the
    # job row's lock, after our claim's upsert, so that no claim of the job is unseen).
    LIVE_OTHER = """
        SELECT period, owner, attempt, fence, {age}, stale_after FROM once_runs
        WHERE job = %(job)s AND status = 'running' AND period_start <> %(period_start)s
          AND {fresh}
        ORDER BY period_start LIMIT 1"""

    def live_other(self) -> str:
        return self.LIVE_OTHER.format(age=self.HEARTBEAT_AGE, fresh=self.FRESH)

    ROW_HOLDER = """
        SELECT attempt, fence, owner, claim_id, interrupted FROM once_runs
        WHERE job = %(job)s AND period = %(period)s"""

    def holder(self, job: str, key: str) -> tuple[int, int, str, str | None, int] | None:
        """The period's row: (attempt, fence, owner, claim id, interrupted attempts)."""
        rows = self._read(self.ROW_HOLDER, {"job": job, "period": key})
        if not rows:
            return None
        attempt, fence, owner, claim_id, interrupted = rows[0]
        return int(attempt), int(fence), str(owner), claim_id, int(interrupted)

    def rows(self, job: str) -> LedgerRows:
        """The job's rows as catch-up reads them (once.ledger.gap_rows)."""
        return LedgerRows(self, job)

    def job_info(self, name: str) -> Job | None:
        """The job as its latest claim left it in once_jobs (None: never claimed)."""
        rows = self._read(self.JOB_INFO, {"job": name})
        if not rows:
            return None
        kind, sched, tz, lag, max_attempts, stale_after, shards, no_overlap = rows[0]
        return Job(name, kind, sched, tz, lag, max_attempts, float(stale_after), shards,
                   bool(no_overlap))

    def state(self, job: str) -> tuple[str | None, int]:
        """The job's watermark and its version ((None, 0) when never set)."""
        rows = self._read(self.STATE, {"job": job})
        return (rows[0][0], int(rows[0][1])) if rows else (None, 0)

    def _read(self, sql: str, params: Params) -> list[Row]:
        with self._errors("cannot read"):
            self.connect(patient=True)
            try:
                return self._fetch(sql, params)
            except Exception as exc:
                if self.backend.schema_missing(exc):
                    return []  # no tables yet: nothing has run
                raise

    # per dialect

    def _fetch(self, sql: str, params: Params) -> list[Row]:
        raise NotImplementedError

    def _from_db_time(self, value: Any) -> datetime:
        """A time the driver read, as an aware UTC datetime (naive values are UTC)."""
        return from_db_time(value)

    def _open(self) -> Connection:
        raise NotImplementedError

    def _claim(self, params: Params) -> Claim:
        raise NotImplementedError

    def _single(self, sql: str, params: Params) -> int:
        """One write as a transaction of its own, committed by the server as it ends (the
        rows it changed): nothing is held between round trips, so a process stopped right
        after it (SIGSTOP, a suspended VM) holds no lock. A COMMIT sent apart left SQLite's
        write lock or a MySQL row lock held for as long as the renewing process was stopped,
        and no other process could take the row or the lease over. Renewals use it."""
        raise NotImplementedError

    def _finish(self, params: Params) -> bool:
        raise NotImplementedError

    def _finish_with_state(self, params: Params) -> bool:
        raise NotImplementedError

    def _set_state(self, params: Params) -> int:
        raise NotImplementedError

    def _time(self, instant: datetime) -> datetime | str:
        """A period bound as the dialect's column holds it (Dialect.bind)."""
        return self.backend.bind(instant)

    # plumbing

    def _with_schema(self, action: Callable[[], T], doing: str = "cannot claim in",
                     patient: bool = True) -> T:
        with self._errors(doing):
            self.connect(patient=patient)
            try:
                return action()
            except Exception as exc:
                if not self.backend.schema_missing(exc):
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
            error = LedgerError(f"{doing} the ledger {self.target.redacted}: "
                                f"{describe(exc)}{self._explain(exc)}")
            error.failure, error.cause = self.backend.failure(exc), describe(exc)
            error.lock = self.backend.lock_waited(exc)
            raise error from exc

    def _explain(self, exc: BaseException) -> str:
        """What the driver's error leaves unsaid, for its `once:` line ('' for nothing): read
        only on the error path (a dialect may ask the server, PostgreSQL whether it is a
        standby)."""
        return ""


def _ours(job: str, key: str, claim: Claim) -> Params:
    """What a renewal or a finish matches the row on: our attempt, by its number and by its
    claim's identity, which no other attempt shares (an attempt number can repeat after a
    failover lost the rows that used it)."""
    return {"job": job, "period": key, "attempt": claim.attempt, "claim_id": claim.claim_id}


"""The ledger on PostgreSQL: `PostgresLedger`'s statements, each one round trip (a claim is
one statement of CTEs), under a client-side watchdog that cancels a statement at its time
limit (a commit left waiting for a synchronous standby ends there) and shuts the socket of one
that does not answer even that.

Imports only psycopg 3 (when it connects, through once.ledger.connect) and the stdlib,
besides once.ledger's base and records.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NoReturn, cast

from once.deadlines import lease_now
from once.ledger.base import Ledger
from once.ledger.errors import CANCELLED, Cancelled
from once.ledger.pg_claim import CLAIM, CLAIM_PLAIN, FIND_STORED_CLAIM, stored_claim
from once.ledger.records import (
    Claim,
    CommandDrift,
    LedgerError,
    describe,
    lost_claim,
    overlap_claim,
    read_only_server,
    schema_gate,
    skew_refusal,
)
from once.ledger.url import Target
from once.ledger.watchdog import WATCHDOG, bounded, cancel, limits

if TYPE_CHECKING:
    import psycopg
    from psycopg.errors import Diagnostic
    from psycopg.rows import TupleRow

    from once.ledger.dbapi import Params, Row

_GATE = schema_gate("integer")


class _Overlap(Exception):
    """--no-overlap met another period's live attempt after the claim: roll it back."""

    def __init__(self, row: Row) -> None:
        super().__init__("overlap")
        self.row = row


class PostgresLedger(Ledger):
    dialect = "postgresql"
    # Open whenever a statement runs: each runs after connect() (None only while closed).
    _conn: psycopg.Connection[TupleRow]
    HEARTBEAT_AGE = "extract(epoch FROM clock_timestamp() - heartbeat_at)::float8"
    FRESH = "heartbeat_at >= clock_timestamp() - make_interval(secs => stale_after)"

    # One statement, one round trip (once.ledger.pg_claim), and the same without the timeline.
    CLAIM, CLAIM_PLAIN = CLAIM, CLAIM_PLAIN

    # A new job has no row to lock: its name's transaction-scoped advisory lock (the two-key
    # form, apart from the schema lock's one key) serialises its first claims, then the row's
    # lock serialises them with older once builds, which take that alone.
    LOCK_JOB_NAME = "SELECT pg_advisory_xact_lock(1869505381, hashtext(%(job)s))"
    LOCK_JOB = "SELECT 1 FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    # A claim --no-overlap rolled back is still a fire, and the flag is the latest claim's.
    FIRED_HELD_BACK = """
        UPDATE once_jobs SET fire_count = fire_count + 1, no_overlap = 1,
               last_fired_at = clock_timestamp()
        WHERE job = %(job)s"""

    # A won claim that no synchronous standby confirmed in time (_watched) is undone on the
    # primary, so that no claim that ran nothing holds the period: a first attempt goes, a
    # takeover of a finished row puts the attempt it took over back, one of a stale row is
    # left stale at once. Its own commit does not wait for the standby (in WAL order after).
    RELEASE = """
        WITH mine AS (
            SELECT attempt FROM once_runs
            WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
              AND claim_id = %(claim_id)s AND status = 'running'
        ), prior AS (
            SELECT p.* FROM once_attempts p, mine
            WHERE p.job = %(job)s AND p.period = %(period)s AND p.attempt = mine.attempt - 1
              AND p.status IN ('done', 'failed')
        ), dropped AS (
            DELETE FROM once_runs r USING mine
            WHERE r.job = %(job)s AND r.period = %(period)s AND mine.attempt = 1
            RETURNING 1
        ), restored AS (
            UPDATE once_runs r SET status = p.status, attempt = p.attempt, fence = p.fence,
                   owner = p.owner, started_at = p.started_at, finished_at = p.finished_at,
                   heartbeat_at = coalesce(p.finished_at, p.started_at),
                   exit_code = p.exit_code, claim_id = p.claim_id
            FROM prior p
            WHERE r.job = %(job)s AND r.period = %(period)s
            RETURNING 1
        ), forgotten AS (
            DELETE FROM once_attempts a USING mine
            WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = mine.attempt
              AND a.claim_id = %(claim_id)s
              AND (mine.attempt = 1 OR EXISTS (SELECT FROM prior))
        ), abandoned AS (
            UPDATE once_runs r SET heartbeat_at = r.started_at, stale_after = 0
            FROM mine
            WHERE r.job = %(job)s AND r.period = %(period)s AND mine.attempt > 1
              AND NOT EXISTS (SELECT FROM prior)
            RETURNING 1
        )
        SELECT set_config('synchronous_commit', 'local', true),
               (SELECT count(*) FROM dropped) + (SELECT count(*) FROM restored)
               + (SELECT count(*) FROM abandoned)"""

    IN_RECOVERY = "SELECT pg_is_in_recovery()"

    RENEW = """
        UPDATE once_runs SET heartbeat_at = clock_timestamp()
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND claim_id = %(claim_id)s AND status = 'running'"""

    FINISH = """
        WITH fin AS (
            UPDATE once_runs SET status = %(status)s, exit_code = %(exit_code)s,
                   finished_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
                   interrupted = interrupted + %(interrupted)s
            WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
              AND claim_id = %(claim_id)s AND status = 'running'
            RETURNING finished_at
        ), logged AS (
            UPDATE once_attempts a SET status = %(status)s, exit_code = %(exit_code)s,
                   outcome = %(outcome)s, output = %(output)s,
                   finished_at = fin.finished_at
            FROM fin
            WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s
        )
        SELECT count(*) FROM fin"""

    # Run.finish_in's marker, on the caller's connection: the attempt's own row, which the
    # heartbeat never writes (it renews once_runs), so that at REPEATABLE READ or SERIALIZABLE
    # a transaction may outlive any number of heartbeats. A takeover marks the row it takes
    # over (outcome taken-over): then nothing matches, or, if it committed after the
    # caller's snapshot, PostgreSQL fails the statement (could not serialize access).
    MARK = """
        UPDATE once_attempts SET status = 'done', exit_code = 0, outcome = 'done',
               finished_at = clock_timestamp()
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND claim_id = %(claim_id)s AND status = 'running' AND outcome IS NULL"""

    # The finish after Run.finish_in: the run row done once the marker has committed. The
    # marker is read, not locked: a caller whose transaction is still open is not waited for.
    FINISH_MARKED = """
        UPDATE once_runs r SET status = 'done', exit_code = a.exit_code,
               finished_at = a.finished_at
        FROM once_attempts a
        WHERE r.job = %(job)s AND r.period = %(period)s AND r.attempt = %(attempt)s
          AND r.claim_id = %(claim_id)s AND r.status = 'running' AND a.job = r.job
          AND a.period = r.period
          AND a.attempt = r.attempt AND a.status = 'done'"""

    # The same finish, and the watermark with it, in one statement: the job row is locked
    # first (FOR UPDATE returns its newest version), the run row is finished only if the
    # watermark is still at the version the claim read, and the watermark moves only if the
    # run row was ours.
    FINISH_STATE = """
        WITH j AS (
            SELECT state_version = %(state_version)s AS fresh FROM once_jobs
            WHERE job = %(job)s FOR UPDATE
        ), fin AS (
            UPDATE once_runs SET status = 'done', exit_code = %(exit_code)s,
                   finished_at = clock_timestamp(), heartbeat_at = clock_timestamp()
            WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
              AND claim_id = %(claim_id)s AND status = 'running' AND (SELECT fresh FROM j)
            RETURNING finished_at
        ), logged AS (
            UPDATE once_attempts a SET status = 'done', exit_code = %(exit_code)s,
                   outcome = %(outcome)s, output = %(output)s, finished_at = fin.finished_at
            FROM fin
            WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s
        ), advanced AS (
            UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
            FROM fin WHERE once_jobs.job = %(job)s
        )
        SELECT count(*) FROM fin"""

    SEED_JOB = """
        INSERT INTO once_jobs (job, fence, fire_count, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, no_overlap, first_period_start,
                               created_at, last_fired_at)
        VALUES (%(job)s, 0, 0, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                %(stale_after)s, %(shards)s, %(no_overlap)s, %(period_start)s,
                clock_timestamp(), clock_timestamp())
        ON CONFLICT (job) DO NOTHING"""

    SET_STATE = f"""
        WITH changed AS (
            UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
            WHERE job = %(job)s AND {_GATE}
            RETURNING state_version, fence
        ), logged AS (
            INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                       finished_at, outcome, reason, claim_id)
            SELECT %(job)s, '(state)', state_version, fence, %(owner)s, 'done',
                   clock_timestamp(), clock_timestamp(), 'state-set', %(reason)s, %(claim_id)s
            FROM changed
        )
        SELECT state_version FROM changed"""

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        super().__init__(target, timeout)
        self._warnings: list[str] = []

    def _open(self) -> psycopg.Connection[TupleRow]:
        from once.ledger.connect import connect

        # autocommit: each statement is its own transaction, one round trip (psycopg's).
        conn = cast("psycopg.Connection[TupleRow]",
                    connect(self.target, max(2, round(self.statement_timeout)), autocommit=True))
        conn.add_notice_handler(self._noticed)
        self._claims_sent, self._stored_claim, self._stored_call = 0, None, ""
        return conn

    timeline_fences = True  # this ledger's claims read the timeline (TIMELINE_FLOOR)
    # A connection's claims from this one on call the stored claim; its first is the statement
    # (a single fire's: the call's first in a server session costs more).
    STORED_FROM = 2
    _claims_sent = 0  # on this connection
    _stored_claim: bool | None = None  # whether it calls pg_claim's function; None: not asked
    _stored_call = ""  # the call, in the tables' schema

    def _claim(self, params: Params) -> Claim:
        """The claim, its fence composed with the server's timeline; where the server cannot
        read it, sent again without (a failed statement wrote nothing), and from then on
        without, once that passed (a refusal it meets too was not the timeline's). A
        refusal of the stored claim (dropped, its call not granted) is first sent again as
        the statement, which is then used on this connection."""
        if self.timeline_fences:
            try:
                return self._claim_with(self._timeline_claim(), params)
            except Exception as exc:
                if not timeline_unreadable(exc):
                    raise
                if self._stored_claim:
                    self._stored_claim = False
                    return self._claim(params)
        claim = self._claim_with(self.CLAIM_PLAIN, params)
        self.timeline_fences = False
        return claim

    def _timeline_claim(self) -> str:
        """CLAIM for a connection's first claim, its stored function's call (made here if it
        is missing) for the later ones where it can be had (pg_claim.stored_claim)."""
        self._claims_sent += 1
        if self._claims_sent >= self.STORED_FROM and self._stored_claim is None:
            self._stored_claim = self.make_stored_claim()
            self.claim_sent = lease_now()  # the lease counts from the claim, not from this
        return self._stored_call if self._stored_claim else self.CLAIM

    def make_stored_claim(self) -> bool:
        """Whether this connection may call the stored claim: ours, in the tables' schema
        (FIND_STORED_CLAIM), made there if it is missing and this role may. Any failure
        leaves this connection's claims as the statement."""
        self.connect()
        found = self._find_stored_claim()
        if found is not None and found[2] is None and found[1]:
            # Briefly: a DBA's CREATE left uncommitted would hold every catch-up. Another
            # process that makes it at the same moment may fail this one: found again below.
            with suppress(Exception), self._transaction():
                self._conn.execute("SET LOCAL lock_timeout = '1s'")
                self._conn.execute(stored_claim().create(found[0]))
            found = self._find_stored_claim()
        if found is None or not found[2]:
            return False
        self._stored_call = stored_claim().call(found[0])
        return True

    def _find_stored_claim(self) -> Row | None:
        """FIND_STORED_CLAIM's row: (the tables' schema, whether this role may create there,
        whether the stored claim there is ours to call, or None when there is none); None
        when it cannot be read."""
        claim = stored_claim()
        try:
            rows = self._fetch(FIND_STORED_CLAIM, {"source": claim.source,
                                                   "procedure": claim.name + claim.signature})
        except Exception:
            return None
        return rows[0] if rows else None

    def _claim_with(self, claim_sql: str, params: Params) -> Claim:
        if not (params["require_same"] or params["no_overlap"]):
            claim = self._answer(self._execute(claim_sql, params).fetchone(), params)
        else:
            # Only these flags pay the round trips of a transaction; its commit is watched.
            try:
                with self._transaction():  # its idle time bounded too
                    claim = self._claim_checked(claim_sql, params)
            except _Overlap as overlap:  # rolled back: the claim it made is undone
                self._execute(self.FIRED_HELD_BACK, params)  # as any other skip is counted
                return overlap_claim(overlap.row)
        if claim.won and self.unconfirmed:
            self._release_unconfirmed(params, claim)
        return claim

    def _claim_checked(self, claim_sql: str, params: Params) -> Claim:
        if params["require_same"]:
            # The job row's lock first, so that every claim of the job that committed before
            # is visible to the next statement; the drift is decided before the claim.
            self._execute(self.LOCK_JOB_NAME, params)
            self._execute(self.LOCK_JOB, params)
            last = self._execute(self.LAST_COMMAND, params).fetchone()
            if last is not None and last[0] != params["command_hash"]:
                raise CommandDrift(params["job"], last[0], params["command_hash"])
        claim = self._answer(self._execute(claim_sql, params).fetchone(), params)
        if claim.won and params["no_overlap"]:
            # The claim's upsert holds the job row: a statement from now on sees every
            # claim of the job that committed before, and no other can commit meanwhile.
            other = self._execute(self.live_other(), params).fetchone()
            if other is not None:
                raise _Overlap(other)
        return claim

    def _release_unconfirmed(self, params: Params, claim: Claim) -> NoReturn:
        """The claim committed on the primary, but its wait for the synchronous standby was
        cancelled at the statement's time limit: nothing is run on a claim a failover could
        lose, and the claim is released (RELEASE) rather than left to hold the period for
        --stale-after (docs/how-to/high-availability.md)."""
        try:
            rows = self._fetch(self.RELEASE, {**params, "attempt": claim.attempt})
            undone = "so it was released" if rows[0][1] else "and it is no longer this claim's"
        except Exception as exc:  # the period is then held until the claim goes stale
            undone = (f"and it could not be released ({describe(exc)}): the period is held "
                      f"until --stale-after")
        raise LedgerError(
            f"cannot claim in the ledger {self.target.redacted}: no synchronous standby "
            f"confirmed the claim within {self._limits()[0]:g}s (is the synchronous standby "
            f"down? see synchronous_standby_names), {undone}")

    def _explain(self, exc: BaseException) -> str:
        """A refused write: whether the server is a standby (asked only on this path)."""
        if not read_only_server(exc) or self._conn is None:
            return ""
        try:
            standby = self._fetch(self.IN_RECOVERY, {})[0][0]
        except Exception:  # the error said enough
            return ""
        if standby:
            return (" (the server is a standby, in recovery: point --db at the primary, or "
                    "name every server in the URL with target_session_attrs=read-write)")
        return " (the server is a primary whose sessions are read-only)"

    def _answer(self, row: Row | None, params: Params) -> Claim:
        if row is None:  # the row was inserted by a claimer our snapshot cannot see yet
            return lost_claim(None)
        what, attempt, fence, status, owner, age, state, version, stale_after, interrupted = row
        if what == "newer":
            self.refuse_newer((status,))
        if what == "skew":
            raise skew_refusal(params, age)
        if what in ("lost", "capped"):
            return lost_claim((status, attempt, fence, owner, age, stale_after, interrupted),
                              capped=what == "capped")
        return Claim(True, attempt, fence, status, owner, age, state, version,
                     claim_id=params["claim_id"])

    def _single(self, sql: str, params: Params) -> int:
        return int(self._execute(sql, params).rowcount)  # autocommit: one round trip

    def _write(self, sql: str, params: Params) -> None:
        self._execute(sql, params)

    def _finish(self, params: Params) -> bool:
        (count,) = cast("Row", self._execute(self.FINISH, params).fetchone())  # one: a count
        return bool(count == 1)

    def _finish_with_state(self, params: Params) -> bool:
        (count,) = cast("Row", self._execute(self.FINISH_STATE, params).fetchone())  # one: a count
        return bool(count == 1)

    def _finish_on(self, connection: psycopg.Connection[Any], params: Params) -> bool:
        return bool(connection.execute(self.MARK, params).rowcount == 1)

    def _finish_marked(self, params: Params) -> bool:
        return bool(self._execute(self.FINISH_MARKED, params).rowcount == 1)

    def in_transaction(self, connection: psycopg.Connection[Any]) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(not connection.closed and connection.info.transaction_status in (
            TransactionStatus.ACTIVE, TransactionStatus.INTRANS, TransactionStatus.INERROR))

    def _set_state(self, params: Params) -> int:
        # One transaction: a CTE's update cannot see its sibling's insert, and a seed on a
        # ledger that refuses us is rolled back.
        with self._transaction():
            if params["seed"]:
                self._execute(self.SEED_JOB, params)
            row = self._execute(self.SET_STATE, params).fetchone()
            if row is None:
                self.refuse_newer(self._execute(self.STORED_VERSION, {}).fetchone())
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
        return int(row[0])

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Cursor[TupleRow]]:
        """One transaction under the watchdog, its statements in the pyformat style, committed
        when the block ends (as sqlite's and mysql's: once.ledger.leases); the server ends it
        if it sits idle IDLE_TRANSACTION seconds (a process stopped inside it). Every
        transaction of several statements on this connection is one of these."""
        with self._watched(), self._conn.transaction():
            cur = self._conn.cursor()
            for statement in self.backend.write_begin:
                cur.execute(statement)
            yield cur

    def _execute(self, sql: str, params: Params) -> psycopg.Cursor[TupleRow]:
        """Execute under a watchdog (_watched)."""
        with self._watched():
            return self._conn.execute(sql, params)

    # Set by each watched statement or transaction: it was answered after the watchdog had
    # cancelled it, with a warning: PostgreSQL's "canceling wait for synchronous replication"
    # (the transaction committed locally; no standby confirmed it). Its words are translated;
    # its severity is not.
    unconfirmed = False
    _depth = 0

    def _limits(self) -> tuple[float, float]:
        """(when a statement is cancelled, when its socket is shut down), in seconds: the
        rule once's other commits are watched by (watchdog.limits)."""
        return limits(self.statement_timeout)

    @contextmanager
    def _watched(self) -> Iterator[None]:
        """Bound what runs in the block (a statement, or a transaction with its commit).
        psycopg has no client-side statement timeout, and a server-side one needs session
        state that PgBouncer does not keep: a server that stops answering (stopped, hung, a
        partition that still ACKs) would hold us for ever. At the first limit the statement is
        cancelled (as a server-side timeout would, through psycopg's cancel request), which
        also ends a commit's wait for a synchronous standby (the transaction then stands on
        the primary alone); past the second, the socket is shut down, which fails it."""
        if self._depth:  # inside a watched transaction: its watch covers this statement
            yield
            return
        conn = self._conn
        self.unconfirmed, self._warnings = False, []
        full = self._limits()
        cancel_at, shut_at = bounded(*full)  # as the watchdog keeps them (arm)
        token = WATCHDOG.arm(conn.pgconn.socket, cancel_at, shut_at,
                              lambda: cancel(conn, shut_at - cancel_at))
        self._depth += 1
        try:
            yield
        except Exception as exc:
            # A statement our own watchdog cut off (its socket shut, no SQLSTATE): the server
            # gave no answer, whatever the driver's words for the cut ("server closed the
            # connection unexpectedly") would suggest.
            cancelled = WATCHDOG.disarm(token)
            if cancelled and getattr(exc, "sqlstate", None) is None:
                raise TimeoutError(f"no answer from the server within {shut_at:.3g}s") from exc
            if cancelled and getattr(exc, "sqlstate", None) == CANCELLED:
                raise Cancelled(exc, cancel_at, cut=cancel_at < full[0]) from exc
            raise
        finally:
            self._depth -= 1
            cancelled = WATCHDOG.disarm(token)
        self.unconfirmed = cancelled and bool(self._warnings)

    def _noticed(self, notice: Diagnostic) -> None:
        if notice.severity_nonlocalized == "WARNING":
            self._warnings.append(str(notice.message_primary))

    def _fetch(self, sql: str, params: Params) -> list[Row]:
        return [tuple(r) for r in self._execute(sql, params).fetchall()]


# What a server that speaks PostgreSQL but cannot read its timeline answers TIMELINE_FLOOR
# with, by SQLSTATE class: an unknown function or a privilege refused (42), not supported
# (0A), a value it cannot cast (22), an internal error (XX), a prerequisite (55: Aurora's
# "wal_level must be set to 'logical'"; not a standby's "recovery is in progress", which the
# claim without the timeline meets too).
_NO_TIMELINE = ("42", "0A", "22", "XX", "55")
# Of those, what any claim may meet: a table or column not created yet; a lock not had in
# time (lock_timeout: 55P03) or an object in use (55006), which would turn the timeline off
# for the process (and the stored claim for the connection) for a moment's contention.
_NOT_THE_TIMELINE = ("42P01", "42703", "55P03", "55006")


def timeline_unreadable(exc: BaseException) -> bool:
    state = str(getattr(exc, "sqlstate", None) or "")
    return (state[:2] in _NO_TIMELINE and state not in _NOT_THE_TIMELINE
            and not read_only_server(exc))

"""The ledger on PostgreSQL: `PostgresLedger`'s statements, each one round trip (a claim is
one statement of CTEs), under a client-side watchdog.

Imports only psycopg 3 (when it connects) and the stdlib, besides once.ledger's base and
records.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from once.ledger.base import Ledger, shut_down
from once.ledger.records import Claim, CommandDrift, LedgerError, lost_claim, skew_refusal


class PostgresLedger(Ledger):
    dialect = "postgresql"
    HEARTBEAT_AGE = "extract(epoch FROM clock_timestamp() - heartbeat_at)::float8"

    # One statement, one round trip: compare the clocks, bump the job's fence, insert or take
    # over the run row, log the attempt; when nothing was won, report the row as it stands.
    # Every part reads the row's newest version: ON CONFLICT sees it whatever the statement's
    # snapshot, and the holder is read FOR SHARE (after the job row's lock, which serialises
    # the job's claims), which in READ COMMITTED follows the row to its latest committed
    # version. A plain read would report the row as it stood before a concurrent claim (a
    # rerun refused as "done by attempt 1").
    CLAIM = """
        WITH clock AS (
            SELECT %(max_skew)s = 0
                   OR abs(extract(epoch FROM clock_timestamp() - %(host_now)s)) <= %(max_skew)s
                   AS ok
        ), job AS (
            INSERT INTO once_jobs AS j (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                                        stale_after, shards, first_period_start, created_at,
                                        last_fire_at)
            SELECT %(job)s, 1, 1, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                   %(stale_after)s, %(shards)s, %(period_start)s, clock_timestamp(),
                   clock_timestamp()
            FROM clock WHERE clock.ok
            ON CONFLICT (job) DO UPDATE SET
                fence = j.fence + 1, fires = j.fires + 1, kind = excluded.kind,
                schedule = excluded.schedule, tz = excluded.tz, lag = excluded.lag,
                max_attempts = excluded.max_attempts, stale_after = excluded.stale_after,
                shards = excluded.shards,
                first_period_start = least(j.first_period_start, excluded.first_period_start),
                last_fire_at = excluded.last_fire_at
            RETURNING fence, state, state_version
        ), won AS (
            INSERT INTO once_runs AS r (job, period, status, attempt, fence, owner, period_start,
                                        period_end, started_at, heartbeat_at, stale_after)
            SELECT %(job)s, %(period)s, 'running', 1, job.fence, %(owner)s, %(period_start)s,
                   %(period_end)s, clock_timestamp(), clock_timestamp(), %(stale_after)s
            FROM job
            ON CONFLICT (job, period) DO UPDATE SET
                status = 'running', attempt = r.attempt + 1, fence = excluded.fence,
                owner = excluded.owner, started_at = excluded.started_at,
                heartbeat_at = excluded.heartbeat_at, finished_at = NULL, exit_code = NULL,
                stale_after = excluded.stale_after
            WHERE (r.status = 'failed' AND r.attempt < %(max_attempts)s)
               OR (r.status = 'running'
                   AND r.heartbeat_at < clock_timestamp() - make_interval(secs => r.stale_after))
               OR (%(rerun)s AND r.status IN ('done', 'failed'))
            RETURNING r.attempt, r.fence, r.started_at
        ), logged AS (
            INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                       reason, command_hash, output)
            SELECT %(job)s, %(period)s, attempt, fence, %(owner)s, 'running', started_at,
                   %(reason)s, %(command_hash)s, NULL
            FROM won
        ), holder AS (
            SELECT r.attempt, r.fence, r.status, r.owner,
                   extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS age,
                   r.stale_after
            FROM once_runs r, job
            WHERE r.job = %(job)s AND r.period = %(period)s AND NOT EXISTS (SELECT FROM won)
            FOR SHARE OF r
        )
        SELECT 'won', attempt, won.fence, 'running', %(owner)s, 0.0::float8, job.state,
               job.state_version, NULL::float8
        FROM won, job
        UNION ALL
        SELECT 'lost', attempt, fence, status, owner, age, NULL, 0, stale_after FROM holder
        UNION ALL
        SELECT 'skew', 0, 0, '', '', extract(epoch FROM clock_timestamp() - %(host_now)s)::float8,
               NULL, 0, NULL
        FROM clock WHERE NOT clock.ok"""

    LOCK_JOB = "SELECT 1 FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    RENEW = """
        UPDATE once_runs SET heartbeat_at = clock_timestamp()
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    FINISH = """
        WITH fin AS (
            UPDATE once_runs SET status = %(status)s, exit_code = %(exit_code)s,
                   finished_at = clock_timestamp(), heartbeat_at = clock_timestamp()
            WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
              AND status = 'running'
            RETURNING finished_at
        ), logged AS (
            UPDATE once_attempts a SET status = %(status)s, exit_code = %(exit_code)s,
                   outcome = %(outcome)s, output = %(output)s,
                   finished_at = fin.finished_at
            FROM fin
            WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s
        )
        SELECT count(*) FROM fin"""

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
              AND status = 'running' AND (SELECT fresh FROM j)
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
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (%(job)s, 0, 0, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                %(stale_after)s, %(shards)s, %(period_start)s, clock_timestamp(),
                clock_timestamp())
        ON CONFLICT (job) DO NOTHING"""

    SET_STATE = """
        WITH changed AS (
            UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
            WHERE job = %(job)s
            RETURNING state_version, fence
        ), logged AS (
            INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                       finished_at, outcome, reason)
            SELECT %(job)s, '(state)', state_version, fence, %(owner)s, 'done',
                   clock_timestamp(), clock_timestamp(), 'state-set', %(reason)s
            FROM changed
        )
        SELECT state_version FROM changed"""

    def _open(self) -> Any:
        import psycopg

        args = dict(self.target.connect_args)
        conninfo = args.pop("conninfo")
        # autocommit: each statement is its own transaction, one round trip.
        # prepare_threshold=None: no server-side prepared statements, so PgBouncer in
        # transaction pooling mode works.
        return psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=None,
            connect_timeout=max(2, round(self.statement_timeout)), **args,
        )

    def _claim(self, params: dict[str, Any]) -> Claim:
        if not params["require_same"]:
            return self._answer(self._execute(self.CLAIM, params).fetchone(), params)
        # --require-same-command: take the job row's lock first, so that every claim of the
        # job that committed before is visible to the next statement, and decide the drift
        # before the claim, in one transaction with it (only this flag pays the round trips).
        with self._conn.transaction():
            self._execute(self.LOCK_JOB, params)
            last = self._execute(self.LAST_COMMAND, params).fetchone()
            if last is not None and last[0] != params["command_hash"]:
                raise CommandDrift(params["job"], last[0], params["command_hash"])
            return self._answer(self._execute(self.CLAIM, params).fetchone(), params)

    def _answer(self, row: tuple[Any, ...] | None, params: dict[str, Any]) -> Claim:
        if row is None:  # the row was inserted by a claimer our snapshot cannot see yet
            return lost_claim(None)
        what, attempt, fence, status, owner, age, state, version, stale_after = row
        if what == "skew":
            raise skew_refusal(params, age)
        if what == "lost":
            return lost_claim((status, attempt, fence, owner, age, stale_after))
        return Claim(True, attempt, fence, status, owner, age, state, version)

    def _renew(self, params: dict[str, Any]) -> bool:
        return bool(self._execute(self.RENEW, params).rowcount == 1)

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        self._execute(sql, params)

    def _finish(self, params: dict[str, Any]) -> bool:
        (count,) = self._execute(self.FINISH, params).fetchone()
        return bool(count == 1)

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        (count,) = self._execute(self.FINISH_STATE, params).fetchone()
        return bool(count == 1)

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        (count,) = connection.execute(self.FINISH, params).fetchone()
        return bool(count == 1)

    def _set_state(self, params: dict[str, Any]) -> int:
        if not params["seed"]:
            row = self._execute(self.SET_STATE, params).fetchone()
        else:
            # Two statements, one transaction: a CTE's update cannot see its sibling's insert.
            with self._conn.transaction():
                self._execute(self.SEED_JOB, params)
                row = self._execute(self.SET_STATE, params).fetchone()
        if row is None:
            raise LedgerError(f"unknown job {params['job']!r}: it has never run")
        return int(row[0])

    def _execute(self, sql: str, params: dict[str, Any]) -> Any:
        """Execute under a watchdog. psycopg has no client-side statement timeout, and a
        server-side one needs session state that PgBouncer does not keep; a server that stops
        answering (stopped, hung, a partition that still ACKs) would hold us for ever. Past
        the watchdog's time the socket is shut down, which fails the statement."""
        token = _WATCHDOG.arm(self._conn.pgconn.socket, max(5.0, 2 * self.statement_timeout))
        try:
            return self._conn.execute(sql, params)
        finally:
            _WATCHDOG.disarm(token)

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._execute(sql, params).fetchall()]


class _Watchdog:
    """One thread for every statement's time limit, started with the first: a thread a
    statement (threading.Timer) cost half a millisecond each, two a period in a catch-up.
    Statements may be in flight on several connections at once (a renewal left stuck in a
    hung server, and the next statement on a fresh connection)."""

    def __init__(self) -> None:
        self.forked()
        # A fork has no thread, and may have copied the lock while the parent's thread held it.
        os.register_at_fork(after_in_child=self.forked)

    def forked(self) -> None:
        self._changed = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}  # token -> (deadline, socket)
        self._tokens = 0
        self._watching = False

    def arm(self, fd: int, seconds: float) -> int:
        with self._changed:
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, daemon=True, name="once-watchdog").start()
            deadline = time.monotonic() + seconds
            earliest = min((armed for armed, _ in self._armed.values()), default=None)
            self._tokens += 1
            self._armed[self._tokens] = (deadline, fd)
            if earliest is None or deadline < earliest:  # else it wakes in time anyway
                self._changed.notify()
            return self._tokens

    def disarm(self, token: int) -> None:
        with self._changed:
            self._armed.pop(token, None)  # the thread wakes at the old deadline, finds nothing

    def _watch(self) -> None:
        with self._changed:
            try:
                while True:
                    now = time.monotonic()
                    for token, (deadline, fd) in list(self._armed.items()):
                        if deadline <= now:
                            del self._armed[token]
                            shut_down(fd)
                    deadlines = [deadline for deadline, _ in self._armed.values()]
                    self._changed.wait(min(deadlines) - now if deadlines else None)
            finally:  # never left without a watcher: the next statement starts another
                self._watching = False


_WATCHDOG = _Watchdog()

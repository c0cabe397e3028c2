"""The ledger on MySQL and MariaDB: `MysqlLedger`'s statements, in explicit transactions
(PyMySQL, autocommit off).

Imports only PyMySQL (when it connects) and the stdlib, besides once.ledger's base and
records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from once.ledger.base import Ledger
from once.ledger.records import (
    Claim,
    CommandDrift,
    LedgerError,
    error_code,
    lost_claim,
    skew_refusal,
)

_MY_NOW = "UTC_TIMESTAMP(6)"
_DUPLICATE_KEY, _DEADLOCK, _LOCK_WAIT = 1062, 1213, 1205


class MysqlLedger(Ledger):
    dialect = "mysql"
    HEARTBEAT_AGE = f"TIMESTAMPDIFF(MICROSECOND, heartbeat_at, {_MY_NOW}) / 1e6"

    # LAST_INSERT_ID(expr) hands the new fence back in the OK packet: no extra SELECT.
    UPSERT_JOB = f"""
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, `lag`, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (%(job)s, LAST_INSERT_ID(1), 1, %(kind)s, %(schedule)s, %(tz)s, %(lag)s,
                %(max_attempts)s, %(stale_after)s, %(shards)s, %(period_start)s, {_MY_NOW},
                {_MY_NOW})
        ON DUPLICATE KEY UPDATE
            fence = LAST_INSERT_ID(fence + 1), fires = fires + 1, kind = VALUES(kind),
            schedule = VALUES(schedule), tz = VALUES(tz), `lag` = VALUES(`lag`),
            max_attempts = VALUES(max_attempts), stale_after = VALUES(stale_after),
            shards = VALUES(shards),
            first_period_start = LEAST(first_period_start, VALUES(first_period_start)),
            last_fire_at = VALUES(last_fire_at)"""

    INSERT_RUN = f"""
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at, stale_after)
        VALUES (%(job)s, %(period)s, 'running', 1, %(fence)s, %(owner)s, %(period_start)s,
                %(period_end)s, {_MY_NOW}, {_MY_NOW}, %(stale_after)s)"""

    # Stale by the owner's promise (the row's stale_after, as the WHERE clause reads the row
    # before the update), never by ours.
    TAKE_OVER = f"""
        UPDATE once_runs SET
            attempt = LAST_INSERT_ID(attempt + 1), status = 'running', fence = %(fence)s,
            owner = %(owner)s, started_at = {_MY_NOW}, heartbeat_at = {_MY_NOW},
            finished_at = NULL, exit_code = NULL, stale_after = %(stale_after)s
        WHERE job = %(job)s AND period = %(period)s
          AND ((status = 'failed' AND attempt < %(max_attempts)s)
            OR (status = 'running'
                AND heartbeat_at < {_MY_NOW} - INTERVAL ROUND(stale_after * 1000000) MICROSECOND)
            OR (%(rerun)s AND status IN ('done', 'failed')))"""

    HOLDER = f"""
        SELECT status, attempt, fence, owner,
               TIMESTAMPDIFF(MICROSECOND, heartbeat_at, {_MY_NOW}) / 1e6, stale_after
        FROM once_runs WHERE job = %(job)s AND period = %(period)s"""

    # Our clock minus the server's, in seconds (--max-clock-skew).
    SKEW = f"SELECT TIMESTAMPDIFF(MICROSECOND, %(host_now)s, {_MY_NOW}) / 1e6"

    LOCK_JOB = "SELECT fence FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    # A locking read sees the newest committed attempt, whatever the transaction's snapshot.
    LAST_COMMAND_LOCKED = Ledger.LAST_COMMAND + " LOCK IN SHARE MODE"

    LOG_ATTEMPT = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at, reason,
                                   command_hash, output)
        SELECT job, period, attempt, fence, owner, 'running', started_at, %(reason)s,
               %(command_hash)s, NULL
        FROM once_runs WHERE job = %(job)s AND period = %(period)s"""

    # MySQL 8 reserves LAG (a window function): quote it.
    JOB_INFO = Ledger.JOB_INFO.replace(" lag,", " `lag`,")

    LOCK_STATE = "SELECT state, state_version FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    ADVANCE_STATE = """
        UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
        WHERE job = %(job)s"""

    # Not INSERT IGNORE: that would also turn a value the column cannot hold into a warning.
    SEED_JOB = f"""
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, `lag`, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (%(job)s, 0, 0, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                %(stale_after)s, %(shards)s, %(period_start)s, {_MY_NOW}, {_MY_NOW})
        ON DUPLICATE KEY UPDATE job = job"""

    SET_STATE = """
        UPDATE once_jobs SET state = %(state)s,
               state_version = LAST_INSERT_ID(state_version + 1)
        WHERE job = %(job)s"""

    LOG_STATE = f"""
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   finished_at, outcome, reason)
        SELECT job, '(state)', state_version, fence, %(owner)s, 'done', {_MY_NOW}, {_MY_NOW},
               'state-set', %(reason)s
        FROM once_jobs WHERE job = %(job)s"""

    RENEW = f"""
        UPDATE once_runs SET heartbeat_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    FINISH_RUN = f"""
        UPDATE once_runs SET status = %(status)s, exit_code = %(exit_code)s,
               finished_at = {_MY_NOW}, heartbeat_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    FINISH_ATTEMPT = """
        UPDATE once_attempts a JOIN once_runs r ON r.job = a.job AND r.period = a.period
        SET a.status = r.status, a.exit_code = r.exit_code, a.finished_at = r.finished_at,
            a.outcome = %(outcome)s, a.output = %(output)s
        WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s"""

    def _open(self) -> Any:
        import pymysql
        from pymysql.constants import CLIENT

        # FOUND_ROWS: an UPDATE reports the rows it matched, not those it changed, so two
        # renewals within one clock tick still say "still ours".
        return pymysql.connect(
            **self.target.connect_args, autocommit=False, client_flag=CLIENT.FOUND_ROWS,
            connect_timeout=self.statement_timeout, read_timeout=self.statement_timeout,
            write_timeout=self.statement_timeout,
        )

    def _claim(self, params: dict[str, Any]) -> Claim:
        params = {**params, "rerun": int(params["rerun"])}
        for attempt in range(5):
            try:
                with self._transaction() as cur:
                    return self._claim_in(cur, params)
            except Exception as exc:  # rolled back: a deadlock or a lock wait may pass
                if error_code(exc) not in (_DEADLOCK, _LOCK_WAIT) or attempt == 4:
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _claim_in(self, cur: Any, params: dict[str, Any]) -> Claim:
        if params["max_skew"]:
            cur.execute(self.SKEW, params)
            (db_minus_host,) = cur.fetchone()
            if abs(float(db_minus_host)) > params["max_skew"]:
                raise skew_refusal(params, float(db_minus_host))
        if params["require_same"]:
            # The job row's lock first: every claim of the job serialises on it, so the
            # newest attempt read next is the newest there is, until our commit.
            cur.execute(self.LOCK_JOB, params)
            cur.execute(self.LAST_COMMAND_LOCKED, params)
            last = cur.fetchone()
            if last is not None and last[0] != params["command_hash"]:
                raise CommandDrift(params["job"], last[0], params["command_hash"])
        cur.execute(self.UPSERT_JOB, params)
        fence = cur.lastrowid
        params = {**params, "fence": fence}
        try:
            cur.execute(self.INSERT_RUN, params)
            attempt = 1
        except Exception as exc:
            # Only a duplicate key means "the row exists"; never INSERT IGNORE, which would
            # turn a bad value or a missing column into a warning and a silent skip.
            if error_code(exc) != _DUPLICATE_KEY:
                raise
            if cur.execute(self.TAKE_OVER, params) != 1:
                cur.execute(self.HOLDER, params)
                return lost_claim(cur.fetchone())
            attempt = cur.lastrowid
        cur.execute(self.LOG_ATTEMPT, params)
        cur.execute(self.LOCK_STATE, params)  # the job row is ours until the commit anyway
        state, version = cur.fetchone()
        return Claim(True, attempt, fence, state=state, state_version=version)

    def _renew(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            return bool(cur.execute(self.RENEW, params) == 1)

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        with self._transaction() as cur:
            cur.execute(sql, params)

    def _finish(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            return self._finish_rows(cur, params)

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            cur.execute(self.LOCK_STATE, params)
            row = cur.fetchone()
            if row is None or row[1] != params["state_version"]:
                return False
            if not self._finish_rows(cur, params):
                return False
            cur.execute(self.ADVANCE_STATE, params)
            return True

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        return self._finish_rows(connection.cursor(), params)

    def _finish_rows(self, cur: Any, params: dict[str, Any]) -> bool:
        """The run row's fenced finish, then its attempt's: False when the run row is no
        longer this attempt's (nothing written)."""
        if cur.execute(self.FINISH_RUN, params) != 1:
            return False
        cur.execute(self.FINISH_ATTEMPT, params)
        return True

    def _set_state(self, params: dict[str, Any]) -> int:
        with self._transaction() as cur:
            if params["seed"]:
                cur.execute(self.SEED_JOB, params)
            if cur.execute(self.SET_STATE, params) != 1:
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
            version = cur.lastrowid
            cur.execute(self.LOG_STATE, params)
        return int(version)

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # The commit ends the read's snapshot: the next read sees new rows.
        with self._transaction() as cur:
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()]

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One transaction (autocommit is off): a cursor for the block, committed when the
        block ends, rolled back when it raises. A block that ends without writing (a lost
        claim, a finish that is no longer ours) commits nothing: as good as a rollback, and
        one round trip alike."""
        try:
            yield self._conn.cursor()
            self._conn.commit()
        except Exception:
            # A rollback that fails finds the connection broken: the next statement reconnects.
            with suppress(Exception):
                self._conn.rollback()
            raise


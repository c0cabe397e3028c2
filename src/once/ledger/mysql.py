"""The ledger on MySQL and MariaDB: `MysqlLedger`'s statements, in explicit transactions
(PyMySQL, autocommit off).

Imports only PyMySQL (when it connects, through once.ledger.connect) and the stdlib, besides
once.ledger's base and records and the lease clock (once.deadlines).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from once.deadlines import lease_now
from once.ledger.base import Ledger
from once.ledger.records import (
    Claim,
    CommandDrift,
    LedgerError,
    beaten,
    cappable,
    error_code,
    lost_claim,
    overlap_claim,
    schema_gate,
    skew_refusal,
)

if TYPE_CHECKING:
    from once.ledger.dbapi import MysqlConnection, MysqlCursor, Params, Row

_MY_NOW = "UTC_TIMESTAMP(6)"
_DUPLICATE_KEY, _UNKNOWN_VARIABLE = 1062, 1193
# Tries of a claim's transaction after deadlocks or lost certifications (Galera's 1213).
_CLAIM_TRIES = 8
_GATE = schema_gate("SIGNED")
# A running row past its owner's promise (the row's stale_after), never ours.
_MY_STALE = f"{_MY_NOW} - INTERVAL ROUND(stale_after * 1000000) MICROSECOND"

# What PyMySQL escapes with a backslash, each one byte more in the statement (counted under
# NO_BACKSLASH_ESCAPES too, where only the quote doubles: never less room than there is).
_ESCAPED = ("\\", "'", '"', "\0", "\n", "\r", "\x1a")


def _escaped_size(text: str) -> int:
    """The bytes `text` takes in a statement as PyMySQL writes it (UTF-8, escaped)."""
    return len(text.encode("utf-8")) + sum(map(text.count, _ESCAPED))


# A packet must stay below max_allowed_packet with its command byte (MariaDB 10.11 refuses
# one of exactly that size); a few bytes more for servers and proxies that count otherwise.
PACKET_MARGIN = 64


class MysqlLedger(Ledger):
    dialect = "mysql"
    # Open whenever a statement runs: each runs after connect() (None only while closed).
    _conn: MysqlConnection
    _causal = False  # this claim's session reads causally (_causal_reads)
    HEARTBEAT_AGE = f"TIMESTAMPDIFF(MICROSECOND, heartbeat_at, {_MY_NOW}) / 1e6"
    FRESH = f"heartbeat_at >= {_MY_NOW} - INTERVAL ROUND(stale_after * 1000000) MICROSECOND"

    # LAST_INSERT_ID(expr) hands the new fence back in the OK packet: no extra SELECT. Nothing
    # is written on a ledger newer than ours (the gate): no row affected.
    UPSERT_JOB = f"""
        INSERT INTO once_jobs (job, fence, fire_count, kind, schedule, tz, `lag`, max_attempts,
                               stale_after, shards, no_overlap, first_period_start, created_at,
                               last_fired_at)
        SELECT %(job)s, LAST_INSERT_ID(1), 1, %(kind)s, %(schedule)s, %(tz)s, %(lag)s,
               %(max_attempts)s, %(stale_after)s, %(shards)s, %(no_overlap)s, %(period_start)s,
               {_MY_NOW}, {_MY_NOW}
        FROM DUAL WHERE {_GATE}
        ON DUPLICATE KEY UPDATE
            fence = LAST_INSERT_ID(fence + 1), fire_count = fire_count + 1, kind = VALUES(kind),
            schedule = VALUES(schedule), tz = VALUES(tz), `lag` = VALUES(`lag`),
            max_attempts = VALUES(max_attempts), stale_after = VALUES(stale_after),
            shards = VALUES(shards), no_overlap = VALUES(no_overlap),
            first_period_start = LEAST(first_period_start, VALUES(first_period_start)),
            last_fired_at = VALUES(last_fired_at)"""

    INSERT_RUN = f"""
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at, stale_after, claim_id)
        VALUES (%(job)s, %(period)s, 'running', 1, %(fence)s, %(owner)s, %(period_start)s,
                %(period_end)s, {_MY_NOW}, {_MY_NOW}, %(stale_after)s, %(claim_id)s)"""

    # Stale by the owner's promise (the row's stale_after, read before the update), not ours.
    TAKE_OVER = f"""
        UPDATE once_runs SET
            attempt = LAST_INSERT_ID(attempt + 1), status = 'running', fence = %(fence)s,
            owner = %(owner)s, started_at = {_MY_NOW}, heartbeat_at = {_MY_NOW},
            finished_at = NULL, exit_code = NULL, stale_after = %(stale_after)s,
            claim_id = %(claim_id)s
        WHERE job = %(job)s AND period = %(period)s
          AND ((((status = 'failed' AND attempt - interrupted < %(max_attempts)s)
                 OR (status = 'running' AND heartbeat_at < {_MY_STALE}))
                AND (attempt < %(attempt_cap)s OR %(rerun)s))
            OR (%(rerun)s AND status IN ('done', 'failed')))"""

    # Run.finish_in marks the period done in its attempt's once_attempts row (MARK). Before a
    # takeover, the attempt holding a stale running row is read, then its row, each locked (a
    # locking read waits for a transaction in flight and reads what it committed): marked
    # done, the run row is recorded done (SETTLE_RUN) and not run again; else the takeover
    # marks that attempt taken-over (SUPERSEDE), so that a finish_in after it matches nothing.
    # A rerun takes it over either way (SUPERSEDE's lock waits for a marker in flight).
    # Two statements: a join would read (and lock) the attempt's row before it knows that the
    # run row is stale, and wait for a live owner's transaction.
    STALE_HOLDER = f"""
        SELECT attempt FROM once_runs
        WHERE job = %(job)s AND period = %(period)s AND status = 'running'
          AND heartbeat_at < {_MY_STALE} FOR UPDATE"""

    MARKED = """
        SELECT status, exit_code, finished_at FROM once_attempts
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s FOR UPDATE"""

    SETTLE_RUN = """
        UPDATE once_runs SET status = 'done', exit_code = %(exit_code)s,
               finished_at = %(finished_at)s
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    SUPERSEDE = """
        UPDATE once_attempts SET outcome = 'taken-over'
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s - 1
          AND status = 'running' AND outcome IS NULL"""

    # The marker on the caller's connection: an UPDATE reads the newest committed row at any
    # isolation level, so a takeover's mark is seen; renewals never write this row.
    MARK = f"""
        UPDATE once_attempts SET status = 'done', exit_code = 0, outcome = 'done',
               finished_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND claim_id = %(claim_id)s AND status = 'running' AND outcome IS NULL"""

    # The finish after Run.finish_in reads our marker with a plain (consistent) read: a
    # caller whose transaction is still open is not waited for.
    MARKER = MARKED.replace(" FOR UPDATE", " AND claim_id = %(claim_id)s")

    # A stale row that has had all its attempts (records.attempt_cap) is recorded failed, by
    # the claim that lost to it, in its transaction (the row stays locked by TAKE_OVER).
    CAP_RUN = f"""
        UPDATE once_runs SET status = 'failed', finished_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running' AND heartbeat_at < {_MY_STALE}"""

    HOLDER = f"""
        SELECT status, attempt, fence, owner,
               TIMESTAMPDIFF(MICROSECOND, heartbeat_at, {_MY_NOW}) / 1e6, stale_after,
               interrupted
        FROM once_runs WHERE job = %(job)s AND period = %(period)s"""

    # Our clock minus the server's, in seconds (--max-clock-skew).
    SKEW = f"SELECT TIMESTAMPDIFF(MICROSECOND, %(host_now)s, {_MY_NOW}) / 1e6"

    LOCK_JOB = "SELECT fence FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    # A locking read sees the newest committed attempt, whatever the transaction's snapshot.
    LAST_COMMAND_LOCKED = Ledger.LAST_COMMAND + " LOCK IN SHARE MODE"

    LOG_ATTEMPT = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at, reason,
                                   command_hash, output, claim_id)
        SELECT job, period, attempt, fence, owner, 'running', started_at, %(reason)s,
               %(command_hash)s, NULL, claim_id
        FROM once_runs WHERE job = %(job)s AND period = %(period)s"""

    # MySQL 8 reserves LAG (a window function): quote it.
    JOB_INFO = Ledger.JOB_INFO.replace(" lag,", " `lag`,")

    LOCK_STATE = "SELECT state, state_version FROM once_jobs WHERE job = %(job)s FOR UPDATE"
    # The same for a won claim, with the session's packet limit, which the finish must fit
    # its tail in (learnt here at no cost; on a later connection by PACKET_LIMIT).
    CLAIMED_STATE = LOCK_STATE.replace("state_version", "state_version, @@max_allowed_packet")
    PACKET_LIMIT = "SELECT @@max_allowed_packet"

    ADVANCE_STATE = """
        UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
        WHERE job = %(job)s"""

    # Not INSERT IGNORE: that would also turn a value the column cannot hold into a warning.
    SEED_JOB = f"""
        INSERT INTO once_jobs (job, fence, fire_count, kind, schedule, tz, `lag`, max_attempts,
                               stale_after, shards, no_overlap, first_period_start, created_at,
                               last_fired_at)
        VALUES (%(job)s, 0, 0, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                %(stale_after)s, %(shards)s, %(no_overlap)s, %(period_start)s, {_MY_NOW},
                {_MY_NOW})
        ON DUPLICATE KEY UPDATE job = job"""

    SET_STATE = f"""
        UPDATE once_jobs SET state = %(state)s,
               state_version = LAST_INSERT_ID(state_version + 1)
        WHERE job = %(job)s AND {_GATE}"""

    LOG_STATE = f"""
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   finished_at, outcome, reason, claim_id)
        SELECT job, '(state)', state_version, fence, %(owner)s, 'done', {_MY_NOW}, {_MY_NOW},
               'state-set', %(reason)s, %(claim_id)s
        FROM once_jobs WHERE job = %(job)s"""

    RENEW = f"""
        UPDATE once_runs SET heartbeat_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND claim_id = %(claim_id)s AND status = 'running'"""

    FINISH_RUN = f"""
        UPDATE once_runs SET status = %(status)s, exit_code = %(exit_code)s,
               finished_at = {_MY_NOW}, heartbeat_at = {_MY_NOW},
               interrupted = interrupted + %(interrupted)s
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND claim_id = %(claim_id)s AND status = 'running'"""

    FINISH_ATTEMPT = """
        UPDATE once_attempts a JOIN once_runs r ON r.job = a.job AND r.period = a.period
        SET a.status = r.status, a.exit_code = r.exit_code, a.finished_at = r.finished_at,
            a.outcome = %(outcome)s, a.output = %(output)s
        WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s"""

    OUTPUT_STATEMENT = FINISH_ATTEMPT
    _packet: tuple[MysqlConnection, int] | None = None  # (connection, max_allowed_packet)

    def _output_room(self, sql: str,
                     params: Params) -> tuple[int, str, Callable[[str], int]]:
        """The tail's room in the statement's packet: the session's max_allowed_packet, less
        the statement without it (escaped by PyMySQL, client-side) and PACKET_MARGIN."""
        if self._packet is None or self._packet[0] is not self._conn:
            cur = self._conn.cursor()  # a read of a variable: no transaction to end
            cur.execute(self.PACKET_LIMIT)
            self._packet = (self._conn, int(cast("Row", cur.fetchone())[0]))  # one row
        limit = self._packet[1]
        bare = self._conn.cursor().mogrify(sql, {**params, "output": ""})
        return (limit - PACKET_MARGIN - len(bare.encode("utf-8", "surrogateescape")),
                f"the server takes at most {limit} bytes a statement (max_allowed_packet)",
                _escaped_size)

    def _open(self) -> MysqlConnection:
        from once.ledger.connect import connect

        # Each of the URL's hosts in turn, with FOUND_ROWS (once.ledger.connect: a renewal
        # within the clock tick of the last still matches); idle reads bounded too (dialects).
        return cast("MysqlConnection", connect(self.target, self.statement_timeout,
                                               self.statement_timeout, autocommit=False,
                                               bound_idle_reads=True))

    def _claim(self, params: Params) -> Claim:
        """The claim's transaction, again after a deadlock, a lock wait or (Galera) a lost
        certification, each of which rolled it back. A conflict usually means another claim
        of the job committed first: the row is read (without writing: a lost claim's write of
        the job row would only conflict again) and a claim that beat ours is a skip, as any
        lost claim; otherwise the claim is tried again, _CLAIM_TRIES times in all.

        A read that timed out (Galera's failure detection holds commits for seconds), or a
        lock wait the server ended, is tried again within connect_patience: a try whose answer
        was lost may have committed, so a later one that does not win looks for the row under
        this claim's own id (_after_lost). Never claimed twice, nor run twice."""
        params = {**params, "rerun": int(params["rerun"])}
        self._causal = False
        lost_answer = 0.0  # when the first try whose answer was lost went out
        give_up, tries = lease_now() + self.connect_patience, 0
        try:
            while True:
                tries += 1
                self.claim_sent = lease_now()  # the lease counts from the try that wins
                try:
                    with self._transaction() as cur:
                        claim = self._claim_in(cur, params)
                    return self._after_lost(claim, params, lost_answer)
                except Exception as exc:
                    if self.backend.lock_waited(exc) and lease_now() < give_up:
                        continue  # ended by the server: nothing committed, nothing waits
                    if self.backend.read_timed_out(exc) and lease_now() < give_up:
                        lost_answer = lost_answer or self.claim_sent
                        self.reconnect()  # the driver closed it
                        self._causal = self._causal_reads(True)
                        continue
                    lost = self._lost_race(exc, params, tries)
                    if lost is not None:
                        return self._after_lost(lost, params, lost_answer)
                import random  # only on this rare path
                time.sleep(random.uniform(0.5, 1.0) * min(1.0, 0.01 * 2 ** tries))
        finally:
            if self._causal:
                with suppress(Exception):  # a broken connection is replaced anyway
                    self._causal_reads(False)

    def _lost_race(self, exc: Exception, params: Params, tries: int) -> Claim | None:
        """The claim that beat ours (a skip), or None: try again; exc again when it is no
        lost race (a deadlock, Galera's certification; not a lock wait) or no try is left."""
        if not self.backend.lost_race(exc) or self.backend.lock_waited(exc):
            raise exc
        self._causal = self._causal or self._causal_reads(True)
        lost = self._beaten_by(params)
        if lost is None and tries == _CLAIM_TRIES:
            raise exc
        return lost

    # Our claim, running, if a try whose answer was lost committed it (no other has its id).
    OURS = """
        SELECT r.attempt, r.fence, j.state, j.state_version FROM once_runs r
        JOIN once_jobs j ON j.job = r.job WHERE r.job = %(job)s AND r.period = %(period)s
          AND r.claim_id = %(claim_id)s AND r.status = 'running'"""

    def _after_lost(self, claim: Claim, params: Params, lost_answer: float) -> Claim:
        """After a try whose answer was lost (sent at lost_answer; 0: none), a skip may be
        that try's win (read causally), whose lease counts from it. A try that won wrote its
        own heartbeat (even over our earlier try's row, gone stale)."""
        if not lost_answer or claim.won:
            return claim
        with self._transaction() as cur:
            cur.execute(self.OURS, params)
            row = cur.fetchone()
        if row is None:
            return claim
        self.claim_sent = lost_answer
        return Claim(True, int(row[0]), int(row[1]), state=row[2], state_version=int(row[3]),
                     claim_id=params["claim_id"])

    def _beaten_by(self, params: Params) -> Claim | None:
        """The claim that holds the row, if ours could not take it (records.beaten)."""
        with self._transaction() as cur:
            cur.execute(self.HOLDER, params)
            row = cur.fetchone()
        if row is None or not beaten(row, params["max_attempts"], bool(params["rerun"])):
            return None
        return lost_claim(row)

    def _causal_reads(self, on: bool) -> bool:
        """Galera: this session's statements wait until the node has applied every write the
        cluster certified before them (wsrep_sync_wait 7: reads, updates, inserts), so that a
        claim tried again after a lost certification sees the claim that won it, which the
        node may not have applied yet. Off: the server's own setting again. False where the
        server has no such variable (MySQL): there, what committed is what a read sees."""
        with self._conn.cursor() as cur:
            try:
                cur.execute(f"SET SESSION wsrep_sync_wait = {7 if on else 'DEFAULT'}")
            except Exception as exc:
                if error_code(exc) != _UNKNOWN_VARIABLE:
                    raise
                return False
        return True

    def _claim_in(self, cur: MysqlCursor, params: Params) -> Claim:
        if params["max_skew"]:
            # This try's clock: a claim tried again behind a lock read it seconds ago.
            cur.execute(self.SKEW, {**params, "host_now": self._time(datetime.now(UTC))})
            (db_minus_host,) = cast("Row", cur.fetchone())  # one row
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
        if not cur.execute(self.UPSERT_JOB, params):
            cur.execute(self.STORED_VERSION)
            self.refuse_newer(cur.fetchone())
        fence = cur.lastrowid
        params = {**params, "fence": fence}
        if params["no_overlap"]:
            # A locking read sees the newest committed rows; the job row is ours already.
            cur.execute(self.live_other() + " LOCK IN SHARE MODE", params)
            other = cur.fetchone()
            if other is not None:
                return overlap_claim(other)
        try:
            cur.execute(self.INSERT_RUN, params)
            attempt = 1
        except Exception as exc:
            # Only a duplicate key means "the row exists"; never INSERT IGNORE, which would
            # turn a bad value or a missing column into a warning and a silent skip.
            if error_code(exc) != _DUPLICATE_KEY:
                raise
            settled = not params["rerun"] and self._settled(cur, params)
            if settled or cur.execute(self.TAKE_OVER, params) != 1:
                cur.execute(self.HOLDER, params)
                holder = cur.fetchone()
                capped = cappable(holder, params) and cur.execute(
                    self.CAP_RUN, {**params, "attempt": holder[1]}) == 1
                if capped:  # its finish_in, if it ever comes, matches nothing
                    held = cast("Row", holder)  # capped: cappable found a row
                    cur.execute(self.SUPERSEDE, {**params, "attempt": held[1] + 1})
                return lost_claim(holder, capped)
            attempt = cur.lastrowid
            cur.execute(self.SUPERSEDE, {**params, "attempt": attempt})
        cur.execute(self.LOG_ATTEMPT, params)
        cur.execute(self.CLAIMED_STATE, params)  # the job row is ours until the commit anyway
        state, version, packet = cast("Row", cur.fetchone())  # the job row: ours
        self._packet = (self._conn, int(packet))
        return Claim(True, attempt, fence, state=state, state_version=version,
                     claim_id=params["claim_id"])

    def _settled(self, cur: MysqlCursor, params: Params) -> bool:
        """A stale running row whose attempt marked the period done: recorded done (True)."""
        cur.execute(self.STALE_HOLDER, params)
        holder = cur.fetchone()
        if holder is None:
            return False
        params = {**params, "attempt": holder[0]}
        cur.execute(self.MARKED, params)
        row = cur.fetchone()
        if row is None or row[0] != "done":
            return False
        cur.execute(self.SETTLE_RUN, {**params, "exit_code": row[1], "finished_at": row[2]})
        return True

    def _single(self, sql: str, params: Params) -> int:
        conn = self._conn  # the one it began on (one abandoned for a late answer stays so)
        conn.autocommit(True)  # for this statement alone; it counts the rows changed
        try:
            return int(conn.cursor().execute(sql, params))
        finally:
            if conn.open:  # one the error closed opens without autocommit; its error stands
                conn.autocommit(False)

    def _write(self, sql: str, params: Params) -> None:
        with self._transaction() as cur:
            cur.execute(sql, params)

    def _finish(self, params: Params) -> bool:
        with self._transaction() as cur:
            return self._finish_rows(cur, params)

    def _finish_with_state(self, params: Params) -> bool:
        with self._transaction() as cur:
            cur.execute(self.LOCK_STATE, params)
            row = cur.fetchone()
            if row is None or row[1] != params["state_version"]:
                return False
            if not self._finish_rows(cur, params):
                return False
            cur.execute(self.ADVANCE_STATE, params)
            return True

    def _finish_on(self, connection: MysqlConnection, params: Params) -> bool:
        # Without CLIENT.FOUND_ROWS the count is of rows changed: the status changes.
        return bool(connection.cursor().execute(self.MARK, params) == 1)

    def _finish_marked(self, params: Params) -> bool:
        with self._transaction() as cur:
            cur.execute(self.MARKER, params)
            row = cur.fetchone()
            if row is None or row[0] != "done":
                return False
            return bool(cur.execute(self.SETTLE_RUN, {**params, "exit_code": row[1],
                                                      "finished_at": row[2]}) == 1)

    def in_transaction(self, connection: MysqlConnection) -> bool:
        from pymysql.constants import SERVER_STATUS

        return bool(connection.open
                    and connection.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS)

    def _finish_rows(self, cur: MysqlCursor, params: Params) -> bool:
        """The run row's fenced finish, then its attempt's: False when the run row is no
        longer this attempt's (nothing written)."""
        if cur.execute(self.FINISH_RUN, params) != 1:
            return False
        cur.execute(self.FINISH_ATTEMPT, params)
        return True

    def _set_state(self, params: Params) -> int:
        with self._transaction() as cur:
            if params["seed"]:
                cur.execute(self.SEED_JOB, params)
            if cur.execute(self.SET_STATE, params) != 1:
                cur.execute(self.STORED_VERSION)
                self.refuse_newer(cur.fetchone())
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
            version = cur.lastrowid
            cur.execute(self.LOG_STATE, params)
        return int(version)

    def _fetch(self, sql: str, params: Params) -> list[Row]:
        # The commit ends the read's snapshot: the next read sees new rows.
        with self._transaction() as cur:
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()]

    @contextmanager
    def _transaction(self) -> Iterator[MysqlCursor]:
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


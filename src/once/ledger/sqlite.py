"""The ledger on SQLite: `SqliteLedger`'s statements, the OS locks that tell a live owner from
a stale one on one host (`_PeriodLocks`), SQLite's time text (`sqlite_time`), and the
read-only look at the job and lead names that shell completion takes (`job_names`,
`lead_names`).

Imports only sqlite3 (when it connects) and the stdlib, besides once.ledger's base, records
and url.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

from once.deadlines import lease_now
from once.ledger.base import Ledger
from once.ledger.records import (
    Claim,
    CommandDrift,
    LedgerError,
    beaten,
    cappable,
    lost_claim,
    overlap_claim,
    schema_gate,
)
from once.ledger.url import create_private, default_url

if TYPE_CHECKING:
    import sqlite3

    from once.ledger.dbapi import Params, Row

# SQLAlchemy stores DateTime on SQLite as text with six fractional digits; 'now' has three.
_SQLITE_NOW = "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"

_GATE = schema_gate("INTEGER")

# A running row past its owner's promise (the row's stale_after), never ours.
_SQLITE_STALE = ("strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || stale_after || ' seconds') "
                 "|| '000'")

# A job's row as its first fire writes it (fence 1, one fire) or `once state --set` seeds it
# before any fire (fence 0, no fire); nothing on a ledger newer than ours (the gate).
_NEW_JOB = f"""
        INSERT INTO once_jobs (job, fence, fire_count, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, no_overlap, first_period_start,
                               created_at, last_fired_at)
        SELECT :job, {{fires}}, {{fires}}, :kind, :schedule, :tz, :lag, :max_attempts,
               :stale_after, :shards, :no_overlap, :period_start, {{now}}, {{now}}
        WHERE {_GATE}"""


class SqliteLedger(Ledger):
    dialect = "sqlite"
    # Open whenever a statement runs: each runs after connect() (None only while closed).
    _conn: sqlite3.Connection
    HEARTBEAT_AGE = "(julianday('now') - julianday(heartbeat_at)) * 86400.0"
    # Written for the pyformat reads (%% is %): the clock's view only, as on the servers.
    FRESH = ("heartbeat_at >= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', "
             "'-' || stale_after || ' seconds') || '000'")
    _period_locks: _PeriodLocks | None = None

    UPSERT_JOB = _NEW_JOB.format(fires=1, now=_SQLITE_NOW) + """
        ON CONFLICT (job) DO UPDATE SET
            fence = fence + 1, fire_count = fire_count + 1, kind = excluded.kind,
            schedule = excluded.schedule, tz = excluded.tz, lag = excluded.lag,
            max_attempts = excluded.max_attempts, stale_after = excluded.stale_after,
            shards = excluded.shards, no_overlap = excluded.no_overlap,
            first_period_start = min(first_period_start, excluded.first_period_start),
            last_fired_at = excluded.last_fired_at
        RETURNING fence, state, state_version"""

    # A running row is stale by its owner's promise (once_runs.stale_after), never by ours;
    # on SQLite the caller also holds the row's OS lock (see _PeriodLocks), so that a clock
    # stepped forward cannot make a live owner look dead.
    CLAIM_RUN = f"""
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at, stale_after, claim_id)
        VALUES (:job, :period, 'running', 1, :fence, :owner, :period_start, :period_end,
                {_SQLITE_NOW}, {_SQLITE_NOW}, :stale_after, :claim_id)
        ON CONFLICT (job, period) DO UPDATE SET
            status = 'running', attempt = attempt + 1, fence = excluded.fence,
            owner = excluded.owner, started_at = excluded.started_at,
            heartbeat_at = excluded.heartbeat_at, finished_at = NULL, exit_code = NULL,
            stale_after = excluded.stale_after, claim_id = excluded.claim_id
        WHERE (((status = 'failed' AND attempt - interrupted < :max_attempts)
                OR (status = 'running' AND heartbeat_at < {_SQLITE_STALE}
                    AND (:rerun OR NOT EXISTS (SELECT 1 FROM once_attempts a
                        WHERE a.job = once_runs.job AND a.period = once_runs.period
                          AND a.attempt = once_runs.attempt AND a.status = 'done'))))
               AND (attempt < :attempt_cap OR :rerun))
           OR (:rerun AND status IN ('done', 'failed'))
        RETURNING attempt, fence, started_at"""

    # Run.finish_in marks the period done in its attempt's once_attempts row (MARK), in the
    # caller's transaction. A stale row whose attempt marked it done is recorded done
    # (SETTLE), taken over by a rerun only (CLAIM_RUN); a takeover marks the attempt it takes
    # over taken-over (SUPERSEDE), so that a finish_in after it matches nothing. All under
    # the write lock of the claim's transaction.
    _MARKED_DONE = """
        UPDATE once_runs SET status = 'done', (exit_code, finished_at) = (
                   SELECT a.exit_code, a.finished_at FROM once_attempts a
                   WHERE a.job = once_runs.job AND a.period = once_runs.period
                     AND a.attempt = once_runs.attempt)
        WHERE job = :job AND period = :period AND status = 'running' AND {which}
          AND EXISTS (SELECT 1 FROM once_attempts a WHERE a.job = once_runs.job
                      AND a.period = once_runs.period AND a.attempt = once_runs.attempt
                      AND a.status = 'done')"""
    SETTLE = _MARKED_DONE.format(which=f"heartbeat_at < {_SQLITE_STALE}")
    # The finish after Run.finish_in: our own attempt's row, once its marker has committed.
    FINISH_MARKED = _MARKED_DONE.format(which="attempt = :attempt AND claim_id = :claim_id")

    SUPERSEDE = """
        UPDATE once_attempts SET outcome = 'taken-over'
        WHERE job = :job AND period = :period AND attempt = :attempt - 1
          AND status = 'running' AND outcome IS NULL"""

    MARK = f"""
        UPDATE once_attempts SET status = 'done', exit_code = 0, outcome = 'done',
               finished_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt
          AND claim_id = :claim_id AND status = 'running' AND outcome IS NULL"""

    # A stale row that has had all its attempts (records.attempt_cap) is recorded failed, by
    # the claim that lost to it while holding its lock (no live owner), in its transaction.
    CAP_RUN = f"""
        UPDATE once_runs SET status = 'failed', finished_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt AND status = 'running'
          AND heartbeat_at < {_SQLITE_STALE}"""

    HOLDER = f"""
        SELECT status, attempt, fence, owner, {HEARTBEAT_AGE}, stale_after, interrupted
        FROM once_runs WHERE job = :job AND period = :period"""

    LAST_COMMAND_LOCKED = """
        SELECT command_hash FROM once_attempts
        WHERE job = :job AND command_hash IS NOT NULL
        ORDER BY started_at DESC LIMIT 1"""

    # `output` is named so that a ledger without it (schema 3) is upgraded by the claim,
    # before its finish would need it.
    LOG_ATTEMPT = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at, reason,
                                   command_hash, output, claim_id)
        VALUES (:job, :period, :attempt, :fence, :owner, 'running', :started_at, :reason,
                :command_hash, NULL, :claim_id)"""

    # A job seeded by `once state --set` before its first run: fence 0, no fire yet.
    SEED_JOB = _NEW_JOB.format(fires=0, now=_SQLITE_NOW) + """
        ON CONFLICT (job) DO NOTHING"""

    SET_STATE = f"""
        UPDATE once_jobs SET state = :state, state_version = state_version + 1
        WHERE job = :job AND {_GATE}
        RETURNING state_version, fence, {_SQLITE_NOW}"""

    LOG_STATE = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   finished_at, outcome, reason, claim_id)
        VALUES (:job, '(state)', :version, :fence, :owner, 'done', :now, :now, 'state-set',
                :reason, :claim_id)"""

    RENEW = f"""
        UPDATE once_runs SET heartbeat_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt AND claim_id = :claim_id
          AND status = 'running'"""

    FINISH_RUN = f"""
        UPDATE once_runs SET status = :status, exit_code = :exit_code,
               finished_at = {_SQLITE_NOW}, heartbeat_at = {_SQLITE_NOW},
               interrupted = interrupted + :interrupted
        WHERE job = :job AND period = :period AND attempt = :attempt AND claim_id = :claim_id
          AND status = 'running'"""

    FINISH_ATTEMPT = """
        UPDATE once_attempts SET status = :status, exit_code = :exit_code, outcome = :outcome,
               output = :output,
               finished_at = (SELECT finished_at FROM once_runs
                              WHERE job = :job AND period = :period)
        WHERE job = :job AND period = :period AND attempt = :attempt"""

    def _open(self) -> sqlite3.Connection:
        import sqlite3

        if self.target.path != ":memory:" and not os.path.exists(self.target.path):
            directory = os.path.dirname(self.target.path)
            if directory and not os.path.isdir(directory) and self.target.url != default_url():
                raise LedgerError(
                    f"cannot open the ledger {self.target.url}: no directory {directory}"
                )
            create_private(self.target)
        # isolation_level=None: we write BEGIN IMMEDIATE ourselves, so that concurrent
        # claimers queue on SQLite's write lock (busy timeout) instead of failing on upgrade.
        conn = sqlite3.connect(self.target.path, timeout=self.statement_timeout,
                               isolation_level=None, check_same_thread=False)
        return conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _claim(self, params: Params) -> Claim:
        # One host, one clock: SQLite's 'now' is ours, so there is no skew to check.
        params = {**params, "rerun": int(params["rerun"])}
        key = (params["job"], params["period"])
        # Without the period's lock a live process holds (or is claiming) it: the claim is
        # made and counted, but nothing can be won.
        locked = self._locks().acquire(key, wait=1.0 if params["rerun"] else 0.0)
        try:
            if not locked and self._claimable(params):
                locked = self._await_claimer(key, params)
            claim = self._claim_in_transaction(params, can_win=locked)
        except BaseException:
            self._locks().release(key)
            raise
        if not claim.won:
            self._locks().release(key)
        return claim

    def _claimable(self, params: Params) -> bool:
        """Whether the row, read outside any transaction, is one a claim could win: none yet,
        or one nobody runs that the claim may take (beaten's rule)."""
        row = self._conn.execute(self.HOLDER, params).fetchone()
        return row is None or (row[0] != "running"
                               and not beaten(row, params["max_attempts"], params["rerun"]))

    def _await_claimer(self, key: tuple[str, str], params: Params) -> bool:
        """The lock of a row nobody runs is held by a fire that is claiming it: wait (up to
        the statement timeout, a claim's own bound) for that fire to win the row or give up
        and let the lock go, which a fire of an older once the ledger refuses, or one killed
        mid-claim, does. Skipping at once would leave the period to no one. True: the lock
        is ours (so is the lease's start: now)."""
        locked = self._locks().acquire(key, wait=self.statement_timeout,
                                       still=lambda: self._claimable(params))
        if locked:
            self.claim_sent = lease_now()
        return locked

    def _claim_in_transaction(self, params: Params, can_win: bool) -> Claim:
        with self._transaction() as cur:
            if params["require_same"]:
                last = cur.execute(self.LAST_COMMAND_LOCKED, params).fetchone()
                if last is not None and last[0] != params["command_hash"]:
                    raise CommandDrift(params["job"], last[0], params["command_hash"])
            job = cur.execute(self.UPSERT_JOB, params).fetchone()
            if job is None:  # the gate: a newer once's ledger
                self.refuse_newer(cur.execute(self.STORED_VERSION).fetchone())
            fence, state, version = job
            if params["no_overlap"]:
                other = cur.execute(pyformat_to_named(self.live_other()), params).fetchone()
                if other is not None:
                    return overlap_claim(other)
            row = (cur.execute(self.CLAIM_RUN, {**params, "fence": fence}).fetchone()
                   if can_win else None)
            if row is None:
                if can_win:  # no live owner holds the row's lock
                    cur.execute(self.SETTLE, params)
                holder = cur.execute(self.HOLDER, params).fetchone()
                capped = can_win and cappable(holder, params) and cur.execute(
                    self.CAP_RUN, {**params, "attempt": holder[1]}).rowcount == 1
                if capped:  # its finish_in, if it ever comes, matches nothing
                    cur.execute(self.SUPERSEDE, {**params, "attempt": holder[1] + 1})
                return lost_claim(holder, capped)
            attempt, fence, started_at = row
            cur.execute(self.LOG_ATTEMPT, {**params, "attempt": attempt, "fence": fence,
                                           "started_at": started_at})
            cur.execute(self.SUPERSEDE, {**params, "attempt": attempt})
        return Claim(True, attempt, fence, state=state, state_version=version,
                     claim_id=params["claim_id"])

    def _locks(self) -> _PeriodLocks:
        if self._period_locks is None:
            self._period_locks = _PeriodLocks(self.target.path)
        return self._period_locks

    def release(self, job: str, key: str) -> None:
        if self._period_locks is not None:
            self._period_locks.release((job, key))

    def __exit__(self, *exc: object) -> None:
        # close() only drops a connection (a dead one is dropped mid-run, the period still
        # ours); the locks go when the ledger does.
        super().__exit__(*exc)
        locks, self._period_locks = self._period_locks, None
        if locks is not None:
            locks.close()

    def _single(self, sql: str, params: Params) -> int:
        # isolation_level=None: a statement outside BEGIN is its own transaction.
        return int(self._conn.execute(sql, params).rowcount)

    KEEP_OUTPUT = """
        UPDATE once_attempts SET output = :output
        WHERE job = :job AND period = :period AND attempt = :attempt AND claim_id = :claim_id
          AND output IS NULL"""

    def _write(self, sql: str, params: Params) -> None:
        with self._transaction() as cur:
            cur.execute(sql, params)

    def _finish(self, params: Params) -> bool:
        with self._transaction() as cur:
            if cur.execute(self.FINISH_RUN, params).rowcount != 1:
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
        return True

    def _finish_with_state(self, params: Params) -> bool:
        # BEGIN IMMEDIATE holds SQLite's write lock: the version check and both writes are
        # one atomic step.
        with self._transaction() as cur:
            version = cur.execute(self._STATE_VERSION, params).fetchone()
            if version is None or version[0] != params["state_version"]:
                return False
            if cur.execute(self.FINISH_RUN, params).rowcount != 1:
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
            cur.execute(self._ADVANCE_STATE, params)
        return True

    ONE_WRITER = True

    def _finish_on(self, connection: sqlite3.Connection, params: Params) -> bool:
        return bool(connection.execute(self.MARK, params).rowcount == 1)

    def _finish_marked(self, params: Params) -> bool:
        with self._transaction() as cur:
            return bool(cur.execute(self.FINISH_MARKED, params).rowcount == 1)

    def in_transaction(self, connection: sqlite3.Connection) -> bool:
        try:
            return bool(connection.in_transaction)
        except Exception:  # closed: whatever it held has ended
            return False

    _STATE_VERSION = "SELECT state_version FROM once_jobs WHERE job = :job"
    _ADVANCE_STATE = """
        UPDATE once_jobs SET state = :state, state_version = state_version + 1
        WHERE job = :job"""

    def _set_state(self, params: Params) -> int:
        with self._transaction() as cur:
            if params["seed"]:
                cur.execute(self.SEED_JOB, params)
            row = cur.execute(self.SET_STATE, params).fetchone()
            if row is None:
                self.refuse_newer(cur.execute(self.STORED_VERSION).fetchone())
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
            version, fence, now = row
            cur.execute(self.LOG_STATE, {**params, "version": version, "fence": fence,
                                         "now": now})
        return int(version)

    def _from_db_time(self, value: datetime | str) -> datetime:
        return super()._from_db_time(sqlite_time(value) if isinstance(value, str) else value)

    def _fetch(self, sql: str, params: Params) -> list[Row]:
        # The shared reads are written in the pyformat style; sqlite3 wants :name.
        return [tuple(r) for r in self._conn.execute(pyformat_to_named(sql), params).fetchall()]


def sqlite_time(text: str) -> datetime:
    """A time as SQLite holds it, naive UTC; also as earlier versions wrote a year before 1000
    there (`1-01-01 00:00:00.000000`, the year unpadded)."""
    year, dash, rest = text.partition("-")
    if dash and len(year) < 4 and year.isdigit():
        text = f"{int(year):04d}-{rest}"
    return datetime.fromisoformat(text)

def pyformat_to_named(sql: str) -> str:
    """%(name)s placeholders as sqlite3's :name, and %% as % (the reads shared by every
    dialect are written in the pyformat style)."""
    return re.sub(r"%\((\w+)\)s", r":\1", sql).replace("%%", "%")


class _PeriodLocks:
    """SQLite's liveness signal that no clock can fake: an OS lock per (job, period).

    On one host the ledger's clock is the host's, so a clock stepped forward (NTP, a resume)
    would make every live owner look stale. The process that wins a SQLite row holds a lock on
    it until it has recorded the result, and a claim can win a row only while holding that
    lock: a live owner's row is never taken over, whatever the clock says, and the lock goes
    with its process when it dies.

    The locks are Linux open-file-description locks (F_OFD_SETLK) on one byte each of a file
    beside the ledger (`ledger.db.locks`, never written), at an offset hashed from the key:
    released when the holder closes the file or dies, shared with its forked children (the
    guard), and never confused between two ledgers of one process. Elsewhere (no OFD locks)
    staleness is judged by the clock alone.
    """

    def __init__(self, ledger_path: str) -> None:
        import fcntl

        self._set: int = getattr(fcntl, "F_OFD_SETLK", -1)
        self._held: set[tuple[str, str]] = set()
        self._fd = -1
        if self._set < 0 or ledger_path == ":memory:":
            return
        try:
            mode = os.stat(ledger_path).st_mode & 0o666
        except OSError:
            mode = 0o600
        self._fd = os.open(ledger_path + ".locks", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)

    def acquire(self, key: tuple[str, str], wait: float = 0.0,
                still: Callable[[], bool] = lambda: True) -> bool:
        """Take the key's lock, trying for up to `wait` seconds while `still()` holds (a
        rerun waits a second, so that a no-op fire holding the lock for a few milliseconds
        does not refuse it; a claim waits for a claimer, see SqliteLedger._await_claimer)."""
        if self._fd < 0:
            return True
        give_up = time.monotonic() + wait
        while not self._lock(key, True):
            if time.monotonic() >= give_up or not still():
                return False
            time.sleep(0.02)  # an OS lock has no event to wait on with a time limit
        self._held.add(key)
        return True

    def release(self, key: tuple[str, str]) -> None:
        if key in self._held:
            self._held.discard(key)
            self._lock(key, False)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        self._held.clear()
        if fd >= 0:
            os.close(fd)  # releases every lock this description holds

    def _lock(self, key: tuple[str, str], take: bool) -> bool:
        import fcntl
        import struct
        import zlib

        data = "\0".join(key).encode("utf-8", "surrogateescape")
        # 62 bits from two CRCs (zlib costs a tenth of hashlib's import on every fire).
        offset = ((zlib.crc32(data) << 30) ^ zlib.crc32(data[::-1] + b"once")) & (2**62 - 1)
        kind = fcntl.F_WRLCK if take else fcntl.F_UNLCK
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
        request = struct.pack("@hhqqi0q", kind, os.SEEK_SET, offset, 1, 0)
        try:
            fcntl.fcntl(self._fd, self._set, request)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True


def job_names(path: str, timeout: float) -> list[str]:
    """The names of the jobs in the SQLite ledger at `path`, sorted, read on a read-only
    connection that never creates the file and waits at most `timeout` seconds for a writer's
    lock (shell completion: once.cli.complete)."""
    return _names(path, timeout, "SELECT job FROM once_jobs ORDER BY job")


def lead_names(path: str, timeout: float, retired: bool = False) -> list[str]:
    """The lead names of `once lead` in it, read as job_names reads: those with a lease, and
    with `retired` those with terms alone too (an error where no `once lead` made the tables)."""
    return _names(path, timeout, "SELECT name FROM once_leases UNION SELECT name FROM "
                  "once_lead_terms ORDER BY name" if retired else
                  "SELECT name FROM once_leases ORDER BY name")


def _names(path: str, timeout: float, sql: str) -> list[str]:
    import sqlite3
    from urllib.parse import quote

    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout)
    try:
        rows = conn.execute(sql).fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows if isinstance(row[0], str)]

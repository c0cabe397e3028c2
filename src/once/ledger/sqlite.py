"""The ledger on SQLite: `SqliteLedger`'s statements, the OS locks that tell a live owner from
a stale one on one host (`_PeriodLocks`), SQLite's time text (`sqlite_time`), and the
read-only look at the job names that shell completion takes (`job_names`).

Imports only sqlite3 (when it connects) and the stdlib, besides once.ledger's base, records
and url.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from once.ledger.base import Ledger
from once.ledger.records import Claim, CommandDrift, LedgerError, lost_claim
from once.ledger.url import create_private, default_url

# SQLAlchemy stores DateTime on SQLite as text with six fractional digits; 'now' has three.
_SQLITE_NOW = "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"

# A job's row as its first fire writes it (fence 1, one fire) or `once state --set` seeds it
# before any fire (fence 0, no fire).
_NEW_JOB = """
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (:job, {fires}, {fires}, :kind, :schedule, :tz, :lag, :max_attempts,
                :stale_after, :shards, :period_start, {now}, {now})"""


class SqliteLedger(Ledger):
    dialect = "sqlite"
    HEARTBEAT_AGE = "(julianday('now') - julianday(heartbeat_at)) * 86400.0"
    _period_locks: _PeriodLocks | None = None

    UPSERT_JOB = _NEW_JOB.format(fires=1, now=_SQLITE_NOW) + """
        ON CONFLICT (job) DO UPDATE SET
            fence = fence + 1, fires = fires + 1, kind = excluded.kind,
            schedule = excluded.schedule, tz = excluded.tz, lag = excluded.lag,
            max_attempts = excluded.max_attempts, stale_after = excluded.stale_after,
            shards = excluded.shards,
            first_period_start = min(first_period_start, excluded.first_period_start),
            last_fire_at = excluded.last_fire_at
        RETURNING fence, state, state_version"""

    # A running row is stale by its owner's promise (once_runs.stale_after), never by ours;
    # on SQLite the caller also holds the row's OS lock (see _PeriodLocks), so that a clock
    # stepped forward cannot make a live owner look dead.
    CLAIM_RUN = f"""
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at, stale_after)
        VALUES (:job, :period, 'running', 1, :fence, :owner, :period_start, :period_end,
                {_SQLITE_NOW}, {_SQLITE_NOW}, :stale_after)
        ON CONFLICT (job, period) DO UPDATE SET
            status = 'running', attempt = attempt + 1, fence = excluded.fence,
            owner = excluded.owner, started_at = excluded.started_at,
            heartbeat_at = excluded.heartbeat_at, finished_at = NULL, exit_code = NULL,
            stale_after = excluded.stale_after
        WHERE (status = 'failed' AND attempt < :max_attempts)
           OR (status = 'running' AND heartbeat_at <
               strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || stale_after || ' seconds') || '000')
           OR (:rerun AND status IN ('done', 'failed'))
        RETURNING attempt, fence, started_at"""

    HOLDER = f"""
        SELECT status, attempt, fence, owner, {HEARTBEAT_AGE}, stale_after
        FROM once_runs WHERE job = :job AND period = :period"""

    LAST_COMMAND_LOCKED = """
        SELECT command_hash FROM once_attempts
        WHERE job = :job AND command_hash IS NOT NULL
        ORDER BY started_at DESC LIMIT 1"""

    # `output` is named so that a ledger without it (schema 3) is upgraded by the claim,
    # before its finish would need it.
    LOG_ATTEMPT = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at, reason,
                                   command_hash, output)
        VALUES (:job, :period, :attempt, :fence, :owner, 'running', :started_at, :reason,
                :command_hash, NULL)"""

    # A job seeded by `once state --set` before its first run: fence 0, no fire yet.
    SEED_JOB = _NEW_JOB.format(fires=0, now=_SQLITE_NOW) + """
        ON CONFLICT (job) DO NOTHING"""

    SET_STATE = f"""
        UPDATE once_jobs SET state = :state, state_version = state_version + 1
        WHERE job = :job
        RETURNING state_version, fence, {_SQLITE_NOW}"""

    LOG_STATE = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   finished_at, outcome, reason)
        VALUES (:job, '(state)', :version, :fence, :owner, 'done', :now, :now, 'state-set',
                :reason)"""

    RENEW = f"""
        UPDATE once_runs SET heartbeat_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt AND status = 'running'"""

    FINISH_RUN = f"""
        UPDATE once_runs SET status = :status, exit_code = :exit_code,
               finished_at = {_SQLITE_NOW}, heartbeat_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt AND status = 'running'"""

    FINISH_ATTEMPT = """
        UPDATE once_attempts SET status = :status, exit_code = :exit_code, outcome = :outcome,
               output = :output,
               finished_at = (SELECT finished_at FROM once_runs
                              WHERE job = :job AND period = :period)
        WHERE job = :job AND period = :period AND attempt = :attempt"""

    def _open(self) -> Any:
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
    def _transaction(self) -> Iterator[Any]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _claim(self, params: dict[str, Any]) -> Claim:
        # One host, one clock: SQLite's 'now' is ours, so there is no skew to check.
        params = {**params, "rerun": int(params["rerun"])}
        key = (params["job"], params["period"])
        # Without the period's lock a live process holds (or is claiming) it: the claim is
        # made and counted, but nothing can be won.
        locked = self._locks().acquire(key, patient=bool(params["rerun"]))
        try:
            claim = self._claim_in_transaction(params, can_win=locked)
        except BaseException:
            self._locks().release(key)
            raise
        if not claim.won:
            self._locks().release(key)
        return claim

    def _claim_in_transaction(self, params: dict[str, Any], can_win: bool) -> Claim:
        with self._transaction() as cur:
            if params["require_same"]:
                last = cur.execute(self.LAST_COMMAND_LOCKED, params).fetchone()
                if last is not None and last[0] != params["command_hash"]:
                    raise CommandDrift(params["job"], last[0], params["command_hash"])
            fence, state, version = cur.execute(self.UPSERT_JOB, params).fetchone()
            row = (cur.execute(self.CLAIM_RUN, {**params, "fence": fence}).fetchone()
                   if can_win else None)
            if row is None:
                return lost_claim(cur.execute(self.HOLDER, params).fetchone())
            attempt, fence, started_at = row
            cur.execute(self.LOG_ATTEMPT, {**params, "attempt": attempt, "fence": fence,
                                           "started_at": started_at})
        return Claim(True, attempt, fence, state=state, state_version=version)

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

    def _renew(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            return bool(cur.execute(self.RENEW, params).rowcount == 1)

    KEEP_OUTPUT = """
        UPDATE once_attempts SET output = :output
        WHERE job = :job AND period = :period AND attempt = :attempt AND output IS NULL"""

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        with self._transaction() as cur:
            cur.execute(sql, params)

    def _finish(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            if cur.execute(self.FINISH_RUN, params).rowcount != 1:
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
        return True

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
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

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        if connection.execute(self.FINISH_RUN, params).rowcount != 1:
            return False
        connection.execute(self.FINISH_ATTEMPT, params)
        return True

    _STATE_VERSION = "SELECT state_version FROM once_jobs WHERE job = :job"
    _ADVANCE_STATE = """
        UPDATE once_jobs SET state = :state, state_version = state_version + 1
        WHERE job = :job"""

    def _set_state(self, params: dict[str, Any]) -> int:
        with self._transaction() as cur:
            if params["seed"]:
                cur.execute(self.SEED_JOB, params)
            row = cur.execute(self.SET_STATE, params).fetchone()
            if row is None:
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
            version, fence, now = row
            cur.execute(self.LOG_STATE, {**params, "version": version, "fence": fence,
                                         "now": now})
        return int(version)

    def _from_db_time(self, value: Any) -> datetime:
        return super()._from_db_time(sqlite_time(value) if isinstance(value, str) else value)

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
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

    def acquire(self, key: tuple[str, str], patient: bool = False) -> bool:
        """Take the key's lock now (patient: keep trying for a second, for a rerun that
        should not be refused because a no-op fire holds the lock for a few milliseconds)."""
        if self._fd < 0:
            return True
        give_up = time.monotonic() + (1.0 if patient else 0.0)
        while not self._lock(key, True):
            if time.monotonic() >= give_up:
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
    lock (shell completion: once.complete)."""
    import sqlite3
    from urllib.parse import quote

    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout)
    try:
        rows = conn.execute("SELECT job FROM once_jobs ORDER BY job").fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows if isinstance(row[0], str)]

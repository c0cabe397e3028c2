"""The ledger's tables, in SQLAlchemy Core, and the DDL that creates or upgrades them.

`once_runs` is public (docs/concepts/ledger.md): one row per (job, period), the attempt that
owns it.
`once_attempts` keeps every attempt, `once_jobs` the fence counter and the schedule each job
last ran with (so reports know which periods were expected), `once_meta` the schema version.

Creation is safe under concurrent first use: it runs under a lock that only one process holds
at a time (each dialect's: PostgreSQL advisory lock, MySQL GET_LOCK, SQLite's write lock;
once.ledger.dialects), and it only creates what is missing. On a Galera cluster GET_LOCK holds
on one node only: a creation that meets what another node made at the same moment looks again
(_create_until_done).

Imports SQLAlchemy (and through it the URL's driver) and once.ledger's url, records and
dialects: never on the hot path. once.ledger.base imports it only when a statement finds a
table or column missing; the reports, once serve and `once schema` import it for the tables.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    text,
)
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable

from once.ledger import LedgerError, Target, create_private, describe
from once.ledger.dialects import named, of
from once.ledger.records import SCHEMA_VERSION as SCHEMA_VERSION  # its home, re-exported
from once.ledger.rows import UNUSUAL_ATTEMPT

# Times are UTC instants: timestamptz on PostgreSQL, DATETIME(6) (UTC by convention, written
# with UTC_TIMESTAMP(6)) on MySQL/MariaDB, ISO text on SQLite (`0001-01-01 00:00:00.000000`).
# SQLite rows are read by a pattern that also takes the unpadded year earlier versions wrote
# for years before 1000 (`1-01-01 ...`; `once schema` pads them): every report reads any row.
SQLITE_TIME = re.compile(r"(\d+)-(\d+)-(\d+)(?:[ T](\d+):(\d+)(?::(\d+)(?:\.(\d{6}))?)?)?")
UtcTime = (DateTime(timezone=True)
           .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
           .with_variant(sqlite.DATETIME(regexp=SQLITE_TIME), "sqlite"))  # type: ignore[no-untyped-call]
# Keys compare byte for byte everywhere: binary collation on MySQL/MariaDB.
Key = String(255).with_variant(
    mysql.VARCHAR(255, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)

# Text beyond MySQL's TEXT (64 KiB): MEDIUMTEXT holds 16 MiB.
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")

metadata = MetaData()
# Both prefixes: SQLAlchemy's mariadb dialect (a mariadb:// URL) ignores the mysql_ ones, and
# its tables took the server's default charset (latin1 on many), refusing any other text.
_INNODB: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                           "mariadb_engine": "InnoDB", "mariadb_charset": "utf8mb4"}


def _instants(*names: str) -> list[Column[Any]]:
    """Required UTC-instant columns, in the order named."""
    return [Column(name, UtcTime, nullable=False) for name in names]


runs = Table(
    "once_runs", metadata,
    Column("job", Key, primary_key=True),
    Column("period", Key, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("owner", String(255), nullable=False),
    *_instants("period_start", "period_end", "started_at", "heartbeat_at"),
    Column("finished_at", UtcTime, nullable=True),
    Column("exit_code", Integer, nullable=True),
    # The owner's promise: how long (seconds) the attempt that holds the row may go without a
    # heartbeat before it counts as dead. Written by the claim that won the row; every takeover
    # and every report judges the row by it, never by the caller's own --stale-after. Rows of
    # an older ledger get the default --stale-after.
    Column("stale_after", Float, nullable=False, server_default="300"),
    # The identity of the attempt that holds the row (schema 5): renewals and the finish match
    # on it, so that after a failover lost rows an old owner is fenced out at its next renewal
    # instead of renewing a stranger's claim of the same attempt number. NULL: claimed before.
    Column("claim_id", String(32), nullable=True),
    # How many of the row's attempts ended interrupted (schema 5): by a SIGTERM, SIGINT or
    # SIGHUP that once received and forwarded (a drain, a deploy). The retry rule counts the
    # others against --max-attempts (attempt - interrupted), the attempt cap every attempt
    # (once.outcomes.attempts_left). 0 on rows of an older ledger.
    Column("interrupted", Integer, nullable=False, server_default="0"),
    # Reports count each job's done rows in its due range, and find its latest done period,
    # from this index alone (once status / once check over 1M rows).
    Index("once_runs_job_status_start", "job", "status", "period_start"),
    **_INNODB,
)
# PostgreSQL only: the same count from an index of the done rows alone (partial), a third
# narrower and with one key less to compare per row, which its planner prefers: `once check`
# counts a million of them. SQLite's planner keeps to the index above; MySQL has no partial
# indexes. Optional for every read: `once schema` adds it to a ledger made before it.
Index("once_runs_done_start", runs.c.job, runs.c.period_start,
      postgresql_where=runs.c.status == "done").ddl_if(dialect="postgresql")
# The same rule for ddl()'s own CREATE INDEX statements (ddl_if is create_all's).
_ONLY_ON = {"once_runs_done_start": ("postgresql",),
            "once_attempts_unusual": ("sqlite", "postgresql")}

attempts = Table(
    "once_attempts", metadata,
    Column("job", Key, primary_key=True),
    Column("period", Key, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("fence", BigInteger, nullable=False),
    Column("owner", String(255), nullable=False),
    Column("status", String(16), nullable=False),
    Column("started_at", UtcTime, nullable=False),
    Column("finished_at", UtcTime, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("outcome", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("command_hash", String(64), nullable=True),
    # The last --output-tail bytes of the attempt's stdout and stderr (UTF-8, replacement
    # characters for what is not), written with its finish; NULL when not captured. Up to
    # 1 MiB of bytes, up to three times that in UTF-8: MEDIUMTEXT on MySQL.
    Column("output", LongText, nullable=True),
    # As once_runs.claim_id, but required, with no default (schema 5): an insert that does
    # not name it is refused, and only an older once's `once state --set` makes one (its
    # claims are refused by the rename of once_jobs.fires). MySQL/MariaDB without strict mode
    # fill a missing NOT NULL VARCHAR with '', which the CHECK refuses. The attempts of an
    # older once hold BEFORE_5 (once.ledger.upgrade); `once state --set` rows an id of their
    # own. (ddl_if takes a tuple of dialects, though its annotation says one.)
    Column("claim_id", String(32), nullable=False),
    CheckConstraint("claim_id <> ''", name="once_attempts_claim_id").ddl_if(
        dialect=("mysql", "mariadb")),  # type: ignore[arg-type]
    Index("once_attempts_job_started", "job", "started_at"),
    **_INNODB,
)
# SQLite and PostgreSQL: the attempts that are not plain (UNUSUAL_ATTEMPT: failed, running,
# retried, rerun, interrupted, `once state --set`'s), a few of the millions an old ledger
# keeps, so that `once metrics` counts the plain ones in indexes and reads these alone
# (once.ledger.fleet's attempt_tallies), not every attempt's row. MySQL has no partial
# indexes. Optional for every read: `once schema` adds it to a ledger made before it.
Index("once_attempts_unusual", attempts.c.job, sqlite_where=text(UNUSUAL_ATTEMPT),
      postgresql_where=text(UNUSUAL_ATTEMPT)).ddl_if(
    dialect=("sqlite", "postgresql"))  # type: ignore[arg-type]
# once_attempts.claim_id of the attempts recorded before schema 5 (the upgrade's backfill).
BEFORE_5 = "before-5"

jobs = Table(
    "once_jobs", metadata,
    Column("job", Key, primary_key=True),
    Column("fence", BigInteger, nullable=False),
    # `fires` before schema 5: the rename is what refuses every older once's claim (see
    # once.ledger.upgrade), as each of them names the old column; `last_fired_at`
    # (`last_fire_at` before) every older `once prune`, which reads it first.
    Column("fire_count", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("schedule", String(255), nullable=False),
    Column("tz", String(64), nullable=False),
    Column("lag", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("stale_after", Float, nullable=False),
    *_instants("first_period_start", "created_at", "last_fired_at"),
    Column("shards", Integer, nullable=False, server_default="1"),
    # The latest claim's --no-overlap (1: on): the reports do not call the periods after a
    # live attempt missing while it runs, as no claim could take them meanwhile.
    Column("no_overlap", Integer, nullable=False, server_default="0"),
    # The watermark of `--state`: advanced only with a done, fenced finish (compare-and-set
    # on state_version), at most 64 KiB of UTF-8 (MEDIUMTEXT: MySQL's TEXT stops short of it).
    Column("state", LongText, nullable=True),
    Column("state_version", BigInteger, nullable=False, server_default="0"),
    **_INNODB,
)

meta = Table(
    "once_meta", metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
    **_INNODB,
)

# `once lead` (once.ledger.leases): a compatible addition (docs/how-to/upgrading.md), tables
# no claim, report or prune of an older once reads or writes, made by the first `once lead`
# (or `once schema`) on a ledger of schema 5 without a change of its version.
# One row per lead name: who holds it (holder: one process's own id; owner: its name), the
# term (its fencing token), and until when, on the database's clock. A free lease has no
# holder, or an expires_at that has passed.
leases = Table(
    "once_leases", metadata,
    Column("name", Key, primary_key=True),
    Column("holder", String(64), nullable=True),
    Column("owner", String(255), nullable=True),
    Column("term", BigInteger, nullable=False),
    Column("lease_seconds", Float, nullable=False),
    Column("acquired_at", UtcTime, nullable=True),
    Column("renewed_at", UtcTime, nullable=True),
    Column("expires_at", UtcTime, nullable=False),
    **_INNODB,
)

# Every term of every lead name: who held it, from when to when, and how it ended
# (released, lost, expired; NULL while it lasts).
lead_terms = Table(
    "once_lead_terms", metadata,
    Column("name", Key, primary_key=True),
    Column("term", BigInteger, primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("lease_seconds", Float, nullable=False),
    Column("started_at", UtcTime, nullable=False),
    Column("ended_at", UtcTime, nullable=True),
    Column("ended", String(16), nullable=True),
    **_INNODB,
)

# The candidates waiting for a lead name, each seen every --lease (at least every 5 s).
lead_candidates = Table(
    "once_lead_candidates", metadata,
    Column("name", Key, primary_key=True),
    Column("holder", String(64), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("seen_at", UtcTime, nullable=False),
    **_INNODB,
)

def ddl(dialect: str) -> Iterator[str]:
    """The CREATE statements for a dialect, without touching any database."""
    target = named(dialect).sqlalchemy()
    for table in metadata.sorted_tables:
        yield str(CreateTable(table, if_not_exists=True).compile(dialect=target)).strip()
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if dialect in _ONLY_ON.get(str(index.name), (dialect,)):
                yield str(CreateIndex(index, if_not_exists=True).compile(dialect=target)).strip()
    if dialect == "postgresql":  # optional: the claim a catch-up calls (docs: tables)
        from once.ledger.pg_claim import stored_claim

        yield stored_claim().create()


# SQLAlchemy logs what fails while it gives a connection back (the rollback of one the server
# killed): with no handler of ours, Python's last resort printed that traceback on once's
# stderr. The errors that matter reach once as exceptions; these go nowhere. Set on import:
# every module that builds an engine (reports, once serve) imports this one.
logging.getLogger("sqlalchemy").addHandler(logging.NullHandler())


def engine(target: Target) -> Engine:
    """A SQLAlchemy engine on the ledger, for table creation and `once prune`: each connect
    bounded by 10 s, statements by nothing (SQLite: a busy timeout of 30 s)."""
    backend = of(target)
    eng = engine_on(target, lambda: backend.connect(target, backend.schema_connect_timeout))
    if not backend.begin_immediate:
        return eng
    # pysqlite would not open a transaction before DDL; take SQLite's write lock up front
    # so that concurrent first uses queue instead of racing.

    @event.listens_for(eng, "connect")
    def _no_implicit_transactions(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None

    @event.listens_for(eng, "begin")
    def _begin_immediate(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return eng


def engine_on(target: Target, creator: Callable[[], Any]) -> Engine:
    """An engine whose every connection `creator` opens as the hot path would
    (once.ledger.connect), never from the URL: SQLAlchemy cannot read every URL libpq and
    once can (a host list), and would connect otherwise than `once run` if it did. NullPool:
    a command opens a connection or two and leaves."""
    return create_engine(f"{of(target).sqlalchemy_url(target)}://", poolclass=NullPool,
                         creator=creator)


def ensure(target: Target, statement_timeout: float = 10.0) -> None:
    """Create or upgrade the ledger's tables; safe when many processes do it at once.

    Every wait is bounded (the work itself is not: an upgrade of a large ledger takes what it
    takes): the schema lock and the tables' locks by LOCK_WAIT, a commit's wait for a
    synchronous standby by the statements' limits of `statement_timeout`
    (once.ledger.watchdog.limits: cancelled at 15 s by default), which is then LedgerError."""
    try:
        _prepare_sqlite_file(target)
        eng = engine(target)
        try:
            with eng.connect() as conn:
                _create_until_done(conn, target, statement_timeout)
        finally:
            eng.dispose()
    except LedgerError:
        raise
    except Exception as exc:
        raise LedgerError(
            f"cannot create the ledger's tables in {target.redacted}: {describe(exc)}"
        ) from exc


# How long a creation looks again while a node of a Galera cluster made (part of) it at the
# same moment (Dialect.made_elsewhere: GET_LOCK is the node's own, not the cluster's).
_MADE_ELSEWHERE_FOR = 60.0  # seconds: as long as GET_LOCK waits for another process's turn
# How long a creation, upgrade or prune waits for a lock (the schema lock another process
# holds, a table's behind an open transaction, a row's): as long as GET_LOCK waits. Without
# it PostgreSQL and MySQL's metadata locks wait for ever, and a first use whose commit waited
# for a synchronous standby that is down held every later first use behind its schema lock.
LOCK_WAIT = 60.0


def bound_lock_waits(conn: Connection, target: Target) -> None:
    """The first statements of a transaction that creates, upgrades or prunes: its lock
    waits bounded by LOCK_WAIT (Dialect.lock_waits)."""
    for statement in of(target).lock_waits(LOCK_WAIT):
        conn.execute(text(statement))


def commit(conn: Connection, target: Target, statement_timeout: float) -> float | None:
    """Commit conn's transaction; where a commit may wait for a synchronous standby
    (PostgreSQL), under the statements' limits (once.ledger.watchdog.watched_commit). None
    when it was answered in time; the limit when it was cancelled in its wait for a standby:
    it then stands on the primary alone."""
    if not of(target).synchronous_standbys:
        conn.commit()
        return None
    from once.ledger.watchdog import watched_commit

    return watched_commit(conn.connection.driver_connection,  # type: ignore[arg-type]
                          conn.commit, statement_timeout)


def unconfirmed(what: str, limit: float) -> str:
    """The words for a commit no synchronous standby confirmed in time (commit)."""
    return (f"no synchronous standby confirmed {what} within {limit:g}s (is the synchronous "
            f"standby down? see synchronous_standby_names)")


def _create_until_done(conn: Connection, target: Target, statement_timeout: float) -> None:
    """_create_locked, again while a MySQL-family server says another node did (part of) it
    at the same moment, until a pass finds nothing left to make or the time is up."""
    import random
    import time

    give_up = time.monotonic() + _MADE_ELSEWHERE_FOR
    while True:
        try:
            _create_locked(conn, target, statement_timeout)
            return
        except Exception as exc:
            if not of(target).made_elsewhere(exc) or time.monotonic() > give_up:
                raise
            conn.rollback()
        time.sleep(random.uniform(0.05, 0.3))


def _create_locked(conn: Connection, target: Target, statement_timeout: float) -> None:
    """Create and upgrade under the dialect's schema lock, released only after the commit.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: the write lock of BEGIN IMMEDIATE.
    MySQL: GET_LOCK, a session lock, taken before the transaction and released after it,
    so that the next process's snapshot sees what this one committed.
    """
    backend = of(target)
    if backend.session_lock:
        got = conn.execute(text(backend.session_lock[0])).scalar()
        conn.commit()
        if got != 1:
            raise LedgerError(f"timed out waiting for the schema lock in {target.redacted}")
    try:
        with conn.begin():
            bound_lock_waits(conn, target)
            if backend.transaction_lock:
                conn.execute(text(backend.transaction_lock))
            metadata.create_all(conn, checkfirst=True)
            from once.ledger.upgrade import upgrade  # it imports this module's tables

            upgrade(conn)
            limit = commit(conn, target, statement_timeout)
        if limit is not None:  # made on the primary alone: the first claim would wait too
            raise LedgerError(f"cannot create the ledger's tables in {target.redacted}: "
                              f"{unconfirmed('them', limit)}")
    finally:
        if backend.session_lock:
            conn.execute(text(backend.session_lock[1]))
            conn.commit()


def _prepare_sqlite_file(target: Target) -> None:
    """WAL for concurrent readers; a warning when the file sits on a network filesystem."""
    if not of(target).file or target.path == ":memory:":
        return
    import sys

    from once.secrets import scrub

    create_private(target)  # the default ledger: the user's alone
    directory = os.path.dirname(os.path.abspath(target.path))
    os.makedirs(directory, exist_ok=True)
    fstype = filesystem_type(directory)
    if fstype in NETWORK_FILESYSTEMS:
        print(scrub(
            f"once: warning: the SQLite ledger {target.path} is on a network filesystem "
            f"({fstype}); its locks are unreliable there: use PostgreSQL or MySQL for a fleet"),
            file=sys.stderr,
        )
    _into_wal(target.path, of(target).schema_connect_timeout)


def _into_wal(path: str, timeout: float) -> None:
    """PRAGMA journal_mode=WAL, in turn behind any other connection's write lock.

    The switch reads the file's header, then asks for the write lock to rewrite it. While
    another connection holds that lock (another first use: its claim's BEGIN IMMEDIATE, which
    met the tables missing, or its own switch), SQLite refuses the reader's ask at once,
    SQLITE_BUSY without the busy timeout (waiting while reading could deadlock): a first use
    exited 75 with `database is locked`. It then waits for the lock as every statement does
    (BEGIN IMMEDIATE, the busy timeout), lets it go and switches again: a switch the other
    made leaves this one a read. `timeout` bounds all of it.
    """
    import sqlite3
    import time

    give_up = time.monotonic() + timeout
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                left = give_up - time.monotonic()
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or left <= 0:
                    raise
            conn.execute(f"PRAGMA busy_timeout = {max(1, int(left * 1000))}")
            conn.execute("BEGIN IMMEDIATE")  # the other's write lock, waited for
            conn.execute("ROLLBACK")
    finally:
        conn.close()


NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "afs",
                       "ceph", "glusterfs", "fuse.glusterfs", "lustre"}
# Filesystems held in memory (/dev/shm, /run, a tmpfs /tmp): a reboot empties them.
VOLATILE_FILESYSTEMS = {"tmpfs", "ramfs"}


def filesystem_type(path: str) -> str:
    """The type of the filesystem that holds path, from /proc/self/mountinfo ('' if unknown)."""
    best, fstype = "", ""
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()
                mount_point = fields[4]
                kind = fields[fields.index("-") + 1]
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, fstype = mount_point, kind
    except (OSError, ValueError, IndexError):
        return ""
    return fstype

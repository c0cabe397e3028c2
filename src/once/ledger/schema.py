"""The ledger's tables made: their DDL (`once schema --sql`), and their creation or upgrade
(`ensure`), with the engines, locks and commits that takes. The tables themselves are
once.ledger.tables', an older ledger's steps up to them once.ledger.upgrade's.

Creation is safe under concurrent first use: it runs under a lock that only one process holds
at a time (each dialect's: PostgreSQL advisory lock, MySQL GET_LOCK, SQLite's write lock;
once.ledger.dialect), and it only creates what is missing. On a Galera cluster GET_LOCK holds
on one node only: a creation that meets what another node made at the same moment looks again
(_create_until_done).

Imports SQLAlchemy (and through it the URL's driver) and once.ledger's url, records, tables
and upgrade: never on the hot path. Which backend it speaks to is the target's
(Target.backend): it never imports the registry. once.ledger.base imports it only when a
statement finds a table or column missing; the reports, once serve and `once schema` import
it to make or check the tables.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable

from once.ledger.records import LOCK_WAIT, LedgerError, describe
from once.ledger.records import SCHEMA_VERSION as SCHEMA_VERSION  # its home, re-exported
from once.ledger.tables import ONLY_ON, metadata
from once.ledger.upgrade import upgrade
from once.ledger.url import Target, create_private

if TYPE_CHECKING:
    from once.ledger.dialect import Dialect


def ddl(backend: Dialect) -> Iterator[str]:
    """The CREATE statements for a backend, without touching any database; then its own
    (Dialect.extra_ddl: PostgreSQL's stored claim, optional; docs: tables)."""
    target = backend.sqlalchemy()
    for table in metadata.sorted_tables:
        yield str(CreateTable(table, if_not_exists=True).compile(dialect=target)).strip()
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if backend.name in ONLY_ON.get(str(index.name), (backend.name,)):
                yield str(CreateIndex(index, if_not_exists=True).compile(dialect=target)).strip()
    yield from backend.extra_ddl()


# SQLAlchemy logs what fails while it gives a connection back (the rollback of one the server
# killed): with no handler of ours, Python's last resort printed that traceback on once's
# stderr. The errors that matter reach once as exceptions; these go nowhere. Set on import:
# every module that builds an engine (reports, once serve) imports this one.
logging.getLogger("sqlalchemy").addHandler(logging.NullHandler())


def engine(target: Target) -> Engine:
    """A SQLAlchemy engine on the ledger, for table creation and `once prune`: each connect
    bounded by 10 s, statements by nothing (SQLite: a busy timeout of 30 s)."""
    backend = target.backend
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
    return create_engine(f"{target.backend.sqlalchemy_url(target)}://", poolclass=NullPool,
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
        raise LedgerError(f"cannot create the ledger's tables in {target.redacted}: "
                          f"{failed(target, exc)}") from exc


def failed(target: Target, exc: BaseException) -> str:
    """What a creation, upgrade or prune that failed with exc says: the driver's words (not
    SQLAlchemy's, a driver's class name first), and a lock it waited on to LOCK_WAIT."""
    cause = getattr(exc, "orig", None) or exc
    said = describe(cause)
    if target.backend.lock_waited(cause):
        return f"waited past {LOCK_WAIT:g}s on a lock another session holds ({said})"
    return said


# How long a creation looks again while a node of a Galera cluster made (part of) it at the
# same moment (Dialect.made_elsewhere: GET_LOCK is the node's own, not the cluster's).
_MADE_ELSEWHERE_FOR = 60.0  # seconds: as long as GET_LOCK waits for another process's turn


def bound_lock_waits(conn: Connection, target: Target) -> None:
    """The first statements of a transaction that creates, upgrades or prunes: its lock
    waits bounded by LOCK_WAIT (Dialect.lock_waits)."""
    for statement in target.backend.lock_waits(LOCK_WAIT):
        conn.execute(text(statement))


def commit(conn: Connection, target: Target, statement_timeout: float) -> float | None:
    """Commit conn's transaction; where a commit may wait for a synchronous standby
    (PostgreSQL), under the statements' limits (once.ledger.watchdog.watched_commit). None
    when it was answered in time; the limit when it was cancelled in its wait for a standby:
    it then stands on the primary alone."""
    if not target.backend.synchronous_standbys:
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
            if not target.backend.made_elsewhere(exc) or time.monotonic() > give_up:
                raise
            conn.rollback()
        time.sleep(random.uniform(0.05, 0.3))


def _create_locked(conn: Connection, target: Target, statement_timeout: float) -> None:
    """Create and upgrade under the dialect's schema lock, released only after the commit.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: the write lock of BEGIN IMMEDIATE.
    MySQL: GET_LOCK, a session lock, taken before the transaction and released after it,
    so that the next process's snapshot sees what this one committed.
    """
    backend = target.backend
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
            upgrade(conn, backend)
            limit = commit(conn, target, statement_timeout)
        if limit is not None:  # made on the primary alone: the first claim would wait too
            raise LedgerError(f"cannot create the ledger's tables in {target.redacted}: "
                              f"{unconfirmed('them', limit)}")
    except BaseException:
        if backend.session_lock:
            # What failed is the error: a release that fails too (the connection gone: the
            # lock went with its session) must not stand in its place.
            with suppress(Exception):
                _release_session_lock(conn, backend)
        raise
    if backend.session_lock:
        _release_session_lock(conn, backend)


def _release_session_lock(conn: Connection, backend: Dialect) -> None:
    """Let go of the MySQL schema lock (GET_LOCK's); a transaction left behind (invalid after
    a dropped connection, which SQLAlchemy will not reconnect under) rolled back first."""
    assert backend.session_lock
    conn.rollback()
    conn.execute(text(backend.session_lock[1]))
    conn.commit()


def _prepare_sqlite_file(target: Target) -> None:
    """WAL for concurrent readers; a warning when the file sits on a network filesystem."""
    if not target.backend.file or target.path == ":memory:":
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
    _into_wal(target.path, target.backend.schema_connect_timeout)


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

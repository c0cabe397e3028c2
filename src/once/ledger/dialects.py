"""The backends once speaks, one object each, and the registry that finds them: the one place
that names every backend, above all that they share.

Each backend is a once.ledger.dialect.Dialect here (how it connects, its SQL fragments, its
instants, its errors, its schema lock, its replication), whose methods import the backend's
own modules when they are called (its statements, sqlite, postgres or mysql; its way of
connecting, once.ledger.connect), downward: those modules, and the flow every backend shares
(base, url, connect, schema, upgrade, watchdog), never import this one back. `parse_url`
reads a URL into a Target that holds its backend (Target.backend), which is how the shared
flow finds it. `REGISTRY` holds them by name; `named(name)`, `by_scheme` and `of_sqlalchemy`
find one, and a name none holds is an error (UnknownDialect, a usage error like a bad URL),
never a fall-through. Adding a backend: one Dialect here (its error codes in errors), its
statements in a module of its own (sqlite, postgres, mysql), its URL's parser in url.

Imports only the stdlib and once.ledger's url, dialect, records and errors: the hot path
loads it (no driver, no SQLAlchemy, no backend's statements).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from once.ledger import errors
from once.ledger import url as parsing
from once.ledger.dialect import IDLE_TRANSACTION, Dialect
from once.ledger.records import error_code, from_db_time
from once.ledger.url import Target, UrlError, check_port, path_url, redact

if TYPE_CHECKING:
    import sqlite3

    import psycopg
    from psycopg.rows import TupleRow

    from once.ledger.base import Ledger
    from once.ledger.dbapi import Connection, MysqlConnection, Params, Row


class UnknownDialect(UrlError):
    """A dialect no backend of once speaks (a usage error, exit 2, as a bad URL)."""


class Sqlite(Dialect):
    name, title = "sqlite", "SQLite"
    schemes = spelled = sqlalchemy_names = ("sqlite",)
    rules = errors.SQLITE
    file = text_times = begin_immediate = True
    alters_columns = False
    now_sql = "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"
    output_end_sql = "substr({column}, -{n})"
    snapshot_begin = ("BEGIN",)  # a deferred transaction: one snapshot of a WAL ledger
    schema_connect_timeout = 30.0  # the busy timeout: first uses queue on the write lock

    def parse(self, url: str, password: str | None) -> Target:
        return parsing.sqlite_target(url, self)

    def ledger_class(self) -> type[Ledger]:
        from once.ledger.sqlite import SqliteLedger

        return SqliteLedger

    def connect(self, target: Target, timeout: float, statements: float | None = None,
                **options: Any) -> sqlite3.Connection:
        import sqlite3

        conn: sqlite3.Connection = sqlite3.connect(target.path, timeout=timeout, **options)
        return conn

    def snapshot_connection(self, target: Target) -> sqlite3.Connection:
        return sqlite_read_only(target.path)

    def report_connection(self, target: Target) -> sqlite3.Connection:
        return sqlite_read_only(target.path)

    def serve_connection(self, target: Target, timeout: float) -> sqlite3.Connection:
        conn = self.connect(target, timeout)
        conn.execute("PRAGMA query_only = ON")
        return conn

    def snapshot_options(self, read_only: bool) -> dict[str, str | bool]:
        return {}  # manual transactions, begun by a plain BEGIN (once.ledger.engines)

    def absent(self, target: Target) -> bool:
        return not os.path.exists(target.path)

    def fetch(self, conn: Connection, sql: str, params: Params) -> list[Row]:
        from once.ledger.sqlite import pyformat_to_named

        own = cast("sqlite3.Connection", conn)  # this dialect's connections are sqlite3's
        return [tuple(r) for r in own.execute(pyformat_to_named(sql), params).fetchall()]

    def rollback(self, conn: Connection) -> None:
        cast("sqlite3.Connection", conn).execute("ROLLBACK")

    def job_names(self, target: Target, timeout: float) -> list[str]:
        if not os.path.isfile(target.path):
            return []
        from once.ledger.sqlite import job_names

        return job_names(target.path, timeout)

    def lead_names(self, target: Target, timeout: float, retired: bool = False) -> list[str]:
        if not os.path.isfile(target.path):
            return []
        from once.ledger.sqlite import lead_names

        return lead_names(target.path, timeout, retired)

    def sqlalchemy_url(self, target: Target) -> str:
        return "sqlite"

    def bind(self, instant: datetime) -> str:
        # The year in four digits: strftime('%Y') gives '1' for the year 1, which no reader
        # could parse and which sorts after 2026.
        return cast(datetime, super().bind(instant)).isoformat(" ", "microseconds")

    def from_db(self, value: datetime | str) -> datetime:
        if isinstance(value, str):
            # The text once writes (bind), naive UTC: read 20 times faster than through
            # sqlite_time and replace(), which a fleet's page paid 20,000 times.
            with suppress(ValueError):
                return datetime.fromisoformat(value + "+00:00")
            from once.ledger.sqlite import sqlite_time  # an unpadded year, as once wrote it

            value = sqlite_time(value)
        return from_db_time(value)


class Postgres(Dialect):
    name, title = "postgresql", "PostgreSQL"
    schemes = ("postgresql", "postgres")
    spelled = sqlalchemy_names = ("postgresql",)
    rules = errors.POSTGRES
    standbys = arrays = synchronous_standbys = True
    now_sql = "SELECT clock_timestamp()"
    transaction_lock = "SELECT pg_advisory_xact_lock(7310504102)"

    def parse(self, url: str, password: str | None) -> Target:
        return parsing.postgres_target(url, password, self)

    def ledger_class(self) -> type[Ledger]:
        from once.ledger.postgres import PostgresLedger

        return PostgresLedger

    def connect(self, target: Target, timeout: float, statements: float | None = None,
                **options: Any) -> psycopg.Connection[TupleRow]:
        from once.ledger.connect import postgres

        return postgres(target, timeout, options)

    def snapshot_connection(self, target: Target) -> psycopg.Connection[TupleRow]:
        import psycopg

        conn = self.connect(target, 10)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True  # its first read begins the snapshot
        return conn

    # Any transaction's idle time, a read's too: set only where once writes (Dialect).
    write_begin = (f"SET LOCAL idle_in_transaction_session_timeout = {IDLE_TRANSACTION * 1000}",)

    def read_only_begin(self, timeout: float) -> tuple[str, ...]:
        # Read-only by the postgresql_readonly option (snapshot_options).
        return (f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}",)

    def socket_of(self, dbapi_conn: object) -> int | None:
        return int(cast("psycopg.Connection[Any]", dbapi_conn).pgconn.socket)

    def lock_waits(self, seconds: float) -> tuple[str, ...]:
        return (f"SET LOCAL lock_timeout = {max(1, int(seconds * 1000))}",)

    def sqlalchemy_url(self, target: Target) -> str:
        return "postgresql+psycopg"

    def bind(self, instant: datetime) -> datetime:
        return instant.astimezone(UTC)

    def bind_typed(self, instant: datetime) -> datetime:
        return instant.astimezone(UTC)

    def extra_ddl(self) -> Iterator[str]:
        from once.ledger.pg_claim import stored_claim  # optional: the claim a catch-up calls

        yield stored_claim().create()


class Mysql(Dialect):
    name, title = "mysql", "MySQL/MariaDB"
    schemes = spelled = sqlalchemy_names = ("mysql", "mariadb")
    rules = errors.MYSQL
    renames_by_change = True  # MariaDB before 10.5 has no RENAME COLUMN
    lax_not_null = True  # a server without strict mode fills a missing value in, warning
    now_sql = "SELECT UTC_TIMESTAMP(6)"
    snapshot_begin = ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                      "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    # GET_LOCK: the session's, so that the next process's snapshot sees what this one
    # committed. On a Galera cluster it holds on one node only (made_elsewhere).
    session_lock = ("SELECT GET_LOCK('once_schema', 60)", "SELECT RELEASE_LOCK('once_schema')")

    def parse(self, url: str, password: str | None) -> Target:
        return parsing.mysql_target(url, password, self)

    def ledger_class(self) -> type[Ledger]:
        from once.ledger.mysql import MysqlLedger

        return MysqlLedger

    def connect(self, target: Target, timeout: float, statements: float | None = None,
                **options: Any) -> MysqlConnection:
        from once.ledger.connect import mysql

        # The hot path's ledger (MysqlLedger._open) bounds its idle reads too: its
        # transactions never wait on once itself, and a locking read holds a row as a write.
        # Its lock waits end before its statements' read timeout (_bound_session).
        reads_too = options.pop("bound_idle_reads", False)
        conn = mysql(target, timeout, statements, options)
        _bound_session(conn, reads_too, statements)
        return conn

    def snapshot_connection(self, target: Target) -> MysqlConnection:
        return self.connect(target, 10, autocommit=False)

    def read_only_begin(self, timeout: float) -> tuple[str, ...]:
        return ("START TRANSACTION READ ONLY",)  # the driver's read timeout bounds each one

    def socket_of(self, dbapi_conn: object) -> int | None:
        return int(cast("MysqlConnection", dbapi_conn)._sock.fileno())

    def lock_waits(self, seconds: float) -> tuple[str, ...]:
        # Metadata locks (DDL behind an open transaction: a year by default) and row locks.
        whole = max(1, math.ceil(seconds))
        return (f"SET SESSION lock_wait_timeout = {whole}",
                f"SET SESSION innodb_lock_wait_timeout = {whole}")

    def sqlalchemy_url(self, target: Target) -> str:
        if target.url.partition("://")[0].lower().startswith("mariadb"):
            return "mariadb+pymysql"
        return "mysql+pymysql"

    def quote(self, name: str) -> str:
        return f"`{name}`"


def _bound_session(conn: MysqlConnection, reads_too: bool, statements: float | None) -> None:
    """One SET for the session's bounds, where any is asked.

    With `statements` (the read timeout that bounds each statement), a row lock's wait ends
    on the server a second before it, with MySQL's own words (1205: a lock, not a silent
    server), and the statement with it: one the client gave up on waited on in the server,
    a session that outlived `once` (an attacker's finding: they piled up to the user's
    connection limit, and a renewal committed after its `once` had exited). Not metadata
    locks' (lock_wait_timeout): a commit held by a backup's BLOCK_COMMIT would be refused
    rather than answered late, as Galera's failure detection answers it (once.ledger.mysql).

    MariaDB (10.3 and later) also ends this session once it has sat IDLE_TRANSACTION seconds
    inside a transaction that wrote, or with reads_too inside any transaction (a locking
    read, as `SELECT ... FOR UPDATE`, is no write to the server): a process stopped inside a
    claim or an acquire holds the job's or the lease's row no longer. MySQL has no such bound
    (docs/concepts/liveness.md)."""
    bounds = []
    if statements is not None:
        wait = max(1, math.ceil(statements) - 1)
        bounds.append(f"innodb_lock_wait_timeout = {wait}")
    if "mariadb" in conn.get_server_info().lower():
        variable = "idle_transaction_timeout" if reads_too else "idle_write_transaction_timeout"
        bounds.append(f"{variable} = {IDLE_TRANSACTION}")
    while bounds:
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET SESSION {', '.join(bounds)}")
            return
        except Exception as exc:
            if error_code(exc) != _UNKNOWN_VARIABLE or "idle" not in bounds[-1]:
                raise
            bounds.pop()  # MariaDB before 10.3


_UNKNOWN_VARIABLE = 1193


REGISTRY: dict[str, Dialect] = {d.name: d for d in (Sqlite(), Postgres(), Mysql())}


def named(name: str) -> Dialect:
    """The backend of this name (Target.dialect); UnknownDialect for any other."""
    found = REGISTRY.get(name)
    if found is None:
        raise UnknownDialect(f"unknown ledger dialect {name!r}: once speaks "
                             f"{spoken(lambda d: (d.name,))}")
    return found


def of(target: Target) -> Dialect:
    """The target's backend (Target.backend, which parse_url put there)."""
    return target.backend


def by_scheme(scheme: str) -> Dialect | None:
    """The backend of a URL scheme (`postgres`, `mariadb`; no +driver), None for another."""
    return next((d for d in REGISTRY.values() if scheme in d.schemes), None)


def of_sqlalchemy(name: str) -> Dialect:
    """The backend of a SQLAlchemy connection (`conn.dialect.name`: mariadb is MySQL's)."""
    found = next((d for d in REGISTRY.values() if name in d.sqlalchemy_names), None)
    if found is None:
        raise UnknownDialect(f"a SQLAlchemy connection of the dialect {name!r}: once speaks "
                             f"{spoken(lambda d: d.sqlalchemy_names)}")
    return found


def spoken(names: Callable[[Dialect], tuple[str, ...]] = lambda d: d.spelled) -> str:
    """The names of every backend, for a message: `sqlite, postgresql, mysql or mariadb`."""
    *rest, last = [n for d in REGISTRY.values() for n in names(d)]
    return f"{', '.join(rest)} or {last}"


# -- URLs --------------------------------------------------------------------------------------


def parse_url(url: str, password: str | None = None) -> Target:
    """Read a SQLAlchemy-style URL; `password` (from --db-password-file) overrides the URL's.
    Its refusal is scrubbed of the URL's secrets (once.secrets), for the Python API, which
    raises it as it is; remembering them for every later message is the caller's (the
    command line's open_target, once.claim), as a pure function remembers nothing. The
    target holds the backend its scheme names (Target.backend)."""
    try:
        return _parse_url(url, password)
    except UrlError as exc:
        from once import secrets

        exc.args = (secrets.scrub(str(exc), secrets.forms(url, password)),)
        raise


# Where a URL is no URL at all, nothing in it can be told from a password: it is not shown.
_NOT_SHOWN = "not shown, as it may hold a password"


def _parse_url(url: str, password: str | None) -> Target:
    from once import secrets

    scheme = url.partition("://")[0].lower()
    base = scheme.split("+")[0]
    if not url.isprintable():  # a control character, or bytes that are not UTF-8
        raise UrlError(f"bad --db URL: it holds a control character or bytes that are not "
                       f"UTF-8 ({_NOT_SHOWN})")
    if "://" not in url:
        if secrets.plain_path(url):  # ./once.db: a SQLite file, the easiest ledger to name
            return named("sqlite").parse(path_url(url), password)
        raise UrlError(f"bad --db URL: expected a file's path (./once.db), sqlite:///PATH, "
                       f"postgresql://… or mysql://… (it has no '://'; {_NOT_SHOWN})")
    if not secrets.is_scheme(scheme):
        raise UrlError(f"bad --db URL: expected a file's path (./once.db), sqlite:///PATH, "
                       f"postgresql://… or mysql://… "
                       f"(what comes before '://' is no scheme; {_NOT_SHOWN})")
    backend = by_scheme(base)
    if backend is not None and backend.file and url.partition("://")[2].startswith("/"):
        return backend.parse(url, password)  # sqlite:///PATH: no host urlsplit could refuse
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # [::1 without its bracket, [zz]: the host is malformed
        raise UrlError(f"bad host in --db URL {redact(url)}: {exc}") from None
    if backend is not None and backend.file:
        return backend.parse(url, password)
    for hostinfo in parts.netloc.rpartition("@")[2].split(","):  # host:port,host:port
        check_port(hostinfo, url)
    if backend is None:
        raise UrlError(f"unsupported --db URL scheme '{scheme}': use {spoken()}")
    return backend.parse(url, password)


# -- SQLite's read-only connection -----------------------------------------------------------


def sqlite_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot write: reports work for an account that may only read the
    ledger (a monitoring user), and never create or change a file.

    A WAL ledger with no writer at work has no shared-memory file (`-shm`), and a read-only
    connection cannot create one where it may not write: SQLite then refuses to read at all.
    The file is then opened as immutable, which needs no shared memory; that is sound here
    because a writer at work would have made the `-shm` file.
    """
    import sqlite3
    from urllib.parse import quote

    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False,
                           isolation_level=None)
    try:
        probe_sqlite(conn)
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=30,
                           check_same_thread=False, isolation_level=None)


def probe_sqlite(dbapi_conn: sqlite3.Connection) -> None:
    """Read from a new sqlite3 connection: raises when a read-only one cannot read (a WAL
    ledger whose shared-memory file it may not create)."""
    dbapi_conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()

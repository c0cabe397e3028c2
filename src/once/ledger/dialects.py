"""The backends once speaks, one object each: the one place that knows how a backend differs.

A `Dialect` owns how to connect (the hot path's ledger class, the survey's read-only snapshot,
the reports' and once serve's connections), the SQL fragments the shared statements leave to
it, how an instant is bound and read back, how its driver's errors are read (once.ledger.errors:
a retry or not, a table not there yet, a lost race), its schema lock and what it knows of
replication. `REGISTRY` holds them by name; `of(target)` and `named(name)` find one, and a name
none holds is an error (UnknownDialect, a usage error like a bad URL), never a fall-through.
Adding a backend: one Dialect here (its error codes in errors), its statements in a module of
its own (sqlite, postgres, mysql), its URL's parser in url.

Imports only the stdlib and once.ledger's url, records and errors: the hot path loads it
(no driver, no SQLAlchemy; each method imports what it needs when it is called).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

from once.ledger import errors
from once.ledger import url as parsing
from once.ledger.records import Failure, from_db_time
from once.ledger.url import Target, UrlError

if TYPE_CHECKING:
    import sqlite3

    import psycopg
    from psycopg.rows import TupleRow
    from sqlalchemy.engine import Dialect as SqlalchemyDialect

    from once.ledger.base import Ledger
    from once.ledger.dbapi import Connection, MysqlConnection, Params, Row


class UnknownDialect(UrlError):
    """A dialect no backend of once speaks (a usage error, exit 2, as a bad URL)."""


class Dialect:
    """What every backend answers; the subclasses below say how each does it."""

    name: ClassVar[str]  # as Target.dialect says it
    title: ClassVar[str]  # as a message names it
    # URL schemes (before any +driver), and the names SQLAlchemy gives its connections.
    schemes: ClassVar[tuple[str, ...]]
    spelled: ClassVar[tuple[str, ...]]  # the schemes a message offers
    sqlalchemy_names: ClassVar[tuple[str, ...]]
    rules: ClassVar[errors.Rules]
    # Traits the shared code reads, never the name.
    file: ClassVar[bool] = False  # a local file: absent until a first use creates it
    text_times: ClassVar[bool] = False  # times stored as ISO text (SQLite)
    standbys: ClassVar[bool] = False  # a session can tell it reads a standby (PostgreSQL)
    # A commit may wait for a synchronous standby, for ever while none is up (PostgreSQL):
    # the commits once sends outside the hot path are watched (once.ledger.watchdog).
    synchronous_standbys: ClassVar[bool] = False
    renames_by_change: ClassVar[bool] = False  # ALTER TABLE ... CHANGE/MODIFY, not RENAME
    alters_columns: ClassVar[bool] = True  # ALTER TABLE changes a column (SQLite: remade)
    lax_not_null: ClassVar[bool] = False  # a missing NOT NULL value may become '' (lax MySQL)
    arrays: ClassVar[bool] = False  # binds a list as one array parameter (PostgreSQL)
    # SQL fragments: the database's clock (one SELECT), and the end of a text column.
    now_sql: ClassVar[str]
    output_end_sql: ClassVar[str] = "right({column}, {n})"
    # The statements that begin the survey's read-only snapshot on its own connection.
    snapshot_begin: ClassVar[tuple[str, ...]] = ()
    # The schema lock (once.ledger.schema): a session lock taken before the creation's
    # transaction and released after its commit (take, release), or one the transaction
    # takes and its end releases; a file's own write lock (begin_immediate) otherwise.
    session_lock: ClassVar[tuple[str, str] | None] = None
    transaction_lock: ClassVar[str | None] = None
    begin_immediate: ClassVar[bool] = False
    schema_connect_timeout: ClassVar[float] = 10.0

    # -- connecting

    def parse(self, url: str, password: str | None) -> Target:
        """The target of a URL of one of `schemes` (once.ledger.url.parse_url)."""
        raise NotImplementedError

    def ledger_class(self) -> type[Ledger]:
        """The hot path's ledger (its statements); only this backend's module is imported."""
        raise NotImplementedError

    def connect(self, target: Target, timeout: float, statements: float | None = None,
                **options: Any) -> Connection:
        """A new DB-API connection, as every path opens one (once.ledger.connect); options:
        the driver's own keywords."""
        raise NotImplementedError

    def snapshot_connection(self, target: Target) -> Connection:
        """A connection for the survey's read-only snapshot (once.ledger.fleet)."""
        return self.connect(target, 10)

    def report_connection(self, target: Target) -> Connection:
        """A connection for the reports' SQLAlchemy engine (once.ledger.engines)."""
        return self.connect(target, 10)

    def serve_connection(self, target: Target, timeout: float) -> Connection:
        """A connection for once serve: connect and statements bounded by about `timeout`
        (whole seconds, at least 1)."""
        whole = max(1, math.ceil(timeout))
        return self.connect(target, whole, whole)

    def snapshot_options(self, read_only: bool) -> dict[str, str | bool]:
        """SQLAlchemy execution options of a report's snapshot."""
        return {"isolation_level": "REPEATABLE READ",
                **({"postgresql_readonly": True} if read_only else {})}

    def read_only_begin(self, timeout: float) -> tuple[str, ...]:
        """What makes a report's SQLAlchemy transaction read-only, each statement bounded by
        about `timeout` on the server (once.ledger.engines.begin_read_only)."""
        return ()

    def absent(self, target: Target) -> bool:
        """No ledger there yet, and connecting would create one (an empty file)."""
        return False

    def fetch(self, conn: Connection, sql: str, params: Params) -> list[Row]:
        """A statement in the pyformat style on a DB-API connection, its rows."""
        cur = conn.cursor()
        try:
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()]
        finally:
            cur.close()

    def rollback(self, conn: Connection) -> None:
        conn.rollback()

    def socket_of(self, dbapi_conn: object) -> int | None:
        """The connection's socket (once serve's watchdog shuts it down); None: no socket."""
        return None

    def lock_waits(self, seconds: float) -> tuple[str, ...]:
        """What bounds each lock wait of a transaction that creates, upgrades or prunes the
        ledger (its schema lock, a table's, a row's) by about `seconds`, sent first in it."""
        return ()

    def job_names(self, target: Target, timeout: float) -> list[str]:
        """The job names shell completion offers: only what a local read can give at once."""
        return []

    def sqlalchemy_url(self, target: Target) -> str:
        """SQLAlchemy's name of the dialect and driver once uses (a URL with no more in it:
        once opens the connections itself, SQLAlchemy never reads the ledger's URL)."""
        raise NotImplementedError

    def sqlalchemy(self) -> SqlalchemyDialect:
        """SQLAlchemy's dialect, to compile DDL (`once schema --sql`): SQLAlchemy is loaded."""
        from sqlalchemy.dialects import registry

        return cast("SqlalchemyDialect", registry.load(self.sqlalchemy_names[0])())

    # -- SQL fragments

    def output_end(self, column: str, n: int) -> str:
        """The last `n` characters of a text column."""
        return self.output_end_sql.format(column=column, n=n)

    def quote(self, name: str) -> str:
        """A column name the server may take for a keyword (`lag`)."""
        return name

    # -- instants

    def bind(self, instant: datetime) -> datetime | str:
        """An instant as the driver binds it for this backend's column: UTC, naive outside
        PostgreSQL (SQLite: the text SQLAlchemy writes)."""
        return instant.astimezone(UTC).replace(tzinfo=None)

    def bind_typed(self, instant: datetime) -> datetime:
        """An instant as SQLAlchemy's column type wants it bound: UTC, naive outside
        PostgreSQL."""
        return instant.astimezone(UTC).replace(tzinfo=None)

    def from_db(self, value: Any) -> datetime:
        """A time as the driver reads it, as an aware UTC datetime."""
        return from_db_time(value)

    # -- errors (once.ledger.errors)

    def failure(self, exc: BaseException) -> Failure:
        """Whether a retry may cure the driver's exception (LedgerError.failure)."""
        return errors.failure(self.rules, exc)

    def schema_missing(self, exc: BaseException, columns: bool = True) -> bool:
        """The statement failed for a table (or, with `columns`, a column) not there yet."""
        return errors.schema_missing(self.rules, exc, columns)

    def lost_race(self, exc: BaseException) -> bool:
        """A transaction another one's rolled back (a deadlock, a lock wait, a certification
        Galera lost): read the row again, the other may have won."""
        return errors.lost_race(self.rules, exc)

    def read_timed_out(self, exc: BaseException) -> bool:
        """The client's read timeout ended the statement: the server may have done it."""
        return errors.read_timed_out(self.rules, exc)

    def lock_waited(self, exc: BaseException) -> str:
        """The lock another session held that the failed statement waited on until its bound
        ("a row lock"; LedgerError.lock), or ""."""
        return errors.lock_waited(self.rules, exc)

    def made_elsewhere(self, exc: BaseException) -> bool:
        """A creation or upgrade that met what another node made at the same moment."""
        return errors.made_elsewhere(self.rules, exc)


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
        return parsing.sqlite_target(url)

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
        return parsing.postgres_target(url, password)

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
        return parsing.mysql_target(url, password)

    def ledger_class(self) -> type[Ledger]:
        from once.ledger.mysql import MysqlLedger

        return MysqlLedger

    def connect(self, target: Target, timeout: float, statements: float | None = None,
                **options: Any) -> MysqlConnection:
        from once.ledger.connect import mysql

        return mysql(target, timeout, statements, options)

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


REGISTRY: dict[str, Dialect] = {d.name: d for d in (Sqlite(), Postgres(), Mysql())}


def named(name: str) -> Dialect:
    """The backend of this name (Target.dialect); UnknownDialect for any other."""
    found = REGISTRY.get(name)
    if found is None:
        raise UnknownDialect(f"unknown ledger dialect {name!r}: once speaks "
                             f"{spoken(lambda d: (d.name,))}")
    return found


def of(target: Target) -> Dialect:
    """The target's backend."""
    return named(target.dialect)


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


def socket_of(target: Target, dbapi_conn: object) -> int | None:
    """The connection's socket, None when it has none or cannot say (once serve): any
    object is asked (a SQLAlchemy connection's driver connection)."""
    with suppress(Exception):
        return of(target).socket_of(dbapi_conn)
    return None

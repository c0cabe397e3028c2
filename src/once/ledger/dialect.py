"""What every backend answers (`Dialect`): the one place that says how a backend differs, as
methods and traits the shared code reads, never a backend's name. Each backend is one
subclass in the registry, once.ledger.dialects, which puts the one a URL names into its
Target (Target.backend): the shared flow (base, connect, schema, upgrade, watchdog) takes it
from there and never imports the registry, nor any backend's module.

A Dialect owns how to connect (the hot path's ledger class, the survey's read-only snapshot,
the reports' and once serve's connections), the SQL fragments the shared statements leave to
it, how an instant is bound and read back, how its driver's errors are read (once.ledger.errors:
a retry or not, a table not there yet, a lost race), its schema lock and what it knows of
replication.

Imports only the stdlib and once.ledger's errors and records: the hot path loads it (no
driver, no SQLAlchemy; a subclass's method imports what it needs when it is called).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

from once.ledger import errors
from once.ledger.records import Failure, from_db_time

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect as SqlalchemyDialect

    from once.ledger.base import Ledger
    from once.ledger.dbapi import Connection, Params, Row
    from once.ledger.url import Target


# How long a session may sit idle inside a transaction before its server ends it (rolled
# back, its locks let go): a process stopped (SIGSTOP, a frozen VM) or cut off in the middle
# of a transaction of several statements then holds a job's row (every claim of the job
# waits) or a lease's (no candidate can lead) this long, not until it is continued or the
# server finds its connection gone (hours: TCP's keepalive). Off the hot path, only a
# transaction that wrote is bounded: a report's snapshot may sit idle while it is drawn. Far
# above the moments between once's own statements on a loaded machine; below the read
# timeout (10 s by default) of the statements that wait behind it. Dialect.write_begin and
# the MySQL-family session (once.ledger.dialects).
IDLE_TRANSACTION = 5  # seconds


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
    # What begins a transaction of several statements on the hot path's ledger (a lease's
    # acquire or release, a state's write, a checked claim) where the server must be told
    # IDLE_TRANSACTION in it.
    write_begin: ClassVar[tuple[str, ...]] = ()
    # The schema lock (once.ledger.schema): a session lock taken before the creation's
    # transaction and released after its commit (take, release), or one the transaction
    # takes and its end releases; a file's own write lock (begin_immediate) otherwise.
    session_lock: ClassVar[tuple[str, str] | None] = None
    transaction_lock: ClassVar[str | None] = None
    begin_immediate: ClassVar[bool] = False
    schema_connect_timeout: ClassVar[float] = 10.0

    # -- connecting

    def __repr__(self) -> str:
        return f"<{self.title} dialect>"  # as a Target's repr shows it

    def parse(self, url: str, password: str | None) -> Target:
        """The target of a URL of one of `schemes` (once.ledger.dialects.parse_url), holding
        this backend."""
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

    def lead_names(self, target: Target, timeout: float, retired: bool = False) -> list[str]:
        """The lead names shell completion offers (`retired`: those with terms alone too), as
        job_names."""
        return []

    def sqlalchemy_url(self, target: Target) -> str:
        """SQLAlchemy's name of the dialect and driver once uses (a URL with no more in it:
        once opens the connections itself, SQLAlchemy never reads the ledger's URL)."""
        raise NotImplementedError

    def sqlalchemy(self) -> SqlalchemyDialect:
        """SQLAlchemy's dialect, to compile DDL (`once schema --sql`): SQLAlchemy is loaded."""
        from sqlalchemy.dialects import registry

        return cast("SqlalchemyDialect", registry.load(self.sqlalchemy_names[0])())

    def extra_ddl(self) -> Iterator[str]:
        """What `once schema --sql` prints after the tables' statements (none)."""
        return iter(())

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

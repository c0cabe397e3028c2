"""The read-only engines of the reports and of `once serve` (SQLAlchemy: never on the hot path),
and what a session on them reads first: the schema version, the database's clock.

Both open SQLite with manual transactions and begin each read with a plain BEGIN, so that
every read of a WAL ledger is one consistent snapshot (the server dialects get REPEATABLE
READ from their callers). `report_engine` reads SQLite through a connection that cannot
write; `serve_engine` bounds the connect and every statement by `once serve`'s --read-timeout.
Every connection is opened by its dialect (once.ledger.dialects), as the hot path opens its own,
through schema.engine_on: SQLAlchemy never reads the ledger's URL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, event, select

from once.ledger.dialects import of
from once.ledger.schema import engine_on
from once.ledger.tables import meta
from once.ledger.url import Target


def report_engine(target: Target) -> Engine:
    """An engine for the reports (each connect bounded by 10 s): SQLite opens a deferred
    (read) transaction, never a write lock, on a read-only connection
    (once.ledger.dialects.sqlite_read_only)."""
    backend = of(target)
    eng = engine_on(target, lambda: backend.report_connection(target))
    return _snapshots(eng) if backend.file else eng


def serve_engine(target: Target, timeout: float) -> Engine:
    """An engine for `once serve`: connect and statements bounded by about `timeout`
    (SQLite: a connection that may not write, PRAGMA query_only)."""
    backend = of(target)
    eng = engine_on(target, lambda: backend.serve_connection(target, timeout))
    return _snapshots(eng) if backend.file else eng


def _snapshots(eng: Engine) -> Engine:
    """A file's engine (SQLite): manual transactions, each begun by a plain BEGIN."""
    @event.listens_for(eng, "connect")
    def _manual_transactions(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(eng, "begin")
    def _begin_snapshot(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")  # WAL: a consistent snapshot for every read

    return eng


# -- a session on them --------------------------------------------------------------------


def is_missing_table(target: Target, exc: BaseException) -> bool:
    """A read failed because the ledger's tables do not exist (nothing has run): `exc` is
    SQLAlchemy's error, its driver's error judged by its dialect (Dialect.schema_missing)."""
    orig = getattr(exc, "orig", None)
    return orig is not None and of(target).schema_missing(orig, columns=False)


def bind(target: Target, instant: datetime) -> datetime:
    """An instant as the dialect's column type wants it bound: UTC, naive outside PostgreSQL."""
    return of(target).bind_typed(instant)


def schema_version(conn: Connection) -> int:
    """The ledger's schema version (0 when it has none yet)."""
    value = conn.execute(select(meta.c.value).where(meta.c.name == "schema_version")).scalar()
    return int(value or 0)


def db_now(conn: Connection, target: Target) -> datetime:
    """The database's clock, which wrote every heartbeat."""
    backend = of(target)
    return backend.from_db(conn.exec_driver_sql(backend.now_sql).scalar_one())


def begin_read_only(conn: Connection, target: Target, timeout: float) -> None:
    """Make this transaction read-only (SQLite: the connection is; PostgreSQL: the
    postgresql_readonly option; MySQL: the driver's read timeout bounds each statement) and
    bound each statement on the server to `timeout`."""
    for sql in of(target).read_only_begin(timeout):
        conn.exec_driver_sql(sql)

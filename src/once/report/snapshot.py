"""Reading one snapshot of the ledger: the reports' engine and their read-only connection in
one consistent transaction (the statements themselves are once.ledger.queries').

An absent ledger (no SQLite file, no tables) is NoLedger, never created; a ledger whose schema
is older than this once's is upgraded first, as the next `once run` would do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from once.ledger import LedgerError, Target, describe, queries
from once.ledger import schema as tables


class NoLedger(Exception):
    """The ledger's tables do not exist yet: nothing has run."""


def _engine(target: Target) -> Engine:
    """An engine for reading: SQLite opens a deferred (read) transaction, never a write lock,
    on a read-only connection (_sqlite_read_only)."""
    if target.dialect == "sqlite":
        eng = create_engine("sqlite://", poolclass=NullPool,
                            creator=lambda: _sqlite_read_only(target.path))
    else:
        args = tables._engine_args(target)  # the connect arguments once.ledger.schema uses
        eng = create_engine(target.sqlalchemy_url, poolclass=NullPool, **args)
    if target.dialect == "sqlite":

        @event.listens_for(eng, "connect")
        def _manual_transactions(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        @event.listens_for(eng, "begin")
        def _begin_snapshot(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN")  # WAL: a consistent snapshot for every read

    return eng


def _sqlite_read_only(path: str) -> Any:
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
    conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
    try:
        queries.probe_sqlite(conn)
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=30, check_same_thread=False)


@contextmanager
def reading(target: Target) -> Iterator[Connection]:
    """One connection in one consistent snapshot; errors become LedgerError (exit 75).

    A ledger whose schema is older than this once's is upgraded first (`once schema`), as the
    next `once run` would do, so that reports can read the columns they know.
    """
    if target.dialect == "sqlite" and not os.path.exists(target.path):
        raise NoLedger  # connecting would create an empty file
    try:
        eng = _engine(target)
    except ValueError as exc:  # SQLAlchemy cannot read the URL that once's parser took
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    yielded = False
    try:
        for tries in (1, 2):
            with eng.connect() as conn:
                if target.dialect != "sqlite":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    if tries == 2 or queries.schema_version(conn) >= tables.SCHEMA_VERSION:
                        yielded = True
                        yield conn
                        return
            tables.ensure(target)
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if yielded:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    except SQLAlchemyError as exc:
        if queries.is_missing_table(target, exc):
            raise NoLedger from None
        raise LedgerError(
            f"cannot read the ledger {target.redacted}: {describe(exc.orig or exc)}"
            if hasattr(exc, "orig") else f"cannot read the ledger {target.redacted}: {exc}"
        ) from exc
    finally:
        eng.dispose()


"""The read-only engines of the reports and of `once serve` (SQLAlchemy: never on the hot path).

Both open SQLite with manual transactions and begin each read with a plain BEGIN, so that
every read of a WAL ledger is one consistent snapshot (the server dialects get REPEATABLE
READ from their callers). `report_engine` reads SQLite through a connection that cannot
write; `serve_engine` bounds the connect and every statement by `once serve`'s --read-timeout.
"""

from __future__ import annotations

import math
from typing import Any, cast

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import NullPool

from once.ledger.reads import sqlite_read_only
from once.ledger.schema import engine_args
from once.ledger.url import Target


def report_engine(target: Target) -> Engine:
    """An engine for the reports: SQLite opens a deferred (read) transaction, never a write
    lock, on a read-only connection (once.ledger.reads.sqlite_read_only)."""
    if target.dialect != "sqlite":
        return create_engine(target.sqlalchemy_url, poolclass=NullPool, **engine_args(target))
    eng = create_engine("sqlite://", poolclass=NullPool,
                        creator=lambda: sqlite_read_only(target.path))
    return _snapshots(eng)


def serve_engine(target: Target, timeout: float) -> Engine:
    """An engine for `once serve`: connect and statements bounded by about `timeout`."""
    whole = max(1, math.ceil(timeout))
    if target.dialect == "sqlite":
        eng = _snapshots(create_engine(target.sqlalchemy_url, poolclass=NullPool,
                                       connect_args={"timeout": timeout}))

        @event.listens_for(eng, "connect")
        def _query_only(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA query_only = ON")  # after _snapshots' manual mode

        return eng
    args: dict[str, Any] = {**cast(dict[str, Any], engine_args(target)["connect_args"])}
    if target.dialect == "postgresql":
        args["connect_timeout"] = whole
    else:
        args.update(connect_timeout=whole, read_timeout=whole, write_timeout=whole)
    return create_engine(target.sqlalchemy_url, poolclass=NullPool, connect_args=args)


def _snapshots(eng: Engine) -> Engine:
    @event.listens_for(eng, "connect")
    def _manual_transactions(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(eng, "begin")
    def _begin_snapshot(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")  # WAL: a consistent snapshot for every read

    return eng

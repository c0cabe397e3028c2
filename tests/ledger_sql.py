"""Plain SQL against a test ledger, through the driver, for setting up and checking rows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from once.ledger import parse_url


def query(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement; return its rows as tuples (none for a statement without rows)."""
    target = parse_url(url)
    if target.dialect == "sqlite":
        import sqlite3

        conn = sqlite3.connect(target.path, isolation_level=None, timeout=30)
        try:
            cur = conn.execute(sql, params or ())
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
        finally:
            conn.close()
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.connect_args["conninfo"], autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
    import pymysql

    conn = pymysql.connect(**target.connect_args, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
    finally:
        conn.close()


def tables(url: str) -> set[str]:
    """The once_* tables the ledger holds (none: nothing was ever sent to it)."""
    if url.startswith("sqlite"):
        path = url.partition(":///")[2]
        if not os.path.exists(path):
            return set()
        rows = query(url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    elif url.startswith("postgresql"):
        rows = query(url, "SELECT table_name FROM information_schema.tables "
                          "WHERE table_schema = current_schema()")
    else:
        rows = query(url, "SHOW TABLES")
    return {str(name) for (name,) in rows if str(name).startswith("once_")}


def lock_run_rows(url: str) -> Any:
    """A connection of another session that holds every once_runs row's lock (SQLite: the
    database's write lock) until its rollback()."""
    target = parse_url(url)
    if target.dialect == "sqlite":
        import sqlite3

        conn: Any = sqlite3.connect(target.path, isolation_level=None, timeout=30)
        conn.execute("BEGIN IMMEDIATE")
        return conn
    if target.dialect == "postgresql":
        import psycopg

        conn = psycopg.connect(target.connect_args["conninfo"])
        conn.execute("SELECT * FROM once_runs FOR UPDATE")
        return conn
    import pymysql

    conn = pymysql.connect(**target.connect_args, autocommit=False)
    conn.cursor().execute("SELECT * FROM once_runs FOR UPDATE")
    return conn


def server_rows(port: int, sql: str, database: str | None = None) -> list[tuple[object, ...]]:
    """A statement's rows on a MariaDB server of the suite's own on loopback, as root."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", database=database,
                           autocommit=True, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return [tuple(row) for row in cur.fetchall()]
    finally:
        conn.close()


def scalar(url: str, sql: str, params: Any = None) -> Any:
    rows = query(url, sql, params)
    assert len(rows) == 1 and len(rows[0]) == 1, rows
    return rows[0][0]


def db_time(url: str, instant: datetime) -> Any:
    """An instant as the backend stores it (SQLite: text; MySQL: naive UTC; PostgreSQL)."""
    at = instant.astimezone(UTC)
    dialect = parse_url(url).dialect
    if dialect == "sqlite":
        return at.strftime("%Y-%m-%d %H:%M:%S.%f")
    return at if dialect == "postgresql" else at.replace(tzinfo=None)


def placeholders(sql: str, url: str) -> str:
    """`?` placeholders in the driver's style."""
    return sql if parse_url(url).dialect == "sqlite" else sql.replace("?", "%s")


@contextmanager
def tables_locked(url: str, *tables: str) -> Iterator[None]:
    """The tables locked by another session (PostgreSQL: ACCESS EXCLUSIVE, in an open
    transaction; MySQL: LOCK TABLES ... WRITE) until the block ends."""
    from once.ledger.connect import connect

    target = parse_url(url)
    postgres = target.dialect == "postgresql"
    holder = connect(target, 10, autocommit=not postgres)
    try:
        holder.cursor().execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE"
                                if postgres else
                                f"LOCK TABLES {', '.join(t + ' WRITE' for t in tables)}")
        yield
    finally:
        if postgres:
            holder.rollback()
        else:
            holder.cursor().execute("UNLOCK TABLES")
        holder.close()

"""Plain SQL against a test ledger, through the driver, for setting up and checking rows."""

from __future__ import annotations

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


def scalar(url: str, sql: str, params: Any = None) -> Any:
    rows = query(url, sql, params)
    assert len(rows) == 1 and len(rows[0]) == 1, rows
    return rows[0][0]

"""A Python job on the API, driven step by step from its stdin, for the tests that stop, kill
and take over a real process in the middle of its own transaction (test_api_isolation.py).

    python tests/api_owner.py URL JOB LEVEL STALE_AFTER

It claims JOB's current day, prints `claimed ATTEMPT`, then reads one step a line and answers
each with one line, `ok STEP` or `error STEP CLASS`:

- `begin`: on a connection of its own at isolation LEVEL (`default`: the server's), read the
  table `work` (the snapshot of REPEATABLE READ and SERIALIZABLE), then insert a row into it;
  answered `ok begin SESSION`, the server's id of that connection (0 on SQLite);
- `mark`: `run.finish_in(connection)`; `commit`, `rollback`: the connection's;
- `die`: SIGKILL itself, inside the block (nothing after it runs);
- `leave`: leave the block, then print `left` or `left-error CLASS`, and exit.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import once
from once.ledger import parse_url


def connect(url: str, level: str) -> Any:
    """The job's own connection to the ledger's database, in a transaction not yet begun."""
    target = parse_url(url)
    if target.dialect == "sqlite":
        import sqlite3

        return sqlite3.connect(target.path, timeout=30)  # implicit BEGIN before a write
    if target.dialect == "postgresql":
        import psycopg

        conn = psycopg.connect(target.connect_args["conninfo"])
        if level != "default":
            conn.isolation_level = getattr(psycopg.IsolationLevel, level.replace(" ", "_"))
        return conn
    import pymysql

    conn = pymysql.connect(**target.connect_args)
    if level != "default":
        conn.cursor().execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")
    return conn


def session(conn: Any) -> int:
    """The server's id of the connection (PostgreSQL's backend pid, MySQL's thread id)."""
    info = getattr(conn, "info", None)
    if info is not None:
        return int(info.backend_pid)
    thread_id = getattr(conn, "thread_id", None)
    return int(thread_id()) if thread_id is not None else 0


def execute(conn: Any, sql: str) -> None:
    cur = conn.cursor()
    cur.execute(sql)
    if cur.description:
        cur.fetchall()


def main() -> None:
    url, job, level, stale_after = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    setup = connect(url, "default")
    execute(setup, "CREATE TABLE IF NOT EXISTS work (x INTEGER)")
    setup.commit()
    setup.close()
    try:
        with once.claim(job, every="day", db=url, stale_after=stale_after) as run:
            print("claimed", run.attempt if run.won else 0, flush=True)
            conn = connect(url, level)
            steps = {
                "begin": lambda: (execute(conn, "SELECT count(*) FROM work"),
                                  execute(conn, "INSERT INTO work VALUES (1)")),
                "mark": lambda: run.finish_in(conn),
                "commit": conn.commit,
                "rollback": conn.rollback,
                "die": lambda: os.kill(os.getpid(), signal.SIGKILL),
            }
            for line in sys.stdin:
                step = line.strip()
                if step == "leave":
                    break
                try:
                    steps[step]()
                    print("ok", step, *([session(conn)] if step == "begin" else []), flush=True)
                except Exception as exc:
                    print("error", step, type(exc).__name__, flush=True)
    except Exception as exc:
        print("left-error", type(exc).__name__, flush=True)
        return
    print("left", flush=True)


if __name__ == "__main__":
    main()

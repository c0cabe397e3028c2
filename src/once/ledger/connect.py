"""Opening a connection to a PostgreSQL or MySQL/MariaDB ledger: the one way once connects.

The hot path's ledgers (`Ledger._open`), the survey's snapshots (once.ledger.fleet) and every
SQLAlchemy engine (as its creator=, once.ledger.schema.engine_on) connect through `connect`,
each with its own timeouts, so that a URL `once run` can use works the same for every
command, and SQLAlchemy never reads it (it cannot read libpq's host list, `h1:p1,h2:p2`).

PostgreSQL: libpq reads the URL itself, host lists and target_session_attrs included; when
several hosts fail, the error names each. MySQL/MariaDB: PyMySQL knows one host, so the URL's
hosts are tried here, in order: the first that accepts a connection wins, a host that cannot
be reached, does not answer in time or turns the login down is skipped, and when none is
left the error names each host and why.

Imports only the stdlib; the driver when it connects. Which way a target connects is its
backend's (Target.backend.connect, which calls postgres or mysql here): this module names no
backend of its own accord, and the registry (once.ledger.dialects) imports it, never the reverse.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

    from once.ledger.dbapi import Connection, MysqlConnection
    from once.ledger.url import Target


def connect(target: Target, timeout: float, statements: float | None = None,
            **options: Any) -> Connection:
    """A new DB-API connection to the target's server.

    timeout: bounds the connect to each host (PostgreSQL: whole seconds, rounded up, as libpq
    takes them).
    statements: MySQL/MariaDB, the driver's read and write timeouts (None: no bound; the
    handshake is bounded by `timeout` all the same). PostgreSQL's statements are bounded by
    their callers (a watchdog, SET LOCAL statement_timeout).
    options: for the driver (autocommit=...).
    """
    return target.backend.connect(target, timeout, statements, **options)


# -- PostgreSQL -----------------------------------------------------------------------------


def postgres(target: Target, timeout: float,
             options: dict[str, Any]) -> psycopg.Connection[TupleRow]:
    import psycopg

    args = dict(target.connect_args)
    conninfo = args.pop("conninfo")
    # prepare_threshold=None: no server-side prepared statements, so PgBouncer in
    # transaction pooling mode works.
    try:
        return psycopg.connect(conninfo, prepare_threshold=None,
                               connect_timeout=max(1, math.ceil(timeout)), **args, **options)
    except psycopg.OperationalError as exc:
        summary = tried_hosts(str(exc))
        if summary is None:
            raise
        raise type(exc)(summary, pgconn=exc.pgconn).with_traceback(None) from exc


# psycopg's error after several hosts failed: the last one's error, then one line per attempt,
# `- host: 'h', port: 'p', hostaddr: 'a': <its error>` (continued on lines that start with a tab).
_ATTEMPT = re.compile(r"^- host: '([^']*)', port: '([^']*)'[^:]*: (.*)$")


def tried_hosts(message: str) -> str | None:
    """psycopg's report of several failed hosts in one line, naming each host and why
    (`connection failed: tried h1:5432 (Connection refused), h2:5432 (timeout expired)`);
    None for any other error."""
    lines = message.splitlines()
    if "Multiple connection attempts failed. All failures were:" not in lines:
        return None
    tried = []
    for line in lines[lines.index("Multiple connection attempts failed. All failures were:"):]:
        found = _ATTEMPT.match(line)
        if found:
            host, port, why = found.groups()
            # `connection failed: connection to server at "h", port p failed: WHY`: the WHY
            where = f"[{host}]" if ":" in host else host
            tried.append(f"{where}:{port} ({why.rpartition(' failed: ')[2].strip()})")
    return f"connection failed: tried {', '.join(tried)}" if tried else None


# -- MySQL and MariaDB ----------------------------------------------------------------------


def mysql(target: Target, timeout: float, statements: float | None,
           options: dict[str, Any]) -> MysqlConnection:
    import pymysql

    if len(target.hosts) < 2:
        return _mysql_one(target.connect_args, timeout, statements, options)
    failures: list[tuple[str, Exception]] = []
    for host, port in target.hosts:
        try:
            return _mysql_one({**target.connect_args, "host": host, "port": port}, timeout,
                              statements, options)
        except pymysql.Error as exc:  # refused, silent, or the login turned down: the next
            where = f"[{host}]" if ":" in host else host
            failures.append((f"{where}:{port}", exc))
    last = failures[-1][1]
    code = last.args[0] if last.args and isinstance(last.args[0], int) else 2003
    text = ", ".join(f"{where} ({_reason(exc)})" for where, exc in failures)
    # The last host's class and code: a server restarting everywhere (refused) is retried
    # like one host that refuses, a login turned down is not.
    raise type(last)(code, f"no host accepted a connection: tried {text}") from last


def _reason(exc: Exception) -> str:
    """A PyMySQL error's message, without its code: (2003, "Can't connect ...")."""
    return str(exc.args[1]) if len(exc.args) > 1 else str(exc)


def _mysql_one(args: dict[str, Any], timeout: float, statements: float | None,
               options: dict[str, Any]) -> MysqlConnection:
    import pymysql
    from pymysql.constants import CLIENT

    # FOUND_ROWS: an UPDATE reports the rows it matched, not those it changed, so two
    # renewals within one clock tick still say "still ours" (SQLAlchemy sets it too).
    conn = pymysql.connect(**args, connect_timeout=timeout, client_flag=CLIENT.FOUND_ROWS,
                           read_timeout=statements or timeout,
                           write_timeout=statements or timeout, **options)
    if statements is None:
        # The handshake was bounded by `timeout` (a host that accepts the TCP connection but
        # never answers is given up on, not waited for); the statements are not. PyMySQL
        # reads these two on every read and write.
        conn._read_timeout = conn._write_timeout = None
    return cast("MysqlConnection", conn)  # PyMySQL has no types of its own

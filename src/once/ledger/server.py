"""What the ledger's server says of itself, for `once doctor`: its durability and replication
settings, whether this session reads a standby or a replica, whether this user may write
there, its packet limit, and, for a URL that names several hosts, who each host is (a server
identity: PostgreSQL's system_identifier, a Galera cluster's state UUID, a MySQL server's
own). Read-only reads on a connection of its own, every statement bounded; never on the hot
path. MySQL/MariaDB's are in once.ledger.server_mysql.

The facts come back as plain values (`Facts`), judged by once.report.doctor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from once.ledger.dialects import of
from once.ledger.fleet import Snapshot, _connect
from once.ledger.records import LedgerError, describe
from once.ledger.url import Target

if TYPE_CHECKING:
    import sqlite3

    import psycopg

    from once.ledger.dbapi import Connection, Cursor

Facts = dict[str, Any]  # a setting's value as the server reads it (once.report.doctor)

# How long one server's reads may take, and each host's connect in a host list.
TIMEOUT = 10.0
HOST_CONNECT_TIMEOUT = 5.0

POSTGRES = {
    "in_recovery": "SELECT pg_is_in_recovery()",
    "synchronous_commit": "SELECT current_setting('synchronous_commit')",
    "synchronous_standby_names": "SELECT current_setting('synchronous_standby_names')",
    "fsync": "SELECT current_setting('fsync')",
    "full_page_writes": "SELECT current_setting('full_page_writes')",
    # A role's or database's sessions made read-only (ALTER ROLE ... SET): no claim commits.
    "default_transaction_read_only": "SELECT current_setting('default_transaction_read_only')",
    "standbys": "SELECT count(*) FROM pg_stat_replication",
    "sync_standbys": ("SELECT count(*) FROM pg_stat_replication "
                      "WHERE sync_state IN ('sync', 'quorum')"),
    # A role without pg_read_all_stats sees each walsender's pid alone: which are synchronous
    # cannot be told.
    "hidden_standbys": "SELECT count(*) FROM pg_stat_replication WHERE state IS NULL",
}
# What claims, results and leads write (and every command reads), by table: a grant missing
# makes the fires that need it exit 75, whatever the server's settings. once_meta is read
# alone; a candidate that leaves is deleted. (`once prune` deletes too: not a fire's.)
WRITTEN = ("once_jobs", "once_runs", "once_attempts", "once_leases", "once_lead_terms",
           "once_lead_candidates")
NEEDED = {**{table: ("SELECT", "INSERT", "UPDATE") for table in WRITTEN},
          "once_lead_candidates": ("SELECT", "INSERT", "UPDATE", "DELETE"),
          "once_meta": ("SELECT",)}
# The grants this user lacks on the tables that are there (`INSERT on once_runs, ...`; NULL:
# none), those it holds on some columns alone (whether they cover what once writes is not
# told), and how many of once's tables are there (0: the first `once run` makes them).
_PAIRS = ", ".join(f"('{table}', '{grant}')" for table, grants in NEEDED.items()
                   for grant in grants)
_COLUMNS = ("CASE WHEN g = 'DELETE' THEN false "  # no column has DELETE
            "ELSE has_any_column_privilege(to_regclass(t), g) END")
POSTGRES_GRANTS = (
    "SELECT string_agg(g || ' on ' || t, ', ' ORDER BY t, g) FILTER (WHERE NOT "
    f"has_table_privilege(to_regclass(t), g) AND NOT {_COLUMNS}), "
    "string_agg(g || ' on ' || t, ', ' ORDER BY t, g) FILTER (WHERE NOT "
    f"has_table_privilege(to_regclass(t), g) AND {_COLUMNS}), count(DISTINCT t) "
    f"FROM (VALUES {_PAIRS}) AS needed (t, g) WHERE to_regclass(t) IS NOT NULL")

# Who a PostgreSQL server is: its cluster (a standby shares its primary's), and this
# server's start, which tells one server named twice from two of one cluster; and whether a
# standby has a WAL receiver (its pid is shown to every role): one without streams from no
# server, and promoted, lacks what its primary wrote since.
POSTGRES_IDENTITY = ("SELECT system_identifier::text, pg_postmaster_start_time()::text, "
                     "pg_is_in_recovery(), EXISTS (SELECT FROM pg_stat_wal_receiver) "
                     "FROM pg_control_system()")


def server_facts(target: Target) -> Facts:
    """The facts of the target's server (the one `once run` reaches), and of each host of a
    host list under "hosts"; LedgerError when the first cannot be read (exit 75)."""
    facts = FACTS[of(target).name](target)
    hosts = host_targets(target)
    if len(hosts) > 1:
        facts["hosts"] = [_host(label, host) for label, host in hosts]
    return facts


def host_targets(target: Target) -> list[tuple[str, Target]]:
    """Each host a URL names, as a target of its own (`host:port`, the target); [] or one
    for a URL of one host."""
    if target.dialect == "postgresql":
        return _postgres_hosts(target)
    if target.dialect == "mysql":
        from once.ledger.server_mysql import mysql_hosts

        return mysql_hosts(target)
    return []


def _host(label: str, target: Target) -> Facts:
    """One host's identity, or why it could not be read."""
    try:
        return {"host": label, **IDENTITY[target.dialect](target)}
    except LedgerError as exc:
        return {"host": label, "error": exc.cause or str(exc)}


def _server(target: Target, read: Callable[[Any], Facts], conn: Connection | None = None
            ) -> Facts:
    """read(connection) on a connection of its own (conn: one opened already), its
    statements bounded (TIMEOUT); every failure LedgerError."""
    try:
        conn = conn if conn is not None else of(target).serve_connection(target, TIMEOUT)
    except Exception as exc:
        raise _unreadable(target, exc) from exc
    try:
        with _bounded(target, conn):
            return read(conn)
    except LedgerError:
        raise
    except Exception as exc:
        raise _unreadable(target, exc) from exc
    finally:
        conn.close()


def _unreadable(target: Target, exc: BaseException) -> LedgerError:
    error = LedgerError(f"cannot read the server of {target.redacted}: {describe(exc)}")
    error.cause = describe(exc)
    return error


@contextmanager
def _bounded(target: Target, conn: Connection) -> Iterator[None]:
    """PostgreSQL's reads under the statements' watchdog (psycopg has no client-side timeout
    of its own); MySQL's connection has its read timeout, SQLite's file its busy timeout."""
    if target.dialect != "postgresql":
        yield
        return
    from once.ledger.watchdog import WATCHDOG, cancel, limits

    pg = cast("psycopg.Connection[Any]", conn)
    cancel_at, shut_at = limits(TIMEOUT / 2)
    token = WATCHDOG.arm(pg.pgconn.socket, cancel_at, shut_at,
                         lambda: cancel(pg, shut_at - cancel_at))
    try:
        yield
    finally:
        WATCHDOG.disarm(token)


def scalar(cur: Cursor, sql: str) -> Any:
    cur.execute(sql)
    row = cur.fetchone()
    return None if row is None else row[0]


# -- PostgreSQL -------------------------------------------------------------------------------


def _postgres_facts(target: Target) -> Facts:
    def read(conn: Connection) -> Facts:
        cur = conn.cursor()
        facts = {name: scalar(cur, sql) for name, sql in POSTGRES.items()}
        cur.execute(POSTGRES_GRANTS)
        missing, partial, facts["tables"] = cast("tuple[Any, ...]", cur.fetchone())
        facts["grants_missing"] = missing
        facts["grants_unsure"] = partial and f"granted on some columns alone: {partial}"
        # The reports' rule (once.ledger.fleet.REPLAY_LAG): 0 while it streams and has
        # replayed all it received, else the age of the latest commit it replayed.
        standby = Snapshot(target, conn).standby()
        facts["replay_lag"] = None if standby is None else standby.lag
        return facts

    return _server(target, read, _connect(target))


def _postgres_identity(target: Target) -> Facts:
    def read(conn: Connection) -> Facts:
        cur = conn.cursor()
        cur.execute(POSTGRES_IDENTITY)
        cluster, started, in_recovery, receiving = cast("tuple[Any, ...]", cur.fetchone())
        return {"identity": str(cluster), "server": f"{cluster} {started}",
                "in_recovery": bool(in_recovery), "receiving": bool(receiving)}

    connect = of(target).connect
    return _server(target, read, _opened(
        target, lambda: connect(target, HOST_CONNECT_TIMEOUT, autocommit=True)))


def _postgres_hosts(target: Target) -> list[tuple[str, Target]]:
    """libpq's host list (`h1:p1,h2:p2`, ?host=h1,h2&port=...), one target a host, any
    server there (target_session_attrs=any): libpq itself reads only the first that fits."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(target.connect_args["conninfo"])
    except Exception:  # libpq's own refusal: the connect says it
        return []
    lists = {key: str(params.get(key) or "").split(",") for key in ("host", "hostaddr", "port")}
    count = max(len(lists["host"]), len(lists["hostaddr"]))
    if count < 2:
        return []
    found = []
    for i in range(count):
        one: dict[str, Any] = {**params, "target_session_attrs": "any",
                               "load_balance_hosts": None,
                               **{key: _nth(values, i) for key, values in lists.items()}}
        where = str(one["host"] or one["hostaddr"] or "localhost")
        label = f"{f'[{where}]' if ':' in where else where}:{one['port'] or 5432}"
        conninfo = make_conninfo("", **{k: v for k, v in one.items() if v not in (None, "")})
        found.append((label, Target(target.backend, target.url, label,
                                    {**target.connect_args, "conninfo": conninfo})))
    return found


def _nth(values: list[str], i: int) -> str:
    """libpq's rule for a list: one value for every host, else one a host."""
    return values[0] if len(values) == 1 else (values[i] if i < len(values) else "")


# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_facts(target: Target) -> Facts:
    from once.ledger.schema import filesystem_type

    # The file's own place: a symbolic link (/run/shm -> /dev/shm) is followed.
    path = os.path.realpath(target.path)
    directory = os.path.dirname(path)
    facts: Facts = {"exists": os.path.exists(path), "filesystem": filesystem_type(directory),
                    "directory": directory, "writable": _writable(path)}
    if facts["exists"]:
        conn = cast("sqlite3.Connection", _connect(target))  # a SQLite target's
        try:
            facts["journal_mode"] = conn.execute("PRAGMA journal_mode").fetchone()[0]
        finally:
            conn.close()
    return facts


def _writable(path: str) -> bool:
    """Whether this user may write the ledger: the file, and its directory, where SQLite
    makes the -wal and -shm files (or, before the first use, the file itself)."""
    directory = os.path.dirname(path)
    while not os.path.exists(directory):  # made by the first use
        directory = os.path.dirname(directory)
    return os.access(directory, os.W_OK | os.X_OK) and (
        not os.path.exists(path) or os.access(path, os.R_OK | os.W_OK))


def _mysql_facts(target: Target) -> Facts:
    from once.ledger.server_mysql import mysql_facts, mysql_grants

    return _server(target, lambda conn: {**mysql_facts(conn), **mysql_grants(conn, NEEDED)})


def _mysql_identity(target: Target) -> Facts:
    from once.ledger.server_mysql import mysql_identity

    connect = of(target).connect
    return _server(target, mysql_identity,
                   _opened(target, lambda: connect(target, HOST_CONNECT_TIMEOUT, TIMEOUT)))


def _opened(target: Target, connect: Callable[[], Connection]) -> Connection:
    try:
        return connect()
    except Exception as exc:
        raise _unreadable(target, exc) from exc


# Each dialect's facts, by its name (once.ledger.dialects; once.report.doctor's rules judge them).
FACTS: dict[str, Callable[[Target], Facts]] = {
    "postgresql": _postgres_facts, "mysql": _mysql_facts, "sqlite": _sqlite_facts}
# Each host's identity in a host list.
IDENTITY: dict[str, Callable[[Target], Facts]] = {
    "postgresql": _postgres_identity, "mysql": _mysql_identity}

"""What the ledger's server says of itself, for `once doctor`: its durability and replication
settings, whether this session reads a standby, and its packet limit. Read-only reads on the
report path's connection (once.ledger.fleet), one dialect each; never on the hot path.

The facts come back as plain values (`Facts`), judged by once.report.doctor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from once.ledger.dialects import of
from once.ledger.fleet import _connect
from once.ledger.records import LedgerError, describe
from once.ledger.url import Target

if TYPE_CHECKING:
    import sqlite3

    from once.ledger.dbapi import Cursor

Facts = dict[str, Any]  # a setting's value as the server reads it (once.report.doctor)

POSTGRES = {
    "in_recovery": "SELECT pg_is_in_recovery()",
    "synchronous_commit": "SELECT current_setting('synchronous_commit')",
    "synchronous_standby_names": "SELECT current_setting('synchronous_standby_names')",
    "fsync": "SELECT current_setting('fsync')",
    "standbys": "SELECT count(*) FROM pg_stat_replication",
    "sync_standbys": ("SELECT count(*) FROM pg_stat_replication "
                      "WHERE sync_state IN ('sync', 'quorum')"),
    "replay_lag": ("SELECT extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 "
                   "WHERE pg_is_in_recovery()"),
}

MYSQL = {
    "innodb_flush_log_at_trx_commit": "SELECT @@innodb_flush_log_at_trx_commit",
    "sync_binlog": "SELECT @@sync_binlog",
    "log_bin": "SELECT @@log_bin",
    "read_only": "SELECT @@read_only",
    "max_allowed_packet": "SELECT @@max_allowed_packet",
}
# Galera's, where the server has them (MariaDB with wsrep; an error means no Galera).
GALERA = {
    "wsrep_on": "SELECT @@wsrep_on",
    "wsrep_sync_wait": "SELECT @@wsrep_sync_wait",
}
GALERA_STATUS = "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_status', " \
                "'wsrep_ready', 'wsrep_cluster_size')"


def server_facts(target: Target) -> Facts:
    """The facts of the target's server; LedgerError when it cannot be read (exit 75)."""
    return FACTS[of(target).name](target)


def _server(target: Target, read: Callable[[Cursor], Facts]) -> Facts:
    conn = _connect(target)
    try:
        return read(conn.cursor())
    except LedgerError:
        raise
    except Exception as exc:
        raise LedgerError(f"cannot read the server of {target.redacted}: {describe(exc)}"
                          ) from exc
    finally:
        conn.close()


def _scalar(cur: Cursor, sql: str) -> Any:
    cur.execute(sql)
    row = cur.fetchone()
    return None if row is None else row[0]


def _postgres_facts(target: Target) -> Facts:
    return _server(target, lambda cur: {name: _scalar(cur, sql) for name, sql in POSTGRES.items()})


def _mysql_facts(target: Target) -> Facts:
    return _server(target, lambda cur: {**{name: _scalar(cur, sql) for name, sql in MYSQL.items()},
                                        **_galera_facts(cur)})


def _galera_facts(cur: Cursor) -> Facts:
    try:
        facts = {name: _scalar(cur, sql) for name, sql in GALERA.items()}
    except Exception:  # no wsrep variables: not a Galera server
        return {"wsrep_on": 0}
    cur.execute(GALERA_STATUS)
    return {**facts, **{str(name).lower(): value for name, value in cur.fetchall()}}


def _sqlite_facts(target: Target) -> Facts:
    from once.ledger.schema import filesystem_type

    path = os.path.abspath(target.path)
    facts: Facts = {"exists": os.path.exists(path),
                    "filesystem": filesystem_type(os.path.dirname(path))}
    if facts["exists"]:
        conn = cast("sqlite3.Connection", _connect(target))  # a SQLite target's
        try:
            facts["journal_mode"] = conn.execute("PRAGMA journal_mode").fetchone()[0]
        finally:
            conn.close()
    return facts


# Each dialect's facts, by its name (once.ledger.dialects; once.report.doctor's rules judge them).
FACTS: dict[str, Callable[[Target], Facts]] = {
    "postgresql": _postgres_facts, "mysql": _mysql_facts, "sqlite": _sqlite_facts}

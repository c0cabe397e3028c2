"""once.ledger's rules that need no database: how a driver's exception is read (a table not
created yet, a transient failure, a busy server), which module open_ledger loads, and MySQL's
one transaction helper, against stand-ins for the drivers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from once.ledger import open_ledger, parse_url
from once.ledger.mysql import MysqlLedger
from once.ledger.records import busy_server, schema_missing, transient


class PgError(Exception):
    """psycopg's errors carry the SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"error {sqlstate}")
        self.sqlstate = sqlstate


class OperationalError(Exception):
    """A DB-API driver's connection failure, by its class name (as PyMySQL's)."""


def _sqlite_error(sql: str) -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a)")
    try:
        conn.execute(sql)
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError(f"{sql} did not fail")


@pytest.mark.parametrize("dialect, exc, table, column", [
    ("postgresql", PgError("42P01"), True, True),
    ("postgresql", PgError("42703"), False, True),
    ("postgresql", PgError("23505"), False, False),  # a unique violation
    ("mysql", Exception(1146, "Table 'test.once_runs' doesn't exist"), True, True),
    ("mysql", Exception(1054, "Unknown column 'output'"), False, True),
    ("mysql", Exception(1062, "Duplicate entry"), False, False),
    ("sqlite", _sqlite_error("SELECT * FROM once_runs"), True, True),
    ("sqlite", _sqlite_error("SELECT output FROM t"), False, True),
    ("sqlite", _sqlite_error("INSERT INTO t (output) VALUES (1)"), False, True),
    ("sqlite", _sqlite_error("SELEKT 1"), False, False),
])
def test_a_missing_table_or_column_is_read_per_dialect(dialect: str, exc: BaseException,
                                                       table: bool, column: bool) -> None:
    assert schema_missing(dialect, exc) is column
    assert schema_missing(dialect, exc, columns=False) is table


def test_another_dialects_mark_is_not_taken() -> None:
    assert not schema_missing("mysql", PgError("42P01"))
    assert not schema_missing("postgresql", Exception(1146, "no such table"))


def test_transient_failures_are_the_connections() -> None:
    assert transient(OperationalError("lost connection"))
    assert transient(ConnectionResetError())
    assert not transient(ValueError("bad value"))


def test_a_busy_server_is_worth_waiting_for() -> None:
    assert busy_server(PgError("53300"))
    assert busy_server(Exception(1040, "Too many connections"))
    assert busy_server(ConnectionRefusedError())
    assert busy_server(Exception("FATAL: the database system is starting up"))
    assert not busy_server(Exception(1045, "Access denied for user"))


def test_open_ledger_loads_only_the_urls_dialect() -> None:
    probe = ("import sys\n"
             "from once.ledger import open_ledger, parse_url\n"
             "ledger = open_ledger(parse_url('sqlite:///ledger.db'))\n"
             "print(type(ledger).__name__, *sorted(m for m in sys.modules\n"
             "      if m.startswith('once.ledger.') or m.split('.')[0] in\n"
             "      ('sqlalchemy', 'psycopg', 'pymysql', 'sqlite3')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "SqliteLedger"
    assert set(out[1:]) == {"once.ledger.base", "once.ledger.catchup", "once.ledger.records",
                            "once.ledger.sqlite", "once.ledger.url"}


class FakeMysql:
    """What MysqlLedger's transactions ask of a PyMySQL connection."""

    def __init__(self, fail_rollback: bool = False) -> None:
        self.said: list[str] = []
        self.fail_rollback = fail_rollback

    def cursor(self) -> FakeMysql:
        return self

    def execute(self, sql: str, params: Any = None) -> int:
        self.said.append(sql)
        if sql == "boom":
            raise OperationalError(2013, "Lost connection to MySQL server during query")
        return 1

    def commit(self) -> None:
        self.said.append("COMMIT")

    def rollback(self) -> None:
        self.said.append("ROLLBACK")
        if self.fail_rollback:
            raise OperationalError(2006, "MySQL server has gone away")


def _mysql(conn: FakeMysql) -> MysqlLedger:
    ledger = open_ledger(parse_url("mysql://u@db/once"))
    assert isinstance(ledger, MysqlLedger)
    ledger._conn = conn
    return ledger


def test_a_mysql_transaction_commits_when_its_block_ends() -> None:
    conn = FakeMysql()
    assert _mysql(conn)._renew({})
    assert conn.said == [MysqlLedger.RENEW, "COMMIT"]


@pytest.mark.parametrize("fail_rollback", [False, True])
def test_a_mysql_transaction_rolls_back_when_its_block_raises(fail_rollback: bool) -> None:
    conn = FakeMysql(fail_rollback)
    with pytest.raises(OperationalError, match="Lost connection"):  # not the rollback's error
        _mysql(conn)._write("boom", {})
    assert conn.said == ["boom", "ROLLBACK"]

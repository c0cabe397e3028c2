"""once.ledger's rules that need no database: how a driver's exception is read (a table not
created yet, whether a retry may cure it, a busy server), how a tail is cut to fit, which
module open_ledger loads, and MySQL's one transaction helper, against the drivers' own
exception classes or stand-ins for them."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from once.ledger import open_ledger, parse_url
from once.ledger.dialects import named
from once.ledger.mysql import MysqlLedger
from once.ledger.postgres import timeline_unreadable
from once.ledger.records import (
    Failure,
    busy_server,
    cut_tail,
    read_only_server,
    utf8_size,
)


def failure(dialect: str, exc: BaseException) -> Failure:
    return named(dialect).failure(exc)


def schema_missing(dialect: str, exc: BaseException, columns: bool = True) -> bool:
    return named(dialect).schema_missing(exc, columns)


class PgError(Exception):
    """psycopg's errors carry the SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"error {sqlstate}")
        self.sqlstate = sqlstate


class OperationalError(Exception):
    """A DB-API driver's connection failure, by its class name (as PyMySQL's)."""


class InterfaceError(Exception):
    """PyMySQL's error for a statement on a connection it closed: InterfaceError(0, '')."""


def _refused(conn: sqlite3.Connection, sql: str, params: tuple[object, ...] = (),
             *others: sqlite3.Connection) -> sqlite3.Error:
    """The error conn raises for sql (conn and others closed after); AssertionError if it ran."""
    try:
        conn.execute(sql, params)
    except sqlite3.Error as exc:
        return exc
    finally:
        for opened in (conn, *others):
            opened.close()
    raise AssertionError(f"{sql} did not fail")


def _sqlite_error(sql: str) -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a)")
    return _refused(conn, sql)


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


def _sqlite_locked() -> sqlite3.Error:
    uri = "file:once-locked?mode=memory&cache=shared"  # shared by two connections, no file
    holder = sqlite3.connect(uri, uri=True, isolation_level=None)
    holder.execute("CREATE TABLE t (a)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    other = sqlite3.connect(uri, uri=True, timeout=0)
    return _refused(other, "INSERT INTO t VALUES (2)", (), holder)


def _sqlite_too_big() -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
    return _refused(conn, "SELECT ?", ("x" * 2000,))


def _sqlite_read_only(tmp_path: Path) -> sqlite3.Error:
    path = tmp_path / "ro.db"
    sqlite3.connect(path).execute("CREATE TABLE t (a)").connection.close()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return _refused(conn, "INSERT INTO t VALUES (1)")


def _mysql_error(code: int, message: str) -> Exception:
    """PyMySQL's own exception for a server's error packet."""
    from pymysql import err

    try:
        err.raise_mysql_exception(b"\xff" + code.to_bytes(2, "little") + b"#HY000" +
                                  message.encode())
    except err.MySQLError as exc:
        return exc
    raise AssertionError("no exception")


def _pg(sqlstate: str, message: str = "") -> Exception:
    import psycopg

    return psycopg.errors.lookup(sqlstate)(message)


@pytest.mark.parametrize("exc, expected", [
    # the connection failed: worth the same statement on a fresh one
    (lambda: _pg_lost(), "unreachable"),
    (lambda: _pg("08006"), "unreachable"),
    (lambda: _pg("57P01", "terminating connection due to administrator command"),
     "unreachable"),  # pg_terminate_backend, a shutdown
    (lambda: ConnectionResetError(), "unreachable"),
    # the server said "not now"
    (lambda: _pg("40P01"), "transient"),  # deadlock
    (lambda: _pg("55P03"), "transient"),  # lock_timeout
    (lambda: _pg("53300"), "transient"),  # too many connections
    (lambda: _pg("25006"), "transient"),  # a standby: a failover under way
    # too slow, too large: a smaller statement may pass
    (lambda: _pg("57014", "canceling statement due to statement timeout"), "slow"),
    (lambda: _pg("54000"), "unfit"),
    (lambda: _encode_error(), "unfit"),  # psycopg, in a LATIN1 database's encoding
    (lambda: _pg("22P05", 'character with byte sequence 0xef 0xbf 0xbd in encoding "UTF8" '
                          'has no equivalent in encoding "LATIN1"'), "unfit"),
    # refused for good
    (lambda: _pg("42501"), "permanent"),  # permission denied
    (lambda: _pg("P0001", "raised by a trigger"), "permanent"),
    (lambda: _pg("23505"), "permanent"),
    (lambda: _pg_fatal('FATAL:  password authentication failed for user "once"'), "permanent"),
    (lambda: _pg_fatal('FATAL:  database "ops" does not exist'), "permanent"),
    (lambda: _pg_fatal("FATAL:  sorry, too many clients already"), "unreachable"),
])
def test_postgresql_failures_are_read_by_sqlstate(exc: Any, expected: str) -> None:
    assert failure("postgresql", exc()) == expected


def _encode_error() -> Exception:
    try:
        "\ufffd".encode("latin-1")
    except UnicodeEncodeError as exc:
        return exc
    raise AssertionError("encoded")


def _pg_lost() -> Exception:
    import psycopg

    return psycopg.OperationalError("consuming input failed: server closed the connection "
                                    "unexpectedly")


def _pg_fatal(message: str) -> Exception:
    import psycopg

    return psycopg.OperationalError(f"connection failed: connection to server at "
                                    f"\"127.0.0.1\", port 5432 failed: {message}")


@pytest.mark.parametrize("code, expected", [
    (2013, "unreachable"), (2006, "unreachable"), (2003, "unreachable"), (1927, "unreachable"),
    (1040, "transient"), (1205, "transient"), (1213, "transient"), (1290, "transient"),
    (1153, "unfit"), (1406, "unfit"), (1366, "unfit"),
    (1969, "slow"),
    (1045, "permanent"), (1049, "permanent"), (1142, "permanent"), (1644, "permanent"),
    (1064, "permanent"),
])
def test_mysql_failures_are_read_by_error_number(code: int, expected: str) -> None:
    # PyMySQL raises 1153 (max_allowed_packet) and 1644 (a trigger's SIGNAL) as
    # OperationalError, the class that used to mean "the connection failed".
    assert failure("mysql", _mysql_error(code, "the server's words")) == expected


def test_pymysqls_closed_connection_is_unreachable() -> None:
    from pymysql import err

    assert failure("mysql", err.InterfaceError(0, "")) == "unreachable"


def test_sqlite_failures_are_read_by_result_code(tmp_path: Path) -> None:
    assert failure("sqlite", _sqlite_locked()) == "transient"
    assert failure("sqlite", _sqlite_too_big()) == "unfit"
    assert failure("sqlite", _sqlite_read_only(tmp_path)) == "permanent"
    assert failure("sqlite", _sqlite_error("SELEKT 1")) == "permanent"  # an OperationalError


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_what_no_rule_knows_is_permanent(dialect: str) -> None:
    assert failure(dialect, ValueError("bad value")) == "permanent"


# -- cutting a tail --------------------------------------------------------------------------


def test_a_tail_that_fits_is_kept_whole() -> None:
    assert cut_tail("é" * 10, 20, "why") == "é" * 10


@pytest.mark.parametrize("budget", [120, 121, 122, 123, 200, 1000])
def test_a_cut_tail_keeps_its_end_at_a_character_and_says_so(budget: int) -> None:
    output = "start " + "aé€😀" * 100 + " the end"
    cut = cut_tail(output, budget, "the server takes less")
    note, _, kept = cut.partition("\n")
    assert utf8_size(cut) <= budget
    assert output.endswith(kept) and kept.endswith(" the end")
    assert note == (f"[once: {utf8_size(output) - utf8_size(kept)} bytes cut from the start "
                    "of this tail: the server takes less]")
    # Nothing cut that would have fitted: one more character does not.
    more = output[len(output) - len(kept) - 1:]
    assert utf8_size(note) + 1 + utf8_size(more) > budget


def test_a_budget_that_holds_only_the_note_keeps_the_note() -> None:
    assert cut_tail("x" * 100, 0, "refused") == "[once: 100 bytes cut from the start of this " \
                                               "tail: refused]\n"


def test_mysql_counts_a_tail_as_pymysql_escapes_it() -> None:
    import pymysql

    from once.ledger.mysql import _escaped_size

    value = "q'uo\"te \\ cr\r nul\0 z\x1a nl\n é€😀 \ufffd"
    assert _escaped_size(value) == len(pymysql.converters.escape_string(value).encode())


class PgMessage(PgError):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(sqlstate)
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


@pytest.mark.parametrize("exc", [
    PgError("25006"),  # cannot execute INSERT in a read-only transaction
    PgMessage("25006", "cannot execute SELECT FOR SHARE in a read-only transaction"),
    PgMessage("55000", "recovery is in progress"),  # pg_current_wal_lsn() on a standby
])
def test_a_standby_refusing_writes_is_worth_waiting_for(exc: BaseException) -> None:
    # A failover promotes it within seconds: renewals and final writes retry it.
    assert read_only_server(exc)
    assert failure("postgresql", exc) == "transient"


@pytest.mark.parametrize("exc", [PgError("23505"), PgError("42501"),
                                 PgMessage("55000", "wal_level must be set to 'logical'")])
def test_other_refusals_are_not_a_standbys(exc: BaseException) -> None:
    assert not read_only_server(exc)
    assert failure("postgresql", exc) == "permanent"


@pytest.mark.parametrize("exc, unreadable", [
    (PgMessage("42883", "function pg_current_wal_lsn() does not exist"), True),  # CockroachDB
    (PgMessage("0A000", "Function pg_current_wal_lsn() is currently not supported for "
                        "Aurora"), True),
    (PgMessage("55000", "wal_level must be set to 'logical'"), True),  # Aurora
    (PgMessage("42501", "permission denied for function pg_current_wal_lsn"), True),
    (PgMessage("22P02", "invalid hexadecimal digit"), True),
    (PgMessage("55000", "recovery is in progress"), False),  # a standby: said as one
    (PgMessage("25006", "cannot execute INSERT in a read-only transaction"), False),
    (PgError("42P01"), False),  # no table yet: created, then the same claim again
    (PgError("42703"), False),
    (PgMessage("55P03", "canceling statement due to lock timeout"), False),  # contention
    (PgError("55006"), False),
    (PgError("08006"), False),  # the connection
    (PgError("40001"), False),
    (OperationalError("server closed the connection unexpectedly"), False),
])
def test_a_claim_does_without_the_timeline_only_where_the_server_cannot_read_it(
        exc: BaseException, unreadable: bool) -> None:
    assert timeline_unreadable(exc) is unreadable


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
    # The registry of dialects and their error rules are the stdlib's alone: no driver.
    assert set(out[1:]) == {"once.ledger.base", "once.ledger.gap_rows", "once.ledger.records",
                            "once.ledger.dialect", "once.ledger.dialects", "once.ledger.errors",
                            "once.ledger.sqlite", "once.ledger.url"}


class FakeMysql:
    """What MysqlLedger's transactions ask of a PyMySQL connection."""

    def __init__(self, fail_rollback: bool = False) -> None:
        self.said: list[str] = []
        self.fail_rollback = fail_rollback
        self.open = True

    def cursor(self) -> FakeMysql:
        return self

    def execute(self, sql: str, params: Any = None) -> int:
        self.said.append(sql)
        if sql == "boom":
            self.open = False  # as PyMySQL force-closes a connection it lost
            raise OperationalError(2013, "Lost connection to MySQL server during query")
        return 1

    def commit(self) -> None:
        self.said.append("COMMIT")

    def autocommit(self, value: bool) -> None:
        if not self.open:
            raise InterfaceError(0, "")
        self.said.append(f"SET AUTOCOMMIT = {int(value)}")

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
    _mysql(conn)._write("UPDATE x", {})
    assert conn.said == ["UPDATE x", "COMMIT"]


def test_a_mysql_renewal_is_committed_by_the_server_as_it_ends() -> None:
    """No COMMIT sent apart: a process stopped after the UPDATE holds no row lock (real
    processes: tests/integration/test_stopped_process.py)."""
    conn = FakeMysql()
    assert _mysql(conn)._single(MysqlLedger.RENEW, {}) == 1
    assert conn.said == ["SET AUTOCOMMIT = 1", MysqlLedger.RENEW, "SET AUTOCOMMIT = 0"]


def test_a_mysql_renewal_that_loses_its_connection_says_why() -> None:
    """The connection the error closed is not asked to leave autocommit (PyMySQL would raise
    InterfaceError(0, '') over the real cause: an outside attacker's finding)."""
    conn = FakeMysql()
    with pytest.raises(OperationalError, match="Lost connection"):
        _mysql(conn)._single("boom", {})
    assert conn.said == ["SET AUTOCOMMIT = 1", "boom"]


@pytest.mark.parametrize("fail_rollback", [False, True])
def test_a_mysql_transaction_rolls_back_when_its_block_raises(fail_rollback: bool) -> None:
    conn = FakeMysql(fail_rollback)
    with pytest.raises(OperationalError, match="Lost connection"):  # not the rollback's error
        _mysql(conn)._write("boom", {})
    assert conn.said == ["boom", "ROLLBACK"]

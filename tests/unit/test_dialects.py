"""The dialects' contract (once.ledger.dialects), over every registered backend: each reads
its driver's representative errors as once must (a standby, a lost connection, a lost race, a
statement too large, a syntax error), binds an instant so that it reads back the same, is
found by its name, its URL schemes and its SQLAlchemy names; and a dialect none speaks is an
error, never a fall-through to SQLite. On the servers themselves:
tests/integration/test_dialect_servers.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from pymysql import err as mysql_err

from once.ledger import UnknownDialect, UrlError, open_ledger, parse_url, schema
from once.ledger.dialect import Dialect
from once.ledger.dialects import REGISTRY, named, of, of_sqlalchemy

DIALECTS = sorted(REGISTRY)
# A URL of each backend (nothing connects to it).
URLS = {"sqlite": "sqlite:///ledger.db", "postgresql": "postgresql://u@db.invalid/ops",
        "mysql": "mysql://u@db.invalid/ops"}


def test_every_registered_dialect_has_a_url_here() -> None:
    # A new backend is added to this contract by giving it a URL and a row per error below.
    assert set(URLS) == set(REGISTRY) == set(ERRORS)


# -- its driver's errors -----------------------------------------------------------------------


def _pg(sqlstate: str) -> BaseException:
    """psycopg's own class for a SQLSTATE (its .sqlstate is the class's)."""
    return psycopg.errors.lookup(sqlstate)("the server's words")


def _sqlite(make: Callable[[sqlite3.Connection], object], tmp: Path) -> BaseException:
    path = tmp / "probe.db"
    setup = sqlite3.connect(path)
    setup.execute("CREATE TABLE IF NOT EXISTS t (a)")
    setup.commit()
    setup.close()
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        make(conn)
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("it did not fail")


def _locked(conn: sqlite3.Connection) -> None:
    holder = sqlite3.connect(conn.execute("PRAGMA database_list").fetchone()[2],
                             isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("BEGIN IMMEDIATE")
    finally:
        holder.close()


def _read_only(conn: sqlite3.Connection) -> None:
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("INSERT INTO t VALUES (1)")


def _too_big(conn: sqlite3.Connection) -> None:
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
    conn.execute("SELECT ?", ("x" * 2000,))


# (what, the error, its failure, a lost race) per dialect: the tmp path makes SQLite's.
Case = tuple[str, Callable[[Path], BaseException], str, bool]
ERRORS: dict[str, list[Case]] = {
    "postgresql": [
        ("read-only", lambda _: _pg("25006"), "transient", False),
        ("standby", lambda _: psycopg.OperationalError("recovery is in progress"), "transient",
         False),
        ("lost connection", lambda _: psycopg.OperationalError("server closed the connection "
                                                                "unexpectedly"), "unreachable",
         False),
        ("terminated", lambda _: _pg("57P01"), "unreachable", False),
        ("deadlock", lambda _: _pg("40P01"), "transient", True),
        ("serialization", lambda _: _pg("40001"), "transient", True),
        ("too large", lambda _: _pg("54000"), "unfit", False),
        ("timeout", lambda _: _pg("57014"), "slow", False),
        ("syntax", lambda _: _pg("42601"), "permanent", False),
        ("refused", lambda _: psycopg.OperationalError('FATAL: password authentication failed '
                                                       'for user "u"'), "permanent", False),
    ],
    "mysql": [
        ("read-only", lambda _: mysql_err.OperationalError(1290, "--read-only option"),
         "transient", False),
        ("wsrep not ready", lambda _: mysql_err.OperationalError(1047, "WSREP has not yet "
                                                                 "prepared"), "transient",
         False),
        ("lost connection", lambda _: mysql_err.OperationalError(2013, "Lost connection"),
         "unreachable", False),
        ("closed", lambda _: mysql_err.InterfaceError(0, ""), "unreachable", False),
        ("deadlock", lambda _: mysql_err.OperationalError(1213, "Deadlock found"), "transient",
         True),
        ("lock wait", lambda _: mysql_err.OperationalError(1205, "Lock wait timeout"),
         "transient", True),
        ("too large", lambda _: mysql_err.OperationalError(1153, "max_allowed_packet"), "unfit",
         False),
        ("timeout", lambda _: mysql_err.OperationalError(1969, "max_statement_time"), "slow",
         False),
        ("syntax", lambda _: mysql_err.ProgrammingError(1064, "You have an error"), "permanent",
         False),
    ],
    "sqlite": [
        ("read-only", lambda t: _sqlite(_read_only, t), "permanent", False),  # a file's mode
        ("locked", lambda t: _sqlite(_locked, t), "transient", False),  # one writer: queued
        ("too large", lambda t: _sqlite(_too_big, t), "unfit", False),
        ("syntax", lambda t: _sqlite(lambda c: c.execute("SELEKT 1"), t), "permanent", False),
        ("disk I/O", lambda _: OSError(5, "Input/output error"), "unreachable", False),
    ],
}


@pytest.mark.parametrize(("dialect", "what", "make", "kind", "race"), [
    (name, *case) for name, cases in sorted(ERRORS.items()) for case in cases],
    ids=lambda v: v if isinstance(v, str) else "")
def test_each_dialect_reads_its_drivers_errors(dialect: str, what: str,
                                               make: Callable[[Path], BaseException],
                                               kind: str, race: bool, tmp_path: Path) -> None:
    exc = make(tmp_path)
    backend = named(dialect)
    assert backend.failure(exc) == kind, what
    assert backend.lost_race(exc) is race, what
    assert not backend.schema_missing(exc), what


@pytest.mark.parametrize("dialect", DIALECTS)
def test_what_no_rule_knows_is_permanent_and_no_race(dialect: str) -> None:
    backend = named(dialect)
    assert backend.failure(ValueError("bad value")) == "permanent"
    assert not backend.lost_race(ValueError("bad value"))
    assert not backend.made_elsewhere(ValueError("bad value"))


def test_only_mysql_meets_a_table_made_on_another_node() -> None:
    made = mysql_err.OperationalError(1050, "Table 'once_runs' already exists")
    assert named("mysql").made_elsewhere(made)
    assert not named("postgresql").made_elsewhere(_pg("42P07"))
    assert not named("sqlite").made_elsewhere(made)


# -- instants ------------------------------------------------------------------------------------


INSTANTS = [datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2))),
            datetime(1, 1, 1, 0, 0, tzinfo=UTC),  # the year 1: four digits on SQLite
            datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("instant", INSTANTS, ids=str)
def test_an_instant_reads_back_as_it_was_bound(dialect: str, instant: datetime) -> None:
    backend = named(dialect)
    back = backend.from_db(backend.bind(instant))
    assert back == instant and back.tzinfo is UTC
    typed = backend.bind_typed(instant)
    assert typed == instant.astimezone(UTC).replace(tzinfo=typed.tzinfo)
    assert (typed.tzinfo is UTC) == (dialect == "postgresql")  # naive UTC elsewhere


@pytest.mark.parametrize("dialect", [d for d in DIALECTS if REGISTRY[d].text_times])
def test_bound_text_sorts_as_the_instants_do(dialect: str) -> None:
    backend = named(dialect)
    assert sorted(INSTANTS, key=backend.bind) == sorted(INSTANTS)


def test_sqlite_instants_round_trip_through_the_driver(tmp_path: Path) -> None:
    backend = named("sqlite")
    conn = sqlite3.connect(tmp_path / "t.db")
    conn.execute("CREATE TABLE t (at TEXT)")
    for instant in INSTANTS:
        conn.execute("INSERT INTO t VALUES (?)", (backend.bind(instant),))
    read = [backend.from_db(v) for (v,) in conn.execute("SELECT at FROM t ORDER BY at")]
    assert read == sorted(INSTANTS)


# -- finding a dialect -----------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_dialect_is_found_by_its_name_schemes_and_sqlalchemy_names(dialect: str) -> None:
    backend = named(dialect)
    target = parse_url(URLS[dialect])
    assert target.dialect == dialect and target.backend is backend and of(target) is backend
    for scheme in backend.schemes:
        rest = URLS[dialect].partition("://")[2]
        assert of(parse_url(f"{scheme}://{rest}")) is backend
    for name in backend.sqlalchemy_names:
        assert of_sqlalchemy(name) is backend
    assert target.sqlalchemy_dialect.partition("+")[0] in backend.sqlalchemy_names
    assert backend.ledger_class().dialect == dialect
    assert open_ledger(target).backend is backend  # nothing connects before a statement
    ddl = list(schema.ddl(backend))
    assert any("CREATE TABLE IF NOT EXISTS once_runs" in sql for sql in ddl)
    # A backend's own statements after the tables': PostgreSQL's stored claim alone.
    assert any("CREATE OR REPLACE FUNCTION" in sql for sql in ddl) == (dialect == "postgresql")


def test_no_scheme_and_no_name_is_held_twice() -> None:
    schemes = [s for d in REGISTRY.values() for s in d.schemes]
    assert len(schemes) == len(set(schemes))
    assert all(isinstance(d, Dialect) and name == d.name for name, d in REGISTRY.items())


def test_an_unknown_dialect_is_an_error_not_sqlite() -> None:
    # A Target holds the backend its URL's scheme found: a name reaches the registry only here.
    for find in (lambda: named("oracle"), lambda: of_sqlalchemy("oracle")):
        with pytest.raises(UnknownDialect, match="oracle") as caught:
            find()
        assert isinstance(caught.value, UrlError)  # a usage error, exit 2, as a bad URL
    with pytest.raises(UrlError, match="use sqlite, postgresql, mysql or mariadb"):
        parse_url("oracle://u@h/db")

"""Ledger URLs that name several hosts (docs/concepts/ledger.md): what parse_url makes of them,
what it refuses, and the one-line report of several hosts that failed."""

from __future__ import annotations

import socket

import pytest

from once.ledger import UrlError, parse_url
from once.ledger.connect import tried_hosts


@pytest.mark.parametrize("url, hosts", [
    ("mysql://u@h1:3311,h2:3312/db", (("h1", 3311), ("h2", 3312))),
    ("mariadb://u@H1,h2:3307,h3/db", (("h1", 3306), ("h2", 3307), ("h3", 3306))),
    ("mysql://u@[::1]:3311,[fe80::2],db.example:3313/db",
     (("::1", 3311), ("fe80::2", 3306), ("db.example", 3313))),
    ("mysql://u@h/db", (("h", 3306),)),
    ("mysql://u@/db", (("localhost", 3306),)),
    ("mysql://u@:3307/db", (("localhost", 3307),)),
])
def test_mysql_hosts_in_order(url: str, hosts: tuple[tuple[str, int], ...]) -> None:
    target = parse_url(url)
    assert target.hosts == hosts
    # The first host's arguments, as PyMySQL takes them (a one-host URL as before).
    assert (target.connect_args["host"], target.connect_args["port"]) == hosts[0]


def test_a_host_list_keeps_the_password_out_of_every_name() -> None:
    mysql = parse_url("mysql://app:s3cret@h1:3311,h2:3312/db")
    assert mysql.redacted == "mysql://app:***@h1:3311,h2:3312/db"
    assert mysql.connect_args["password"] == "s3cret"
    pg = parse_url("postgresql://app:s3cret@h1:5432,h2:5433/ops?target_session_attrs=read-write")
    assert pg.redacted == "postgresql://app:***@h1:5432,h2:5433/ops?target_session_attrs=read-write"


@pytest.mark.parametrize("url", [
    "postgresql://app@h1:5432,h2:5433/ops?target_session_attrs=read-write",
    "postgresql://app@h1,h2/ops", "postgresql://app@/ops?host=h1,h2&port=5432,5433",
    "postgresql://app@127.0.0.1:5441,%2Ftmp%2Fpg:5432/ops",
    "postgresql://app@[::1]:5432,[::2]:5433/ops",
])
def test_libpq_reads_a_postgres_host_list_itself(url: str) -> None:
    # The URL goes to libpq as it is (only a +driver suffix goes): no host is dropped.
    assert parse_url(url).connect_args["conninfo"] == url
    assert parse_url(url.replace("postgresql://", "postgresql+psycopg://")).connect_args[
        "conninfo"] == url


@pytest.mark.parametrize("url, why", [
    ("mysql://u@h1,,h2/db", "empty host"),
    ("mysql://u@h1,/db", "empty host"),
    ("mysql://u@h1:3306,h2:0/db", "bad port '0'"),
    ("mysql://u@h1:x,h2:3306/db", r"bad port \(not a number\)"),
    ("mysql://u@h1:3306,h2:/db", "bad port ''"),
    ("mysql://u@h1:1:3306/db", "brackets"),
    ("mysql://u@::1/db", "brackets"),
    ("mysql://u@h1,h2/db?unix_socket=/run/mysqld.sock", "unix_socket"),
    ("postgresql://u@h1:5432,h2:99999/db", "bad port '99999'"),
    ("postgresql://u@h1:,h2/db", "bad port ''"),
    ("postgresql://u@/db?host=h1:5432&host=h2:5432", r"\?host= given 2 times"),
    ("postgresql://u@/db?host=h1&port=5432&port=5433", r"\?port= given 2 times"),
    ("postgresql://u@/db?hostaddr=10.0.0.1&HOSTADDR=10.0.0.2", r"\?hostaddr= given 2 times"),
])
def test_host_lists_refused(url: str, why: str) -> None:
    with pytest.raises(UrlError, match=why):
        parse_url(url)


def test_the_engine_names_the_driver_alone() -> None:
    # SQLAlchemy is told the dialect and driver, never the URL: once opens the connections.
    assert parse_url("mariadb://u@h1,h2/db").sqlalchemy_dialect == "mariadb+pymysql"
    assert parse_url("mysql+pymysql://u@h/db").sqlalchemy_dialect == "mysql+pymysql"
    assert parse_url("postgres://u@h1,h2/db").sqlalchemy_dialect == "postgresql+psycopg"
    assert parse_url("sqlite:///x.db?mode=ro").sqlalchemy_dialect == "sqlite"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_several_postgres_hosts_that_fail_are_named_in_one_line() -> None:
    # psycopg's own message, from a real attempt at two closed ports (no server needed).
    import psycopg

    first, second = _closed_port(), _closed_port()
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(f"postgresql://u@127.0.0.1:{first},127.0.0.1:{second}/db",
                        connect_timeout=5)
    assert tried_hosts(str(caught.value)) == (
        f"connection failed: tried 127.0.0.1:{first} (Connection refused), "
        f"127.0.0.1:{second} (Connection refused)")


def test_one_failed_host_keeps_psycopgs_own_message() -> None:
    assert tried_hosts('connection failed: connection to server at "h", port 1 failed: '
                       'Connection refused\n\tIs the server running on that host?') is None

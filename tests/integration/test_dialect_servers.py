"""The dialects' contract on the servers themselves (tests/unit/test_dialects.py holds the rest):
each backend's read-only snapshot connection reads and refuses a write as its error rules
say, its reports' and once serve's connections read one snapshot, and an instant bound by it
selects and reads back the period a run recorded. An unknown scheme exits 2, as a bad URL."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from helpers import run_once
from once.ledger import engines, history, parse_url
from once.ledger.dialects import of
from once.ledger.fleet import Snapshot
from once.ledger.schema import SCHEMA_VERSION
from once.periods import Period, every
from once.report.snapshot import reading
from once.serve.data import read_only

# A write on the read-only snapshot connection: a standby's or a READ ONLY transaction's
# refusal (a failover may cure it), or a file opened read-only (nothing will).
REFUSED = {"postgresql": "transient", "mysql": "transient", "sqlite": "permanent"}
WRITE = "UPDATE once_meta SET value = value WHERE name = 'schema_version'"


@pytest.fixture
def ran(once_env: dict[str, str]) -> Period:
    """One done run of `day`, yesterday's period; the tables exist."""
    result = run_once("run", "--job", "day", "--every", "day", "--lag", "1", "--", "true",
                      env=once_env)
    assert result.returncode == 0, result.stderr
    day = every("day", "UTC")
    return day.previous(day.containing(datetime.now(UTC)))


def test_the_snapshot_connection_reads_and_refuses_a_write(ledger_url: str, ran: Period
                                                           ) -> None:
    target = parse_url(ledger_url)
    backend = of(target)
    conn = backend.snapshot_connection(target)
    try:
        for sql in backend.snapshot_begin:
            backend.fetch(conn, sql, {})
        version = backend.fetch(conn, "SELECT value FROM once_meta WHERE name = "
                                "'schema_version'", {})
        assert int(version[0][0]) == SCHEMA_VERSION
        with pytest.raises(Exception) as caught:
            backend.fetch(conn, WRITE, {})
        assert backend.failure(caught.value) == REFUSED[backend.name]
    finally:
        backend.rollback(conn)
        conn.close()


def test_an_instant_bound_by_the_dialect_finds_the_run_it_recorded(ledger_url: str,
                                                                    ran: Period) -> None:
    target = parse_url(ledger_url)
    with Snapshot.open(target) as snap:
        assert snap.done_counts([("day", ran.start, ran.end)]) == [1]
        assert snap.done_counts([("day", ran.end, every("day", "UTC").next(ran).end)]) == [0]
        row, = snap.last_done_rows(["day"])
        assert (row.period_start, row.period_end) == (ran.start, ran.end)
        assert row.period_start.tzinfo is UTC
        assert abs((snap.db_now() - datetime.now(UTC)).total_seconds()) < 60


def test_a_snapshot_reads_open_rows_with_catch_ups_statements(ledger_url: str,
                                                               once_env: dict[str, str],
                                                               ran: Period) -> None:
    """The reports' gap finder reads through a Snapshot what catch-up reads through its
    Ledger, the heartbeat's age (by the database's clock) included."""
    failed = run_once("run", "--job", "day", "--every", "day", "--max-attempts", "1", "--",
                      "false", env=once_env)
    assert failed.returncode == 1, failed.stderr
    day = every("day", "UTC")
    today = day.next(ran)
    with Snapshot.open(parse_url(ledger_url)) as snap:
        rows = snap.rows("day")
        assert rows.open_rows(ran.start, day.next(today).start) == [
            (today.key, today.start, "failed", 1, False, 0)]
        assert rows.span() == (ran.start, today.start)


def test_the_reports_and_serve_connect_as_their_dialect_says(ledger_url: str, ran: Period
                                                             ) -> None:
    target = parse_url(ledger_url)
    with reading(target) as conn:
        assert engines.schema_version(conn) == SCHEMA_VERSION
        assert abs((engines.db_now(conn, target) - datetime.now(UTC)).total_seconds()) < 60
        assert [r.job for r in history.job_rows(conn, None, None)] == ["day"]
    with read_only(target, 5) as conn:
        rows = history.attempt_rows(conn, "day", 5)
        assert [(r.period, r.status) for r in rows] == [(ran.key, "done")]
        with pytest.raises(Exception) as caught:
            conn.exec_driver_sql(WRITE)
        orig = getattr(caught.value, "orig", caught.value)
        assert of(target).failure(orig) in ("transient", "permanent")


@pytest.mark.parametrize("url", ["oracle://u@db.invalid/ops", "mssql+pyodbc://u@h/db"])
def test_an_unknown_dialect_exits_2_as_a_bad_url(url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path)
    for command, *rest in (("run", "--job", "x", "--every", "day", "--", "true"), ("status",),
                           ("schema",)):
        args = (command, "--db", url, *rest)
        result = run_once(*args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "use sqlite, postgresql, mysql or mariadb" in result.stderr

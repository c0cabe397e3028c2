"""Schema: DDL without a database, additive upgrades of an older ledger."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from child_log import stable_day
from helpers import run_either, wait_for
from ledger_sql import query, scalar, tables, tables_locked
from once.ledger import parse_url
from once.ledger.fleet import UNUSUAL_TALLY
from once.ledger.pg_claim import stored_claim
from once.ledger.rows import UNUSUAL_ATTEMPT
from once.ledger.schema import SCHEMA_VERSION
from once.ledger.tables import BEFORE_5
from procs import start_once

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.mark.parametrize("url", ["sqlite:////nonexistent/dir/ledger.db",
                                 "postgresql://u:secret@db.invalid/ops",
                                 "mariadb://u:secret@db.invalid/ops"])
def test_schema_sql_prints_ddl_and_touches_no_database(url: str, once_env: dict[str, str]
                                                      ) -> None:
    result = run_either("schema", "--sql", "--db", url, env=once_env)
    assert result.returncode == 0, result.stderr
    for table in ("once_runs", "once_attempts", "once_jobs", "once_meta"):
        assert f"CREATE TABLE IF NOT EXISTS {table}" in result.stdout
    if url.startswith("mariadb"):
        assert "utf8mb4_bin" in result.stdout and "DATETIME(6)" in result.stdout
    if url.startswith("postgresql"):
        assert "TIMESTAMP WITH TIME ZONE" in result.stdout
        assert f"CREATE OR REPLACE FUNCTION {stored_claim().name}(" in result.stdout
    else:
        assert "once_claim_" not in result.stdout


def test_an_older_ledger_is_upgraded_in_place(once_env: dict[str, str], ledger_url: str
                                              ) -> None:
    assert run_either("run", "--job", "old", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0
    # Make it look like a version 1 ledger: no shards/state columns, no command hashes.
    for table, column in (("once_jobs", "shards"), ("once_jobs", "state"),
                          ("once_jobs", "state_version"), ("once_attempts", "command_hash")):
        query(ledger_url, f"ALTER TABLE {table} DROP COLUMN {column}")
    query(ledger_url, "UPDATE once_meta SET value = '1' WHERE name = 'schema_version'")
    result = run_either("run", "--job", "old", "--every", "day", "--", "true", env=once_env)
    assert result.returncode == 0, result.stderr
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name='schema_version'") == str(
        SCHEMA_VERSION)
    assert query(ledger_url, "SELECT shards, state_version FROM once_jobs") == [(1, 0)]
    assert len(query(ledger_url, "SELECT * FROM once_runs WHERE status='done'")) == 2


def test_a_version_3_ledger_gets_the_output_column(once_env: dict[str, str], ledger_url: str
                                                   ) -> None:
    assert run_either("run", "--job", "old", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0
    query(ledger_url, "ALTER TABLE once_attempts DROP COLUMN output")
    query(ledger_url, "UPDATE once_meta SET value = '3' WHERE name = 'schema_version'")
    result = run_either("run", "--job", "old", "--every", "day", "--", "echo", "upgraded",
                      env=once_env)
    assert result.returncode == 0, result.stderr
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name='schema_version'") == str(
        SCHEMA_VERSION)
    assert query(ledger_url, "SELECT output FROM once_attempts ORDER BY started_at") == [
        (None,), ("upgraded\n",)]


def test_a_newer_ledger_is_refused(once_env: dict[str, str], ledger_url: str) -> None:
    assert run_either("schema", env=once_env).returncode == 0
    query(ledger_url, "UPDATE once_meta SET value = '999' WHERE name = 'schema_version'")
    query(ledger_url, "DROP TABLE once_runs")  # so that once must look at the schema
    result = run_either("run", "--job", "x", "--every", "day", "--", "true", env=once_env)
    assert result.returncode == 75
    assert "newer than this once knows" in result.stderr


def _indexes(url: str, table: str = "once_runs") -> set[str]:
    if url.startswith("sqlite"):
        sql = f"SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}'"
    elif url.startswith("postgres"):
        sql = f"SELECT indexname FROM pg_indexes WHERE tablename = '{table}'" \
              " AND schemaname = current_schema()"
    else:
        sql = "SELECT DISTINCT index_name FROM information_schema.statistics" \
              f" WHERE table_name = '{table}' AND table_schema = DATABASE()"
    return {row[0] for row in query(url, sql)}


def test_the_done_rows_index_is_postgresqls_and_once_schema_adds_it(
        once_env: dict[str, str], ledger_url: str) -> None:
    # The reports count done rows through once_runs_done_start on PostgreSQL (a partial index);
    # SQLite and MySQL have none. A ledger made before it gets it from `once schema`.
    assert run_either("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    postgres = ledger_url.startswith("postgres")
    assert ("once_runs_done_start" in _indexes(ledger_url)) is postgres
    assert "once_runs_job_status_start" in _indexes(ledger_url)
    if not postgres:
        return
    query(ledger_url, "DROP INDEX once_runs_done_start")
    assert not _stored_claims(ledger_url)  # a lone fire's claim never makes it
    assert run_either("schema", env=once_env).returncode == 0
    assert "once_runs_done_start" in _indexes(ledger_url)
    assert _stored_claims(ledger_url) == [(stored_claim().name,)]  # nor does `once schema`
    sql = run_either("schema", "--sql", env=once_env).stdout
    assert "once_runs_done_start ON once_runs (job, period_start) WHERE status = 'done'" in sql


def test_the_unusual_attempts_index_is_sqlites_and_postgresqls_and_once_schema_adds_it(
        once_env: dict[str, str], ledger_url: str) -> None:
    # once metrics counts each job's attempts in indexes and reads those that are not plain
    # through once_attempts_unusual (a partial index: SQLite and PostgreSQL; MySQL has none).
    # A ledger made before it gets it from `once schema`; the read goes through it.
    assert run_either("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    partial = parse_url(ledger_url).dialect in ("sqlite", "postgresql")
    assert ("once_attempts_unusual" in _indexes(ledger_url, "once_attempts")) is partial
    if not partial:
        return
    query(ledger_url, "DROP INDEX once_attempts_unusual")
    assert run_either("schema", env=once_env).returncode == 0
    assert "once_attempts_unusual" in _indexes(ledger_url, "once_attempts")
    sql = run_either("schema", "--sql", env=once_env).stdout
    assert (f"once_attempts_unusual ON once_attempts (job) WHERE {UNUSUAL_ATTEMPT}") in sql
    tally = UNUSUAL_TALLY.format(names="'j'")
    if ledger_url.startswith("sqlite"):
        plan = " ".join(str(row) for row in query(ledger_url, f"EXPLAIN QUERY PLAN {tally}"))
    else:  # on a small table PostgreSQL reads it whole, unless told not to
        import psycopg

        with psycopg.connect(parse_url(ledger_url).connect_args["conninfo"]) as conn:
            conn.execute("SET enable_seqscan = off")
            plan = " ".join(str(row) for row in conn.execute(f"EXPLAIN {tally}"))
    assert "once_attempts_unusual" in plan, plan


def test_a_first_use_after_one_killed_half_way_makes_what_it_left_unmade(
        once_env: dict[str, str], ledger_url: str) -> None:
    # A first use killed half-way on MySQL leaves tables made (each CREATE commits on its own)
    # without their indexes and without the schema version, as here; the first uses waiting
    # on its schema lock then, or `once schema`, make the rest. (Elsewhere a first use is one
    # transaction: this never happens, and is made good the same way.)
    assert run_either("schema", env=once_env).returncode == 0
    query(ledger_url, "DROP INDEX once_runs_job_status_start"
          + (" ON once_runs" if ledger_url.startswith(("mysql", "mariadb")) else ""))
    query(ledger_url, "DELETE FROM once_meta")
    assert run_either("schema", env=once_env).returncode == 0
    assert "once_runs_job_status_start" in _indexes(ledger_url)
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name = 'schema_version'") \
        == str(SCHEMA_VERSION)


def _stored_claims(url: str) -> list[tuple[str]]:
    return query(url, "SELECT proname FROM pg_proc WHERE proname LIKE 'once_claim_%%' "
                      "AND pronamespace = current_schema()::regnamespace")


def _set_version(url: str, version: int) -> None:
    query(url, f"UPDATE once_meta SET value = '{version}' WHERE name = 'schema_version'")


NEWER_REFUSED = [
    ("run", "--job", "j", "--every", "day"),
    ("run", "--job", "fresh", "--every", "day"),
    ("catchup", "--job", "j", "--every", "day", "--since", "2026-01-01"),
    ("rerun", "--job", "j", "--period", "2026-01-01", "--reason", "x"),
]


@pytest.mark.parametrize("argv", NEWER_REFUSED, ids=lambda argv: " ".join(argv[:3]))
def test_a_newer_ledger_refuses_every_claim_with_nothing_run_or_written(
        argv: tuple[str, ...], once_env: dict[str, str], ledger_url: str, tmp_path) -> None:
    # The version check rides in the claim's own statement: the tables are all there, so no
    # missing column leads once to the version (before schema 5 it ran and recorded here).
    assert run_either("run", "--job", "j", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0
    _set_version(ledger_url, SCHEMA_VERSION + 1)
    before = query(ledger_url, "SELECT job, fence, fire_count FROM once_jobs ORDER BY job")
    attempts = query(ledger_url, "SELECT count(*) FROM once_attempts")
    marker = tmp_path / "ran"
    result = run_either(*argv, "--", "touch", str(marker), env=once_env)
    assert result.returncode == 75, result.stderr
    assert (f"the ledger's schema is version {SCHEMA_VERSION + 1}, newer than this once knows "
            f"({SCHEMA_VERSION}): upgrade once") in result.stderr
    assert not marker.exists()
    assert query(ledger_url, "SELECT job, fence, fire_count FROM once_jobs ORDER BY job") == before
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == attempts


@pytest.mark.parametrize("argv", [("status",), ("check",), ("history", "j"), ("logs", "j"),
                                  ("metrics",), ("prune", "--older-than", "1d"),
                                  ("state", "j", "--set", "x")],
                         ids=lambda argv: argv[0])
def test_a_newer_ledger_refuses_every_report_and_write(argv: tuple[str, ...],
                                                        once_env: dict[str, str],
                                                        ledger_url: str) -> None:
    assert run_either("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    _set_version(ledger_url, SCHEMA_VERSION + 1)
    rows = query(ledger_url, "SELECT job, period, status FROM once_runs")
    result = run_either(*argv, env=once_env)
    assert result.returncode == 75, (result.stdout, result.stderr)
    assert f"newer than this once knows ({SCHEMA_VERSION})" in result.stderr
    assert query(ledger_url, "SELECT job, period, status FROM once_runs") == rows
    assert query(ledger_url, "SELECT state FROM once_jobs") == [(None,)]


def _as_version_4(url: str) -> None:
    """The ledger as schema 4 left it: once_jobs.fires and last_fire_at, no claim_id in
    once_attempts, no once_runs.interrupted, version 4."""
    mysql = url.startswith("mariadb")
    for old, new, kind in (("fires", "fire_count", "BIGINT"),
                           ("last_fire_at", "last_fired_at", "DATETIME(6)")):
        query(url, f"ALTER TABLE once_jobs CHANGE {new} {old} {kind} NOT NULL" if mysql
              else f"ALTER TABLE once_jobs RENAME COLUMN {new} TO {old}")
    query(url, "ALTER TABLE once_runs DROP COLUMN interrupted")
    _drop_attempts_claim_id(url)
    _set_version(url, 4)


def _drop_attempts_claim_id(url: str) -> None:
    if url.startswith("mariadb"):
        query(url, "ALTER TABLE once_attempts DROP CONSTRAINT once_attempts_claim_id")
    query(url, "ALTER TABLE once_attempts DROP COLUMN claim_id")


# A `(state)` row as an older `once state --set` records it: no claim_id.
_OLDER_STATE_ROW = ("INSERT INTO once_attempts (job, period, attempt, fence, owner, status, "
                    "started_at, finished_at, outcome, reason) SELECT job, '(state)', {}, "
                    "fence, 'older', 'done', created_at, created_at, 'state-set', 'x' "
                    "FROM once_jobs")


def _claim_ids_required(url: str) -> None:
    """No insert into once_attempts without a claim_id, on MySQL/MariaDB not in a session
    without strict mode either (which would fill in '')."""
    with pytest.raises(Exception, match="claim_id"):
        query(url, _OLDER_STATE_ROW.format(99))
    if url.startswith("mariadb"):
        import pymysql

        conn = pymysql.connect(**parse_url(url).connect_args, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_mode = ''")
                with pytest.raises(pymysql.err.OperationalError, match="once_attempts_claim_id"):
                    cur.execute(_OLDER_STATE_ROW.format(99))
        finally:
            conn.close()
    assert query(url, "SELECT count(*) FROM once_attempts WHERE attempt = 99") == [(0,)]


def test_a_version_4_ledger_is_gated_against_older_claims_by_the_upgrade(
        once_env: dict[str, str], ledger_url: str) -> None:
    # Every claim of a once before schema 5 names once_jobs.fires: the rename makes each of
    # them meet a missing column and refuse the ledger with its own message.
    assert run_either("run", "--job", "j", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0
    _as_version_4(ledger_url)
    assert run_either("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name='schema_version'") == str(
        SCHEMA_VERSION)
    assert query(ledger_url, "SELECT fence, fire_count FROM once_jobs") == [(2, 2)]
    for gone in ("fires", "last_fire_at"):  # older claims, older prunes
        with pytest.raises(Exception, match=gone):
            query(ledger_url, f"SELECT {gone} FROM once_jobs")
    assert len(query(ledger_url, "SELECT last_fired_at FROM once_jobs")) == 1
    # The attempt made before the upgrade has BEFORE_5, the one after its claim's own id.
    ids = [i for (i,) in query(ledger_url, "SELECT claim_id FROM once_attempts ORDER BY period")]
    assert ids[0] == BEFORE_5 and len(ids) == 2 and ids[1] != BEFORE_5, ids
    _claim_ids_required(ledger_url)
    # The rows schema 4 left count no interruption; a retry rule reads them as before.
    today = datetime.now(UTC).date()
    assert query(ledger_url, "SELECT period, interrupted FROM once_runs ORDER BY period") == [
        ((today - timedelta(days=1)).isoformat(), 0), (today.isoformat(), 0)]


def test_a_state_set_records_a_claim_id_of_its_own(once_env: dict[str, str],
                                                   ledger_url: str) -> None:
    assert run_either("state", "j", "--set", "a", "--every", "day",
                    env=once_env).returncode == 0
    assert run_either("state", "j", "--set", "b", env=once_env).returncode == 0
    ids = query(ledger_url, "SELECT claim_id FROM once_attempts WHERE period = '(state)'")
    assert len({i for (i,) in ids}) == 2 and BEFORE_5 not in {i for (i,) in ids}, ids


@pytest.mark.parametrize("shape", ["nullable", "cut short"])
def test_a_claim_id_left_optional_is_made_required(shape: str, once_env: dict[str, str],
                                                   ledger_url: str) -> None:
    """`nullable`: once_attempts.claim_id as schema 5 was first written (NULL allowed), with
    a row of an older state --set. `cut short` (MySQL/MariaDB): the upgrade killed between
    its two steps on once_attempts, the column added with BEFORE_5 as its default but the
    default not yet dropped nor the CHECK added (each ALTER commits on its own)."""
    mysql = ledger_url.startswith("mariadb")
    if shape == "cut short" and not mysql:
        pytest.skip("PostgreSQL and SQLite upgrade in one transaction")
    assert run_either("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    _drop_attempts_claim_id(ledger_url)
    if shape == "nullable":
        query(ledger_url, "ALTER TABLE once_attempts ADD COLUMN claim_id VARCHAR(32)")
        query(ledger_url, _OLDER_STATE_ROW.format(1))
    else:
        query(ledger_url, "ALTER TABLE once_attempts ADD COLUMN claim_id VARCHAR(32) NOT NULL "
                          f"DEFAULT '{BEFORE_5}'")
        query(ledger_url, "INSERT INTO once_meta (name, value) VALUES ('upgrade_from', '4')")
    assert run_either("schema", env=once_env).returncode == 0
    assert query(ledger_url, "SELECT claim_id FROM once_attempts WHERE claim_id IS NULL "
                             "OR claim_id = ''") == []
    assert len(query(ledger_url, f"SELECT 1 FROM once_attempts WHERE claim_id = '{BEFORE_5}'")
               ) == (2 if shape == "nullable" else 1)
    assert query(ledger_url, "SELECT value FROM once_meta WHERE name = 'upgrade_from'") == []
    _claim_ids_required(ledger_url)
    assert run_either("run", "--job", "j", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0


def test_a_schema_2_owners_running_row_keeps_its_jobs_promise_through_the_upgrade(
        once_env: dict[str, str], ledger_url: str, tmp_path) -> None:
    # Schema 2 stored no promise in the row: the upgrade used to give it 300 s, so a caller
    # could take over an owner that promised an hour while it still renewed.
    assert run_either("run", "--job", "j", "--every", "day", "--stale-after", "1h", "--",
                    "true", env=once_env).returncode == 0
    query(ledger_url, "UPDATE once_runs SET status = 'running', finished_at = NULL")
    _age_heartbeat(ledger_url, 600)
    query(ledger_url, "ALTER TABLE once_runs DROP COLUMN stale_after")
    _as_version_4(ledger_url)
    _set_version(ledger_url, 2)
    marker = tmp_path / "ran"
    result = run_either("run", "--job", "j", "--every", "day", "--stale-after", "1s", "--",
                      "touch", str(marker), env=once_env)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()  # held: ten minutes without a beat is within its hour
    assert query(ledger_url, "SELECT status, attempt, stale_after FROM once_runs") == [
        ("running", 1, 3600.0)]


def _age_heartbeat(url: str, seconds: int) -> None:
    if url.startswith("sqlite"):
        value = f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-{seconds} seconds') || '000'"
    elif url.startswith("postgres"):
        value = f"clock_timestamp() - interval '{seconds} seconds'"
    else:
        value = f"UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND"
    query(url, f"UPDATE once_runs SET heartbeat_at = {value}")


@contextmanager
def _creation_held(url: str) -> Iterator[Callable[[], bool]]:
    """The ledger's table creation held up until the block ends; yields whether a session of
    this ledger's waits for it. PostgreSQL: once_meta locked, which the creation reads and a
    claim's first try against a missing table never reaches (it stops at parsing). MySQL:
    the schema lock, GET_LOCK('once_schema'), as another creation would hold it (every
    claim's try reads once_meta: it would wait too, and time out)."""
    target = parse_url(url)
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.connect_args["conninfo"]) as conn:
            conn.execute("LOCK TABLE once_meta IN ACCESS EXCLUSIVE MODE")
            yield lambda: bool(scalar(url, "SELECT count(*) FROM pg_locks WHERE NOT granted "
                                           "AND relation = 'once_meta'::regclass"))
            conn.rollback()
        return
    import pymysql

    conn = pymysql.connect(**target.connect_args, autocommit=True)
    try:
        conn.cursor().execute("SELECT GET_LOCK('once_schema', 10)")
        yield lambda: bool(scalar(url, "SELECT COUNT(*) FROM information_schema.processlist "
                                       "WHERE db = DATABASE() AND state = 'User lock'"))
        conn.cursor().execute("SELECT RELEASE_LOCK('once_schema')")
    finally:
        conn.close()


def test_a_claim_held_up_past_its_stale_after_before_its_last_try_still_runs(
        backend: Any, ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    # The owner's lease counts from its claim's last try (the one that stamped the
    # heartbeat), not from the call: a claim that first had to create a table, and waited
    # for the creation's lock to do it, used to find its deadline gone (exit 70, not run).
    if backend.dialect == "sqlite":
        pytest.skip("SQLite's wait for its write lock cannot be watched from outside")
    assert run_either("schema", env=once_env).returncode == 0
    query(ledger_url, "DROP TABLE once_runs")  # the first try meets it missing
    ran = tmp_path / "ran"
    with _creation_held(ledger_url) as waiting:
        owner = start_once("run", "--job", "held", "--every", "day", "--stale-after", "2s",
                           "--", "sh", "-c", f"echo x >> {ran}", env=once_env)
        wait_for(waiting, what="the table creation to wait")
        time.sleep(2.5)  # the fault itself: held up past --stale-after
    _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert ran.read_text() == "x\n"
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


@sqlite_only
def test_sqlite_a_first_use_waits_for_another_first_uses_write_lock(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """A first use turns the new file to WAL: the switch reads the file's header, then asks
    for the write lock, which SQLite refuses at once (no busy timeout: the wait could
    deadlock) while another connection holds it, as another first use does in its claim's
    BEGIN IMMEDIATE or in its own switch. The fire exited 75 (`cannot create the ledger's
    tables ...: database is locked`); it must wait for the lock, as for any other."""
    from once.ledger.sqlite import _PeriodLocks

    path = parse_url(ledger_url).path
    stable_day()
    # The other first use: the write lock on the new file, held until told.
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    # The fire's period, held by a claimer mid-claim: the fire only reads before it creates
    # the tables (it meets them missing), so that its first write is the WAL switch.
    claimer = _PeriodLocks(path)
    assert claimer.acquire(("k", datetime.now(UTC).date().isoformat()))
    ran = tmp_path / "ran"
    try:
        fire = start_once("run", "--job", "k", "--every", "day", "--", "touch", str(ran),
                          env=once_env)
        locks = os.path.realpath(path + ".locks")
        wait_for(lambda: fire.poll() is not None or _has_open(fire.pid, locks),
                 what="the fire to try the period's lock")
        # Past its switch to WAL (the first statement of its table creation), made while
        # the lock is held: the fire waits there, where it exited 75 at once.
        time.sleep(2)
        assert fire.poll() is None, fire.communicate()[1]
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        claimer.close()
    _, err = fire.communicate(timeout=60)
    assert fire.returncode == 0, err
    assert ran.exists()
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]
    assert scalar(ledger_url, "PRAGMA journal_mode") == "wal"


def _has_open(pid: int, path: str) -> bool:
    try:
        return any(os.path.realpath(fd) == path for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # it has ended
        return False


# -- the suite's own ledgers (tests/conftest.py ledger_url) ----------------------------------


def test_a_test_gets_an_empty_ledger(ledger_url: str) -> None:
    assert tables(ledger_url) == set()


@pytest.mark.tables_made
def test_a_test_marked_tables_made_gets_the_tables_of_this_once(ledger_url: str) -> None:
    assert {"once_runs", "once_attempts", "once_jobs"} <= tables(ledger_url)
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name = 'schema_version'") \
        == str(SCHEMA_VERSION)


@pytest.mark.tables_made(False)
def test_tables_made_false_keeps_the_ledger_empty(ledger_url: str) -> None:
    assert tables(ledger_url) == set()


def _half_upgraded(url: str) -> None:
    """The ledger as an upgrade from 4 leaves it on MySQL when its step fails (each DDL is
    committed on its own: the new version and `upgrade_from` were written first): version 5,
    upgrade_from 4, once_runs.interrupted (version 5's) not there yet."""
    query(url, "ALTER TABLE once_runs DROP COLUMN interrupted")
    query(url, "INSERT INTO once_meta (name, value) VALUES ('upgrade_from', '4')")


def test_a_half_made_upgrade_is_finished_by_the_next_final_write(
        ledger_url: str, once_env: dict[str, str]) -> None:
    # An upgrade whose step failed (a table another session kept locked past its 60 s)
    # left the ledger saying version 5 without the step: `once run` ran its command, then
    # could not record it (the column it names missing), and the period ran again once its
    # claim went stale (an attacker's finding). The final write, as a claim does, makes
    # what is missing first. (The reports still fail on the missing column until then: read
    # as the version the upgrade began from, a read-only user's reports failed, and `once
    # serve`, which does not upgrade, too, on a ledger with nothing left to make.)
    day = ["--every", "day"]
    assert run_either("run", "--job", "before", *day, "--", "true",
                      env=once_env).returncode == 0
    _half_upgraded(ledger_url)
    result = run_either("run", "--job", "after", *day, "--", "true", env=once_env)
    assert result.returncode == 0, result.stderr
    assert query(ledger_url, "SELECT status, attempt FROM once_runs WHERE job = 'after'") == [
        ("done", 1)]
    assert query(ledger_url, "SELECT value FROM once_meta WHERE name = 'upgrade_from'") == []
    assert run_either("check", "before", "after", env=once_env).returncode == 0


@pytest.mark.tables_made
def test_an_upgrade_behind_a_table_another_session_locked_says_so(
        ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # It said `cannot create the ledger's tables in URL: (psycopg.errors.LockNotAvailable)
    # canceling statement due to lock timeout`: SQLAlchemy's wrapping, a driver's class name,
    # no word of the lock (an attacker's finding).
    target = parse_url(ledger_url)
    if target.dialect == "sqlite":
        pytest.skip("SQLite's busy wait is its write lock's: test_schema's others")
    from once.ledger import LedgerError, schema

    monkeypatch.setattr(schema, "LOCK_WAIT", 1.0)
    with tables_locked(ledger_url, "once_meta"), pytest.raises(LedgerError) as refused:
        schema.ensure(target)
    # `once prune` the same (it said the server's words alone).
    env = {"ONCE_DATABASE_URL": ledger_url, "PATH": os.environ["PATH"]}
    with tables_locked(ledger_url, "once_runs"):
        pruned = run_either("prune", "--older-than", "1d", env=env)
    assert pruned.returncode == 75, pruned.stderr
    assert pruned.stderr.startswith(f"once: cannot prune the ledger {target.redacted}: waited "
                                    f"past 1s on a lock another session holds ("), pruned.stderr
    said = str(refused.value)
    assert said.startswith(f"cannot create the ledger's tables in {target.redacted}: waited "
                           f"past 1s on a lock another session holds ("), said
    assert "psycopg" not in said and "pymysql" not in said and "sqlalchemy" not in said, said

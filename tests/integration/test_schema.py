"""Schema: DDL without a database, additive upgrades of an older ledger."""

from __future__ import annotations

import pytest

from helpers import run_once
from ledger_sql import query, scalar
from once.ledger.schema import SCHEMA_VERSION


@pytest.mark.parametrize("url", ["sqlite:////nonexistent/dir/ledger.db",
                                 "postgresql://u:secret@db.invalid/ops",
                                 "mariadb://u:secret@db.invalid/ops"])
def test_schema_sql_prints_ddl_and_touches_no_database(url: str, once_env: dict[str, str]
                                                      ) -> None:
    result = run_once("schema", "--sql", "--db", url, env=once_env)
    assert result.returncode == 0, result.stderr
    for table in ("once_runs", "once_attempts", "once_jobs", "once_meta"):
        assert f"CREATE TABLE IF NOT EXISTS {table}" in result.stdout
    if url.startswith("mariadb"):
        assert "utf8mb4_bin" in result.stdout and "DATETIME(6)" in result.stdout
    if url.startswith("postgresql"):
        assert "TIMESTAMP WITH TIME ZONE" in result.stdout


def test_an_older_ledger_is_upgraded_in_place(once_env: dict[str, str], ledger_url: str
                                              ) -> None:
    assert run_once("run", "--job", "old", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0
    # Make it look like a version 1 ledger: no shards/state columns, no command hashes.
    for table, column in (("once_jobs", "shards"), ("once_jobs", "state"),
                          ("once_jobs", "state_version"), ("once_attempts", "command_hash")):
        query(ledger_url, f"ALTER TABLE {table} DROP COLUMN {column}")
    query(ledger_url, "UPDATE once_meta SET value = '1' WHERE name = 'schema_version'")
    result = run_once("run", "--job", "old", "--every", "day", "--", "true", env=once_env)
    assert result.returncode == 0, result.stderr
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name='schema_version'") == str(
        SCHEMA_VERSION)
    assert query(ledger_url, "SELECT shards, state_version FROM once_jobs") == [(1, 0)]
    assert len(query(ledger_url, "SELECT * FROM once_runs WHERE status='done'")) == 2


def test_a_version_3_ledger_gets_the_output_column(once_env: dict[str, str], ledger_url: str
                                                   ) -> None:
    assert run_once("run", "--job", "old", "--every", "day", "--lag", "1", "--", "true",
                    env=once_env).returncode == 0
    query(ledger_url, "ALTER TABLE once_attempts DROP COLUMN output")
    query(ledger_url, "UPDATE once_meta SET value = '3' WHERE name = 'schema_version'")
    result = run_once("run", "--job", "old", "--every", "day", "--", "echo", "upgraded",
                      env=once_env)
    assert result.returncode == 0, result.stderr
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name='schema_version'") == str(
        SCHEMA_VERSION)
    assert query(ledger_url, "SELECT output FROM once_attempts ORDER BY started_at") == [
        (None,), ("upgraded\n",)]


def test_a_newer_ledger_is_refused(once_env: dict[str, str], ledger_url: str) -> None:
    assert run_once("schema", env=once_env).returncode == 0
    query(ledger_url, "UPDATE once_meta SET value = '999' WHERE name = 'schema_version'")
    query(ledger_url, "DROP TABLE once_runs")  # so that once must look at the schema
    result = run_once("run", "--job", "x", "--every", "day", "--", "true", env=once_env)
    assert result.returncode == 75
    assert "newer than this once knows" in result.stderr


def _indexes(url: str) -> set[str]:
    if url.startswith("sqlite"):
        sql = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'once_runs'"
    elif url.startswith("postgres"):
        sql = "SELECT indexname FROM pg_indexes WHERE tablename = 'once_runs'" \
              " AND schemaname = current_schema()"
    else:
        sql = "SELECT DISTINCT index_name FROM information_schema.statistics" \
              " WHERE table_name = 'once_runs' AND table_schema = DATABASE()"
    return {row[0] for row in query(url, sql)}


def test_the_done_rows_index_is_postgresqls_and_once_schema_adds_it(
        once_env: dict[str, str], ledger_url: str) -> None:
    # The reports count done rows through once_runs_done_start on PostgreSQL (a partial index);
    # SQLite and MySQL have none. A ledger made before it gets it from `once schema`.
    assert run_once("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    postgres = ledger_url.startswith("postgres")
    assert ("once_runs_done_start" in _indexes(ledger_url)) is postgres
    assert "once_runs_job_status_start" in _indexes(ledger_url)
    if not postgres:
        return
    query(ledger_url, "DROP INDEX once_runs_done_start")
    assert run_once("schema", env=once_env).returncode == 0
    assert "once_runs_done_start" in _indexes(ledger_url)
    sql = run_once("schema", "--sql", env=once_env).stdout
    assert "once_runs_done_start ON once_runs (job, period_start) WHERE status = 'done'" in sql

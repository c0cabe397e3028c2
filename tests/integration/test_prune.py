"""`once prune` and ONCE_DATABASE_URL_FILE on every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run_either
from ledger_sql import query

pytestmark = pytest.mark.tables_made  # none is about a first use


def test_prune_keeps_running_failed_and_the_done_rows_after_them(once_env: dict[str, str],
                                                                 ledger_url: str) -> None:
    args = ["catchup", "--job", "p", "--every", "day", "--since", "2026-01-01", "--until",
            "2026-01-05", "-q", "--"]
    assert run_either(*args, "true", env=once_env).returncode == 0
    query(ledger_url, "UPDATE once_runs SET status='failed' WHERE period='2026-01-02'")
    query(ledger_url, "UPDATE once_runs SET status='running' WHERE period='2026-01-03'")
    # Everything finished "long ago" by the database's own clock.
    query(ledger_url, "UPDATE once_runs SET finished_at = period_start")
    query(ledger_url, "UPDATE once_attempts SET finished_at = started_at - "
          + ("INTERVAL '400 days'" if ledger_url.startswith("postgresql") else
             "INTERVAL 400 DAY" if ledger_url.startswith("mariadb") else "0"))
    if ledger_url.startswith("sqlite"):
        query(ledger_url, "UPDATE once_attempts SET finished_at = '2025-01-01 00:00:00.000000'")
    dry = run_either("prune", "--older-than", "30d", "--dry-run", env=once_env)
    assert dry.returncode == 0, dry.stderr
    # 2026-01-04 stays: catch-up and check count it to know that it is done. So does the
    # finished attempt that holds the running 2026-01-03 (a done marker of finish_in).
    assert dry.stdout.startswith("would delete 1 done rows, 4 attempts and 0 lead terms")
    assert len(query(ledger_url, "SELECT * FROM once_runs")) == 5
    done = run_either("prune", "--older-than", "30d", env=once_env)
    assert done.returncode == 0 and done.stdout.startswith("deleted 1 done rows")
    left = dict(query(ledger_url, "SELECT period, status FROM once_runs"))
    assert left == {"2026-01-02": "failed", "2026-01-03": "running", "2026-01-04": "done",
                    "2026-01-05": "done"}
    assert query(ledger_url, "SELECT period FROM once_attempts") == [("2026-01-03",)]


def test_database_url_from_a_file(once_env: dict[str, str], ledger_url: str,
                                  tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(ledger_url + "\n")
    env = {k: v for k, v in once_env.items() if k != "ONCE_DATABASE_URL"}
    env["ONCE_DATABASE_URL_FILE"] = str(url_file)
    assert run_either("run", "--job", "f", "--every", "day", "--", "true", env=env).returncode == 0
    assert query(ledger_url, "SELECT job FROM once_runs") == [("f",)]
    env["ONCE_DATABASE_URL_FILE"] = str(tmp_path / "missing")
    missing = run_either("run", "--job", "f", "--every", "day", "--", "true", env=env)
    assert missing.returncode == 2 and missing.stderr.startswith("once: cannot read")


def test_prune_deletes_the_output_stored_with_the_attempts(once_env: dict[str, str],
                                                           ledger_url: str) -> None:
    args = ["catchup", "--job", "talk", "--every", "day", "--since", "2026-01-01", "--until",
            "2026-01-03", "-q", "--", "echo", "secret token 1234"]
    assert run_either(*args, env=once_env).returncode == 0
    stored = query(ledger_url, "SELECT output FROM once_attempts")
    assert stored == [("secret token 1234\n",)] * 3
    query(ledger_url, "UPDATE once_runs SET finished_at = period_start")
    query(ledger_url, "UPDATE once_attempts SET finished_at = "
          + ("started_at - INTERVAL '400 days'" if ledger_url.startswith("postgresql") else
             "started_at - INTERVAL 400 DAY" if ledger_url.startswith("mariadb") else
             "'2025-01-01 00:00:00.000000'"))
    assert run_either("prune", "--older-than", "30d", env=once_env).returncode == 0
    # The latest done row stays (catch-up resumes from it); no attempt, no output is left.
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == [(0,)]
    assert run_either("logs", "talk", env=once_env).returncode == 2


def test_prune_of_a_ledger_without_done_rows_keeps_everything(once_env: dict[str, str],
                                                              ledger_url: str) -> None:
    """Failed rows only, and periods since with no row (gaps): nothing can go, and prune says
    so (it used to survey every job for an empty list of them, and fail on the first)."""
    args = ["catchup", "--job", "f", "--every", "day", "--since", "2026-01-01", "--until",
            "2026-01-03", "--keep-going", "-q", "--", "false"]
    assert run_either(*args, env=once_env).returncode == 1
    result = run_either("prune", "--older-than", "1s", env=once_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("deleted 0 done rows"), result.stdout
    assert len(query(ledger_url, "SELECT * FROM once_runs")) == 3

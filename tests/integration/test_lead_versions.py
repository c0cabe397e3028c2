"""`once lead`'s tables are a compatible addition (docs/how-to/upgrading.md): a `once` of the
same schema version from before them keeps claiming its periods, and reading its reports, on a
ledger that has them, whichever made the ledger first. Real older build of this repository
(tests/versions.py builds it), every backend.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import ONCE
from versions import build

# The last commit of main before `once lead` (schema 5, as this once).
BEFORE_LEAD = "766b1ae414ada57e7db68599ac139e41f39d1e32"


@pytest.fixture(scope="session")
def older_once() -> str:
    return str(build(BEFORE_LEAD) / "bin" / "once")


def _ok(once: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([once, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{once} {' '.join(args)}: {done.stderr}"
    return done


def _tables(ledger_url: str) -> set[str]:
    from once.ledger import parse_url
    from once.ledger.dialects import of

    target = parse_url(ledger_url)
    backend = of(target)
    conn = backend.report_connection(target)
    try:
        if target.dialect == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        elif target.dialect == "postgresql":
            sql = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        else:
            sql = "SELECT table_name FROM information_schema.tables " \
                  "WHERE table_schema = DATABASE()"
        return {str(r[0]) for r in backend.fetch(conn, sql, {})}
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("first", ["lead", "older"])
def test_an_older_once_of_the_same_schema_runs_beside_once_lead(
        older_once: str, once_env: dict[str, str], ledger_url: str, tmp_path: Path,
        first: str) -> None:
    marks = tmp_path / "ran"
    job = ["--every", "minute", "--", "sh", "-c", f'echo "$ONCE_JOB" >> {marks}']
    if first == "older":
        _ok(older_once, once_env, "run", "--job", "old-first", *job)
        assert "once_leases" not in _tables(ledger_url)
    # The lease tables are made by `once lead`'s first statement, the schema version kept.
    led = _ok(ONCE, once_env, "lead", "--name", "beat", "--", "sh", "-c", "echo $ONCE_TERM")
    assert led.stdout.strip() == "1"
    assert {"once_leases", "once_lead_terms", "once_lead_candidates"} <= _tables(ledger_url)
    # The older once claims, runs and reports on that ledger; this once's run too.
    _ok(older_once, once_env, "run", "--job", "old", *job)
    _ok(ONCE, once_env, "run", "--job", "new", *job)
    assert set(marks.read_text().split()) >= {"old", "new"}
    for report in (["status"], ["check", "old"], ["history", "old"], ["schema"],
                   ["prune", "--older-than", "1d", "--dry-run"]):
        _ok(older_once, once_env, *report)
    assert _schema_version(ledger_url) == "5"


def _schema_version(ledger_url: str) -> str:
    from once.ledger import parse_url
    from once.ledger.dialects import of

    target = parse_url(ledger_url)
    backend = of(target)
    conn = backend.report_connection(target)
    try:
        rows = backend.fetch(conn, "SELECT value FROM once_meta "
                             "WHERE name = 'schema_version'", {})
    finally:
        conn.close()
    return str(rows[0][0])

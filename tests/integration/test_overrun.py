"""A hung run is loud: once check, once status and once metrics on a real ledger while a live
attempt (the Python API's, heartbeating) has held a due period longer than the period lasts."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import once
from helpers import run_once
from ledger_sql import db_time, placeholders, query


def test_a_live_attempt_holding_a_due_period_is_critical(ledger_url: str,
                                                         once_env: dict[str, str]) -> None:
    past = datetime.now(UTC) - timedelta(minutes=3)
    with once.claim("sync", every="minute", db=ledger_url, stale_after=30, now=past) as run:
        assert run.won
        # It started two minutes ago: longer than its minute (a sleep would take as long).
        query(ledger_url, placeholders("UPDATE once_runs SET started_at = ?", ledger_url),
              (db_time(ledger_url, datetime.now(UTC) - timedelta(minutes=2)),))
        check = run_once("check", "--json", env=once_env)
        status = run_once("status", "--json", env=once_env)
        metrics = run_once("metrics", env=once_env)
    assert check.returncode == 2, check.stdout + check.stderr
    overruns = [f for f in json.loads(check.stdout) if f["problem"] == "overrun"]
    assert [f["period"] for f in overruns] == [run.period.key]
    assert overruns[0]["line"].startswith(f"CRITICAL sync {run.period.key} overrun (owner ")
    [running] = json.loads(status.stdout)[0]["running"]
    assert running["overrun"] is True and running["running_s"] >= 120
    assert 'once_overrun_attempts{once_job="sync"} 1' in metrics.stdout

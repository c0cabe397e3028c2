"""--no-overlap: never two periods of a job at once, across hosts, through the ledger; the
period a fire gave up is not lost (a later catch-up makes it up), and once check does not call
it missing while the attempt that held it back lives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import once
from helpers import run_once
from ledger_sql import query

pytestmark = pytest.mark.tables_made  # none is about a first use


def _minutes_ago(n: int) -> datetime:
    return datetime.now(UTC) - timedelta(minutes=n)


def test_a_fire_gives_up_while_another_period_runs_and_catch_up_makes_it_up(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "ran"
    command = ["sh", "-c", f'echo "$ONCE_PERIOD" >> {log}']
    # A live attempt (another "host": the API in this process) holds the period 3 minutes ago.
    with once.claim("sync", every="minute", db=ledger_url, stale_after=30,
                    now=_minutes_ago(3)) as held:
        assert held.won
        skipped = run_once("run", "--job", "sync", "--every", "minute", "--no-overlap",
                           "--catchup", "5", "--", *command, env=once_env)
        assert skipped.returncode == 0, skipped.stderr
        assert "skipped: --no-overlap and " + held.period.key in skipped.stderr
        assert not log.exists()  # nothing ran, nothing was claimed
        assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(1,)]
        check = run_once("check", "--json", env=once_env)
        problems = {f["problem"] for f in json.loads(check.stdout)}
        assert "missing" not in problems, check.stdout  # held back, not missing
        # The attempt that holds them back is loud itself once it has run longer than its
        # period (tests/integration/test_overrun.py); seconds old, it is not.
        assert "overrun" not in problems, check.stdout
    caught = run_once("run", "--job", "sync", "--every", "minute", "--no-overlap",
                      "--catchup", "5", "--", *command, env=once_env)
    assert caught.returncode == 0, caught.stderr
    ran = log.read_text().split()
    assert len(ran) >= 3 and ran == sorted(ran)  # the periods after it, in order, once each
    assert len(set(ran)) == len(ran)


def test_shards_of_one_period_run_side_by_side(ledger_url: str,
                                               once_env: dict[str, str]) -> None:
    # Overlap is between periods; the shards of one period are meant to run at once.
    now = datetime.now(UTC)
    with once.claim("split", every="hour", db=ledger_url, stale_after=30, now=now) as first:
        assert first.won
        result = run_once("run", "--job", "split", "--every", "hour", "--shards", "1",
                          "--no-overlap", "--", "true", env=once_env)
        assert "--no-overlap" not in result.stderr  # held (the same period), not an overlap


@pytest.mark.slow
def test_two_hosts_claiming_two_periods_at_one_instant_run_one(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    from helpers import ONCE, release_together

    log = tmp_path / "ran"
    # The run lasts until every caller has decided: released together, each still starts its
    # interpreter after the release, which took over 3 s on a loaded machine (the last then
    # found the first's run over and rightly ran its own period).
    script = f'echo "$ONCE_PERIOD start" >> {log}; sleep 12; echo "$ONCE_PERIOD end" >> {log}'
    callers = [[ONCE, "run", "--job", "race", "--every", "minute", "--lag", str(lag),
                "--no-overlap", "--", "sh", "-c", script] for lag in (0, 1, 0, 1)]
    results = release_together(callers, tmp_path / "gate", once_env)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    lines = log.read_text().splitlines()
    starts = [line for line in lines if line.endswith("start")]
    assert len(starts) == 1, lines  # one period ran; the other was held back, not lost
    assert sum("--no-overlap and" in r.stderr for r in results) >= 1

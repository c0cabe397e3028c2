"""`once catchup` without --every or --cron takes the job's schedule, zone, lag and shards
from the ledger (issue 36): what its latest claim left there. Every backend."""

from __future__ import annotations

from pathlib import Path

from helpers import run_once


def test_catchup_takes_the_stored_schedule(once_env: dict[str, str], tmp_path: Path) -> None:
    ran = run_once("run", "--job", "tick", "--every", "hour", "--tz", "Europe/Berlin",
                   "--lag", "1", "--", "true", env=once_env)
    assert ran.returncode == 0, ran.stderr
    listed = run_once("catchup", "--job", "tick", "--dry-run", env=once_env)
    assert listed.returncode == 0, listed.stderr
    # Nothing is missing since the job's first period: its lag-1 period is done, and the
    # current hour (not due with --lag 1) is not listed.
    assert listed.stdout == ""
    wide = run_once("catchup", "--job", "tick", "--dry-run", "--since", "2026-12-01",
                    env=once_env)
    keys = [line.split()[0] for line in wide.stdout.splitlines()]
    assert keys and all(key.endswith(("+01:00", "+02:00")) for key in keys), keys  # Berlin


def test_catchup_refuses_what_it_cannot_take_from_the_ledger(once_env: dict[str, str]) -> None:
    ran = run_once("run", "--job", "tick", "--every", "day", "--tz", "Europe/Berlin", "--",
                   "true", env=once_env)
    assert ran.returncode == 0, ran.stderr
    other_zone = run_once("catchup", "--job", "tick", "--tz", "UTC", "--dry-run", env=once_env)
    assert other_zone.returncode == 2
    assert "differs from the zone job 'tick' runs in (Europe/Berlin)" in other_zone.stderr
    unknown = run_once("catchup", "--job", "tock", "--dry-run", env=once_env)
    assert unknown.returncode == 2
    assert "unknown job 'tock'" in unknown.stderr and "--every SPEC" in unknown.stderr

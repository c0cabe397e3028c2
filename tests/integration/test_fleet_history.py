"""The operator's views of attempts (issue 26, item 8): `once history` without JOB (the
fleet's latest attempts), and `--period` of `logs`, `history` and `rerun` taking what
`catchup --since` takes (a key, a date, an instant with `Z`, seconds or another offset).

On every backend (the fleet's read is a statement of its own): the attempts made by real `once`
processes, the reports read in this process (helpers.run_either).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helpers import run_either

pytestmark = pytest.mark.tables_made  # but where a test says otherwise


def once(env: dict[str, str], *args: str) -> Any:
    return run_either(*args, env=env, timeout=120)


def hour(n: int) -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=n)


def key(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:00+00:00")


def test_history_without_a_job_lists_the_fleets_latest_attempts(
        once_env: dict[str, str]) -> None:
    env = once_env
    # An old job, then a busy one, then a failure: the latest attempts are the busy job's
    # and the failure, the old job's only when the limit reaches it.
    assert once(env, "run", "--job", "old", "--every", "day", "--lag", "2", "--",
                "true").returncode == 0
    assert once(env, "catchup", "--job", "busy", "--every", "hour", "--since",
                key(hour(-6)), "--until", key(hour(-1)), "--", "true").returncode == 0
    assert once(env, "run", "--job", "ns:broken", "--every", "day", "--", "sh", "-c",
                "echo 'error: disk full'; exit 3").returncode == 3
    assert once(env, "state", "old", "--set", "v1").returncode == 0  # no attempt: not listed

    result = once(env, "history", "--json")
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert [(e["job"], e["period"]) for e in entries] == [
        ("ns:broken", datetime.now(UTC).date().isoformat()),
        *(("busy", key(hour(n))) for n in range(-1, -7, -1)),
        ("old", (datetime.now(UTC).date() - timedelta(days=2)).isoformat())]
    assert entries[0]["status"] == "failed" and entries[0]["last_line"] == "error: disk full"
    assert entries[0]["exit_code"] == 3 and entries[1]["status"] == "done"

    top = json.loads(once(env, "history", "--limit", "3", "--json").stdout)
    assert top == entries[:3]
    spaced = json.loads(once(env, "history", "--namespace", "ns", "--json").stdout)
    assert [e["job"] for e in spaced] == ["ns:broken"]

    plain = once(env, "history", "--limit", "2")
    lines = plain.stdout.splitlines()
    assert lines[0].split()[:4] == ["JOB", "PERIOD", "ATTEMPT", "OWNER"]
    assert lines[1].startswith("ns:broken ") and lines[1].rstrip().endswith("error: disk full")
    assert lines[2].startswith("busy ") and len(lines) == 3


@pytest.mark.tables_made(False)  # an empty ledger
def test_history_of_an_empty_ledger_and_period_without_job(once_env: dict[str, str]) -> None:
    result = once(once_env, "history")
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr.startswith("once: no attempts in the ledger ")
    assert json.loads(once(once_env, "history", "--json").stdout) == []
    refused = once(once_env, "history", "--period", "2026-12-01")
    assert refused.returncode == 2 and "--period goes with JOB" in refused.stderr


def test_every_period_option_takes_what_since_takes(once_env: dict[str, str]) -> None:
    env = once_env
    at = hour(-2)
    assert once(env, "catchup", "--job", "sync", "--every", "hour", "--since", key(hour(-3)),
                "--until", key(at), "--", "sh", "-c",
                'echo "wrote $ONCE_PERIOD"').returncode == 0
    spellings = [key(at), at.strftime("%Y-%m-%dT%H:%MZ"), at.strftime("%Y-%m-%dT%H:%M:%S+00:00"),
                 (at + timedelta(minutes=59)).strftime("%Y-%m-%dT%H:%MZ"),
                 (at + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M+01:00")]
    for given in spellings:
        logs = once(env, "logs", "sync", "--period", given)
        assert logs.returncode == 0, (given, logs.stderr)
        assert logs.stdout.splitlines() == [logs.stdout.splitlines()[0], f"wrote {key(at)}"]
        assert logs.stdout.startswith(f"==> sync {key(at)} attempt 1: done")
        history = json.loads(once(env, "history", "sync", "--period", given, "--json").stdout)
        assert [e["period"] for e in history] == [key(at)], given
    missing = once(env, "logs", "sync", "--period", hour(-9).strftime("%Y-%m-%dT%H:%MZ"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == (f"once: job sync has no attempt at period "
                                      f"{key(hour(-9))} (--period "
                                      f"{hour(-9).strftime('%Y-%m-%dT%H:%MZ')})")

    # once rerun: the same instants name the same period; its refusal names the key
    rerun = once(env, "rerun", "--job", "sync", "--period", at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "--", "sh", "-c", 'echo "again $ONCE_PERIOD"')
    assert rerun.returncode == 0, rerun.stderr
    assert once(env, "logs", "sync", "--period", key(at)).stdout.splitlines()[1] == (
        f"again {key(at)}")
    bad = once(env, "rerun", "--job", "sync", "--period", "yesterday-ish", "--", "true")
    assert bad.returncode == 2 and "yesterday-ish" in bad.stderr


def test_a_daily_job_in_a_zone_reads_an_instant_in_that_zone(once_env: dict[str, str]) -> None:
    env = once_env
    today = datetime.now(UTC).date()
    since = (today - timedelta(days=3)).isoformat()
    until = (today - timedelta(days=2)).isoformat()
    assert once(env, "catchup", "--job", "nightly", "--every", "day", "--tz", "Asia/Tokyo",
                "--since", since, "--until", until, "--", "true").returncode == 0
    # 16:00Z on the day before `until` is already `until` in Tokyo (UTC+9)
    instant = f"{(today - timedelta(days=3)).isoformat()}T16:00Z"
    found = json.loads(once(env, "history", "nightly", "--period", instant, "--json").stdout)
    assert [e["period"] for e in found] == [until]

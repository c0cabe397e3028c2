"""`once catchup`, `once run --catchup` and `once rerun` on every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import ONCE, release_together, run_once
from ledger_sql import query

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]

LOG_CHILD = ["sh", "-c", 'echo "$ONCE_PERIOD $ONCE_PERIOD_START $ONCE_PERIOD_END '
             '$ONCE_ATTEMPT" >> "$LOG"']
FAIL_ON = ["sh", "-c", 'echo "$ONCE_PERIOD" >> "$LOG"; [ "$ONCE_PERIOD" != "$FAIL" ]']


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**once_env, "LOG": str(tmp_path / "children.log")}


def logged(env: dict[str, str]) -> list[list[str]]:
    path = Path(env["LOG"])
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def catchup(env: dict[str, str], *args: str, command: list[str] = LOG_CHILD):
    return run_once("catchup", "--job", "daily", "--every", "day", "--tz", "Europe/Berlin",
                    *args, "--", *command, env=env)


def test_runs_missing_periods_in_order_with_their_environment(env: dict[str, str]) -> None:
    result = catchup(env, "--since", "2026-10-24", "--until", "2026-10-27")
    assert result.returncode == 0, result.stderr
    assert logged(env) == [
        ["2026-10-24", "2026-10-24T00:00:00+02:00", "2026-10-25T00:00:00+02:00", "1"],
        # 25 hours: the day DST ends in Berlin
        ["2026-10-25", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", "1"],
        ["2026-10-26", "2026-10-26T00:00:00+01:00", "2026-10-27T00:00:00+01:00", "1"],
        ["2026-10-27", "2026-10-27T00:00:00+01:00", "2026-10-28T00:00:00+01:00", "1"],
    ]
    again = catchup(env, "--since", "2026-10-24", "--until", "2026-10-27")
    assert again.returncode == 0
    assert len(logged(env)) == 4


def test_stops_at_the_first_failure(env: dict[str, str]) -> None:
    env = {**env, "FAIL": "2026-10-25"}
    result = catchup(env, "--since", "2026-10-24", "--until", "2026-10-27", command=FAIL_ON)
    assert result.returncode == 1
    assert [p for (p,) in logged(env)] == ["2026-10-24", "2026-10-25"]


def test_keep_going(env: dict[str, str], ledger_url: str) -> None:
    env = {**env, "FAIL": "2026-10-25"}
    result = catchup(env, "--since", "2026-10-24", "--until", "2026-10-27", "--keep-going",
                     command=FAIL_ON)
    assert result.returncode == 1
    assert [p for (p,) in logged(env)] == ["2026-10-24", "2026-10-25", "2026-10-26",
                                           "2026-10-27"]
    rows = dict(query(ledger_url, "SELECT period, status FROM once_runs"))
    assert rows == {"2026-10-24": "done", "2026-10-25": "failed", "2026-10-26": "done",
                    "2026-10-27": "done"}


def test_max_takes_the_oldest(env: dict[str, str]) -> None:
    result = catchup(env, "--since", "2026-10-01", "--until", "2026-10-31", "--max", "2")
    assert result.returncode == 0
    assert [row[0] for row in logged(env)] == ["2026-10-01", "2026-10-02"]


def test_dry_run_lists_and_runs_nothing(env: dict[str, str], ledger_url: str) -> None:
    result = catchup(env, "--since", "2026-10-24", "--until", "2026-10-26", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "2026-10-24", "2026-10-25", "2026-10-26"]
    assert logged(env) == []


def test_no_history_and_no_since_is_a_usage_error(env: dict[str, str]) -> None:
    result = catchup(env)
    assert result.returncode == 2
    assert result.stderr.startswith("once: ") and "--since" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_default_since_and_until(env: dict[str, str]) -> None:
    # Three days ago was done; catch-up makes up the two days since, and today.
    run = ["run", "--job", "daily", "--every", "day", "--tz", "Europe/Berlin"]
    assert run_once(*run, "--lag", "3", "--", *LOG_CHILD, env=env).returncode == 0
    result = catchup(env)
    assert result.returncode == 0, result.stderr
    periods = [row[0] for row in logged(env)]
    assert len(periods) == 4 and periods == sorted(periods)


def test_three_catchups_at_once_run_each_period_once(env: dict[str, str],
                                                     tmp_path: Path) -> None:
    cmd = [ONCE, "catchup", "--job", "daily", "--every", "hour", "--since",
           "2026-10-24T00:00", "--until", "2026-10-24T19:00", "--", *LOG_CHILD]
    results = release_together([cmd] * 3, tmp_path / "gate", env)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    periods = [row[0] for row in logged(env)]
    assert len(periods) == 20 and len(set(periods)) == 20


def test_run_catchup_makes_up_missed_days(env: dict[str, str]) -> None:
    run = ["run", "--job", "daily", "--every", "day", "--tz", "Europe/Berlin"]
    assert run_once(*run, "--lag", "5", "--", *LOG_CHILD, env=env).returncode == 0
    result = run_once(*run, "--catchup", "2", "--", *LOG_CHILD, env=env)
    assert result.returncode == 0, result.stderr
    periods = [row[0] for row in logged(env)]
    # the day done 5 days ago, then the two oldest missed days, then today
    assert len(periods) == 4 and periods == sorted(periods)


def test_rerun_takes_over_a_done_period(env: dict[str, str], ledger_url: str) -> None:
    assert catchup(env, "--since", "2026-10-24", "--until", "2026-10-24").returncode == 0
    result = run_once("rerun", "--job", "daily", "--period", "2026-10-24", "--reason",
                      "bad data", "--", *LOG_CHILD, env=env)
    assert result.returncode == 0, result.stderr
    assert [row[3] for row in logged(env)] == ["1", "2"]
    history = query(ledger_url, "SELECT attempt, fence, reason FROM once_attempts "
                                "ORDER BY attempt")
    assert [(a, r) for a, _, r in history] == [(1, None), (2, "bad data")]
    assert history[1][1] > history[0][1]


def test_rerun_is_refused_while_a_live_owner_holds_the_period(env: dict[str, str],
                                                              ledger_url: str) -> None:
    assert catchup(env, "--since", "2026-10-24", "--until", "2026-10-24").returncode == 0
    query(ledger_url, "UPDATE once_runs SET status='running', finished_at=NULL")
    query(ledger_url, "UPDATE once_attempts SET status='running', finished_at=NULL, "
                      "exit_code=NULL, outcome=NULL")  # a live attempt, not a done marker
    result = run_once("rerun", "--job", "daily", "--period", "2026-10-24", "--",
                      *LOG_CHILD, env=env)
    assert result.returncode == 69
    assert result.stderr.startswith("once: ") and "refused" in result.stderr
    assert len(logged(env)) == 1


def test_catchup_across_a_skipped_day(env: dict[str, str]) -> None:
    result = run_once("catchup", "--job", "apia", "--every", "day", "--tz", "Pacific/Apia",
                      "--since", "2011-12-28", "--until", "2011-12-31", "--", *LOG_CHILD,
                      env=env)
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in logged(env)] == ["2011-12-28", "2011-12-29", "2011-12-31"]


def test_catchup_hourly_across_fall_back(env: dict[str, str]) -> None:
    result = run_once("catchup", "--job", "ny", "--every", "hour", "--tz", "America/New_York",
                      "--since", "2026-11-01T00:00", "--until", "2026-11-01T03:00", "--",
                      *LOG_CHILD, env=env)
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in logged(env)] == [
        "2026-11-01T00:00-04:00", "2026-11-01T01:00-04:00", "2026-11-01T01:00-05:00",
        "2026-11-01T02:00-05:00", "2026-11-01T03:00-05:00"]


def test_a_catchup_started_with_signals_ignored_runs_every_period(env: dict[str, str]) -> None:
    # As nohup, or a script's background job, starts it: SIGHUP or SIGINT ignored. The kept
    # guard is told which (once.run.keeper) and the commands inherit them ignored.
    import signal

    def ignoring() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    masks = ["sh", "-c", 'echo "$ONCE_PERIOD $(grep SigIgn /proc/$$/status | cut -f2)" >> "$LOG"']
    result = run_once("catchup", "--job", "daily", "--every", "day", "--since", "2026-10-24",
                      "--until", "2026-10-26", "--", *masks, env=env, preexec_fn=ignoring)
    assert result.returncode == 0, result.stderr
    assert [period for period, _ in logged(env)] == ["2026-10-24", "2026-10-25", "2026-10-26"]
    assert all(int(mask, 16) & 0b11 == 0b11 for _, mask in logged(env))  # HUP and INT


def test_a_catch_up_with_its_standard_error_closed_runs(env: dict[str, str]) -> None:
    # It asked a missing stream whether it was a terminal: nothing ran, exit 1.
    import subprocess

    done = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", ONCE, "catchup", "--job", "daily",
                           "--every", "day", "--since", "2026-10-24", "--until", "2026-10-25",
                           "--", *LOG_CHILD], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout
    assert [line[0] for line in logged(env)] == ["2026-10-24", "2026-10-25"]

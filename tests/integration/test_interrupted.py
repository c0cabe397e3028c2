"""An interrupted attempt keeps the budget (issue 26, 4): an attempt ended by a SIGTERM,
SIGINT or SIGHUP that `once` received and forwarded is recorded `interrupted` (history,
`--json`, check, metrics, the dashboard) and does not count against --max-attempts; the
attempt cap (3 x --max-attempts) stops a period interrupted for ever; --timeout's own kill
stays a failure.

Real `once run` processes sent real signals, on every backend.
"""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from helpers import run_once, wait_for
from ledger_sql import placeholders, query
from procs import start_once
from serving import Served

pytestmark = pytest.mark.tables_made  # none is about a first use


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def interrupted_run(env: dict[str, str], tmp_path: Path, job: str, sig: signal.Signals,
                    *options: str) -> tuple[int, str]:
    """`once run` of a command that waits, sent `sig` once the command runs: its exit
    status and stderr."""
    started = tmp_path / f"started-{job}-{sig.name}-{len(list(tmp_path.iterdir()))}"
    proc = start_once("run", "--job", job, "--every", "day", *options, "--", "sh", "-c",
                      f"touch {started}; exec sleep 60", env=env)
    wait_for(started.exists, what="the command to start")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr


def run_row(url: str, job: str) -> tuple[Any, ...]:
    (row,) = query(url, placeholders("SELECT status, attempt, interrupted FROM once_runs "
                                     "WHERE job = ? AND period = ?", url), (job, today()))
    return tuple(row)


def test_drains_and_a_failure_leave_the_period_retryable(once_env: dict[str, str],
                                                         ledger_url: str,
                                                         tmp_path: Path) -> None:
    """Three forwarded signals and a real failure, --max-attempts 3: the period is still
    retried (on today's main the second interruption already left one attempt); then three
    real failures in all use it up."""
    job, budget = "drained", ("--max-attempts", "3")
    for n, sig in enumerate((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), 1):
        status, stderr = interrupted_run(once_env, tmp_path, job, sig, *budget)
        assert status == 128 + sig, stderr
        line = stderr.splitlines()[-1]  # after the takeover's line, from attempt 2 on
        assert line == (f"once: {job} {today()} attempt {n}: {sig.name} received and "
                        f"forwarded to the command, which ended with status {128 + sig}; "
                        f"recorded failed (interrupted: not counted against --max-attempts)")
        assert run_row(ledger_url, job) == ("failed", n, n)
    for n in (4, 5, 6):  # a real failure each: counted
        failed = run_once("run", "--job", job, "--every", "day", *budget, "--", "false",
                          env=once_env)
        assert failed.returncode == 1, failed.stderr
        assert run_row(ledger_url, job) == ("failed", n, 3)
    used_up = run_once("run", "--job", job, "--every", "day", *budget, "--", "true",
                       env=once_env)
    assert used_up.returncode == 0
    assert used_up.stderr == (f"once: {job} {today()}: skipped: failed 3 times (and 3 "
                              f"interrupted), no attempts left of --max-attempts 3 (once rerun "
                              f"runs it again)\n")

    history = json.loads(run_once("history", job, "--json", env=once_env).stdout)
    assert [(e["attempt"], e["status"], e["outcome"], e["exit_code"])
            for e in sorted(history, key=lambda e: e["attempt"])] == [
        (1, "failed", "interrupted", 143), (2, "failed", "interrupted", 130),
        (3, "failed", "interrupted", 129), (4, "failed", "failed", 1),
        (5, "failed", "failed", 1), (6, "failed", "failed", 1)]
    table = run_once("history", job, env=once_env).stdout
    assert table.count("failed (interrupted)") == 3

    check = run_once("check", env=once_env)
    assert (f"CRITICAL {job} {today()} failed-out (attempt 6 of 3, 3 interrupted, exit 1, "
            f"no attempts left)") in check.stdout
    (entry,) = json.loads(run_once("status", "--json", env=once_env).stdout)
    assert [(f["attempt"], f["interrupted"], f["attempts_left"])
            for f in entry["failed_periods"]] == [(6, 3, 0)]
    metrics = run_once("metrics", env=once_env).stdout
    assert f'once_interrupted_total{{once_job="{job}"}} 3' in metrics.splitlines()
    assert f'once_failed_out_periods{{once_job="{job}"}} 1' in metrics.splitlines()

    served = Served(env=once_env)
    try:
        page = served.get(f"/job/{job}").text
    finally:
        served.stop()
    assert page.count('<span class="warn">failed (interrupted)</span>') == 3
    assert page.count('<span class="bad">failed</span>') == 3


def test_an_interrupted_attempt_is_retried_before_a_failure_would_be(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    """--max-attempts 1: one real failure ends the period, a drain does not."""
    status, stderr = interrupted_run(once_env, tmp_path, "one", signal.SIGTERM,
                                     "--max-attempts", "1")
    assert status == 143, stderr
    retried = run_once("run", "--job", "one", "--every", "day", "--max-attempts", "1", "--",
                       "true", env=once_env)
    assert retried.returncode == 0 and "took over as attempt 2" in retried.stderr
    assert run_row(ledger_url, "one") == ("done", 2, 1)


def test_a_period_interrupted_for_ever_stops_at_the_attempt_cap(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    """--max-attempts 1: three interruptions are the cap (3 x 1 attempts in all); the next
    fire runs nothing, says why, and `once rerun` still runs it."""
    budget = ("--max-attempts", "1")
    for n in (1, 2, 3):
        status, stderr = interrupted_run(once_env, tmp_path, "evicted", signal.SIGTERM,
                                         *budget)
        assert status == 143, stderr
        assert run_row(ledger_url, "evicted") == ("failed", n, n)
    capped = run_once("run", "--job", "evicted", "--every", "day", *budget, "--", "true",
                      env=once_env)
    assert capped.returncode == 0
    assert capped.stderr == (f"once: evicted {today()}: skipped: 3 attempts, 3 of "
                             f"them interrupted, and a period gets at most 3 x --max-attempts "
                             f"1 attempts in all: no attempts left (once rerun runs it "
                             f"again)\n")
    assert run_row(ledger_url, "evicted") == ("failed", 3, 3)
    check = run_once("check", env=once_env).stdout
    assert (f"CRITICAL evicted {today()} failed-out (attempt 3 of 1, 3 interrupted, exit 143, "
            f"no attempts left)") in check
    rerun = run_once("rerun", "--job", "evicted", "--period", today(), "--", "true",
                     env=once_env)
    assert rerun.returncode == 0, rerun.stderr
    assert run_row(ledger_url, "evicted") == ("done", 4, 3)


def test_the_timeout_kill_stays_a_failure(once_env: dict[str, str], ledger_url: str) -> None:
    """--timeout's own SIGTERM is no interruption: it counts against --max-attempts."""
    args = ("run", "--job", "slow", "--every", "day", "--max-attempts", "1", "--timeout", "1")
    timed = run_once(*args, "--", "sleep", "30", env=once_env)
    assert timed.returncode == 124, timed.stderr
    assert run_row(ledger_url, "slow") == ("failed", 1, 0)
    skipped = run_once(*args, "--", "true", env=once_env)
    assert skipped.returncode == 0 and "no attempts left of --max-attempts 1" in skipped.stderr
    (entry,) = json.loads(run_once("history", "slow", "--json", env=once_env).stdout)
    assert entry["outcome"] == "timed-out"

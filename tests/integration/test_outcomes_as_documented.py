"""Outcomes as the reference documents them, on real processes and real ledgers: a rerun that
--no-overlap holds back is refused (69), never a silent exit 0; a fresh rerun or catch-up of
an old period is no overrun; a catch-up names a period a live owner holds."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from helpers import run_either, run_once, wait_for
from ledger_sql import query
from procs import reaped, start_once

REFUSED = 69


def _hold(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """A real `once run` (ARGS) whose command waits for tmp_path/go; returned once it runs."""
    go, started = tmp_path / "go", tmp_path / "started"
    owner = start_once("run", *args, "--", "sh", "-c",
                       f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done", env=env)
    wait_for(lambda: started.exists() or owner.poll() is not None, timeout=60,
             what="the live attempt's command")
    assert owner.poll() is None, owner.communicate()
    return owner


def _let_go(owner: subprocess.Popen[str], tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    reaped(owner, 60)


def test_a_rerun_that_no_overlap_holds_back_is_refused(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    job = ["--job", "sync", "--every", "minute", "--no-overlap"]
    assert run_once("run", *job, "--lag", "2", "--", "true", env=once_env).returncode == 0
    [(done_key,)] = query(ledger_url, "SELECT period FROM once_runs")
    owner = _hold(tmp_path, once_env, *job)  # the current minute, live
    try:
        [(held_key,)] = query(ledger_url, "SELECT period FROM once_runs WHERE status = "
                                          "'running'")
        ran = tmp_path / "ran"
        rerun = run_once("rerun", "--job", "sync", "--period", done_key, "--", "touch",
                         str(ran), env=once_env)
        quiet = run_once("rerun", "-q", "--job", "sync", "--period", done_key, "--",
                         "touch", str(ran), env=once_env)
    finally:
        _let_go(owner, tmp_path)
    assert (rerun.returncode, quiet.returncode) == (REFUSED, REFUSED), rerun.stderr
    assert not ran.exists()
    lines = rerun.stderr.splitlines()
    assert len(lines) == 1, rerun.stderr
    assert lines[0].startswith(f"once: sync {done_key}: rerun refused: --no-overlap and "
                               f"{held_key} is still held by ")
    assert "catch-up" not in lines[0]  # no catch-up reruns a done period
    [said] = quiet.stderr.splitlines()  # a refusal is said under -q too
    assert said.partition(" (")[0] == lines[0].partition(" (")[0]
    assert query(ledger_url, "SELECT status, attempt FROM once_runs WHERE period = "
                             f"'{done_key}'") == [("done", 1)]
    # Once the other period's attempt has ended, the same rerun runs.
    again = run_once("rerun", "--job", "sync", "--period", done_key, "--", "touch", str(ran),
                     env=once_env)
    assert again.returncode == 0, again.stderr
    assert ran.exists()


def test_a_rerun_of_a_period_a_live_attempt_holds_is_refused_naming_it(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    owner = _hold(tmp_path, once_env, "--job", "live", "--every", "minute")
    try:
        [(key, holder)] = query(ledger_url, "SELECT period, owner FROM once_runs")
        rerun = run_once("rerun", "--job", "live", "--period", key, "--", "true",
                         env=once_env)
    finally:
        _let_go(owner, tmp_path)
    assert rerun.returncode == REFUSED, rerun.stderr
    [line] = rerun.stderr.splitlines()
    assert line.startswith(f"once: live {key}: rerun refused: a live attempt holds it "
                           f"({holder}, attempt 1, ")


def _days_ago(n: int) -> str:
    return (datetime.now(UTC).date() - timedelta(days=n)).isoformat()


def _no_overrun_seen(env: dict[str, str]) -> None:
    """once check, status and metrics while a live attempt of a long-due period has run for
    seconds: no overrun, nothing paged."""
    check = run_either("check", "--json", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout) == []
    [job] = json.loads(run_either("status", "--json", env=env).stdout)
    [running] = job["running"]
    assert running["due"] and not running["overrun"], running
    metrics = run_either("metrics", env=env).stdout
    assert 'once_overrun_attempts{once_job="daily"} 0' in metrics


def test_a_fresh_rerun_or_catch_up_of_an_old_period_is_no_overrun(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    every = ["--job", "daily", "--every", "day"]
    done = run_once("catchup", *every, "--since", _days_ago(7), "--until", _days_ago(0),
                    "--", "true", env=once_env)
    assert done.returncode == 0, done.stderr
    owner = start_once("rerun", "--job", "daily", "--period", _days_ago(6), "--", "sh", "-c",
                       f"touch {tmp_path}/started; while [ ! -e {tmp_path}/go ]; do sleep "
                       f"0.05; done", env=once_env)
    try:
        wait_for(lambda: (tmp_path / "started").exists() or owner.poll() is not None,
                 timeout=60, what="the rerun's command")
        assert owner.poll() is None, owner.communicate()
        _no_overrun_seen(once_env)
    finally:
        _let_go(owner, tmp_path)
    assert owner.returncode == 0, owner.stderr
    # A catch-up's period a week and a half back, claimed a moment ago, neither.
    (tmp_path / "go").unlink()
    (tmp_path / "started").unlink()
    catching = start_once("catchup", *every, "--since", _days_ago(10), "--until",
                          _days_ago(10), "--", "sh", "-c",
                          f"touch {tmp_path}/started; while [ ! -e {tmp_path}/go ]; do sleep "
                          f"0.05; done", env=once_env)
    try:
        wait_for(lambda: (tmp_path / "started").exists() or catching.poll() is not None,
                 timeout=60, what="the catch-up's command")
        assert catching.poll() is None, catching.communicate()
        check = run_either("check", env=once_env)
        assert "overrun" not in check.stdout, check.stdout
    finally:
        _let_go(catching, tmp_path)


def test_a_catch_up_names_the_period_a_live_owner_holds(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    # The range's owner is SIGKILLed: its row is not stale yet, so the catch-up cannot take
    # it; it must say so, not "caught up".
    every = ["--job", "daily", "--every", "day"]
    owner = start_once("run", *every, "--lag", "2", "--stale-after", "5m", "--", "sh", "-c",
                       f"touch {tmp_path}/started; sleep 120", env=once_env)
    wait_for(lambda: (tmp_path / "started").exists() or owner.poll() is not None,
             timeout=60, what="the owner's command")
    owner.send_signal(signal.SIGKILL)
    reaped(owner, 30)
    held = _days_ago(2)
    caught = run_once("catchup", *every, "--since", _days_ago(5), "--until", _days_ago(1),
                      "--", "true", env=once_env)
    assert caught.returncode == 0, caught.stderr
    lines = caught.stderr.splitlines()
    assert f"once: daily {held}: held by a live owner" in lines, caught.stderr
    summary = lines[-1]
    assert not summary.startswith("once: caught up"), summary
    assert summary.endswith(f": 4 done; 1 held by a live owner: {held}"), summary
    assert query(ledger_url, "SELECT count(*) FROM once_runs WHERE status = 'done'") == [(4,)]
    # --dry-run lists what would run: the held period is not among them.
    dry = run_once("catchup", *every, "--since", _days_ago(5), "--until", _days_ago(1),
                   "--dry-run", env=once_env)
    assert dry.returncode == 0 and dry.stdout == "", dry.stdout

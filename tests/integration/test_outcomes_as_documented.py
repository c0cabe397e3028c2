"""Outcomes as the reference documents them, on real processes and real ledgers: a rerun that
--no-overlap holds back is refused (69), never a silent exit 0; a fresh rerun or catch-up of
an old period is no overrun; a catch-up names a period a live owner holds."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from helpers import run_either, run_once, wait_for
from ledger_sql import placeholders, query
from procs import alive, reaped, start_once

pytestmark = pytest.mark.tables_made  # none is about a first use

REFUSED = 69


def _hold(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """A real `once run` (ARGS) whose command waits for tmp_path/go; returned once it runs
    (the command's pid in tmp_path/started)."""
    go, started = tmp_path / "go", tmp_path / "started"
    owner = start_once("run", *args, "--", "sh", "-c",
                       f"echo $$ > {started}.tmp; mv {started}.tmp {started}; "
                       f"while [ ! -e {go} ]; do sleep 0.05; done", env=env)
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


class _RowLock:
    """Another session's transaction holding the lock a renewal of `job` needs: PostgreSQL's
    and MySQL's row lock on its once_runs row (SELECT ... FOR UPDATE), SQLite's write lock
    (BEGIN IMMEDIATE), held until close()."""

    def __init__(self, url: str, job: str) -> None:
        from once.ledger import parse_url

        target = parse_url(url)
        self.dialect = target.dialect
        if self.dialect == "sqlite":
            import sqlite3

            self.conn: Any = sqlite3.connect(target.path, isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
            return
        from once.ledger.connect import connect

        self.conn = connect(target, 10, autocommit=False)
        cur = self.conn.cursor()
        cur.execute(placeholders("SELECT attempt FROM once_runs WHERE job = ? FOR UPDATE",
                                 url), (job,))
        assert cur.fetchall()

    def close(self) -> None:
        if self.dialect == "sqlite":
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()
        self.conn.close()


def test_a_renewal_that_waits_on_another_sessions_row_lock_says_so(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    # --stale-after 3s: PostgreSQL's watchdog would cancel the renewal at 3.75 s, past the
    # lease's deadline; it is bounded by the deadline, and the line names the lock.
    owner = _hold(tmp_path, once_env, "--job", "locked", "--every", "minute",
                  "--stale-after", "3s")
    lock = _RowLock(ledger_url, "locked")
    try:
        began = time.monotonic()
        _, err = owner.communicate(timeout=60)
        took = time.monotonic() - began
    finally:
        lock.close()
        _let_go(owner, tmp_path)
    assert owner.returncode == 70, err
    [line] = [line for line in err.splitlines() if "fenced out" in line]
    assert took < 3 + 5, took  # the deadline, and the wrapper's own wait for its heartbeat
    if lock.dialect == "mysql":  # its read timeout (a second) ends the wait, unexplained:
        return  # innodb_lock_wait_timeout, a whole number of seconds, cannot come first
    waited = ("the database's write lock" if lock.dialect == "sqlite" else "a row lock")
    assert f"the renewals waited on {waited} held by another session past the deadline" in \
        line, err
    assert "unreachable" not in line, err
    # PostgreSQL's cancel came within the lease (its limit cut to it), and says so.
    limit = re.search(r"once's limit of ([0-9.]+)s", line)
    assert limit is None or float(limit.group(1)) < 3, line


def _renewal_waiting(url: str, dialect: str) -> bool:
    """A renewal (UPDATE once_runs SET heartbeat_at ...) waits in this test's database on a
    lock."""
    if dialect == "postgresql":
        sql = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND datname = current_database() AND query LIKE '%SET heartbeat_at%'")
    else:
        sql = ("SELECT count(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' "
               "AND DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE '%SET heartbeat_at%'")
    return bool(query(url, sql)[0][0])


def test_an_owner_stopped_with_a_renewal_out_says_it_was_stopped(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    owner = _hold(tmp_path, once_env, "--job", "stopped", "--every", "minute",
                  "--stale-after", "3s", "--kill-after", "1s")
    lock = _RowLock(ledger_url, "stopped")
    try:
        if lock.dialect == "sqlite":
            pytest.skip("a SQLite renewal's wait on the write lock cannot be seen from outside")
        wait_for(lambda: _renewal_waiting(ledger_url, lock.dialect), timeout=30,
                 what="a renewal waiting on the row lock")
        owner.send_signal(signal.SIGSTOP)  # the guard, a process of its own, keeps watch
        command = int((tmp_path / "started").read_text())
        wait_for(lambda: not alive(command), timeout=30,
                 what="the guard to end the command at the deadline")
        time.sleep(3)  # the stop lasts well past the deadline (1 s of grace, STALLED 1 s)
        owner.send_signal(signal.SIGCONT)
        _, err = owner.communicate(timeout=60)
    finally:
        with suppress(ProcessLookupError):
            owner.send_signal(signal.SIGCONT)
        lock.close()
        _let_go(owner, tmp_path)
    assert owner.returncode == 70, err
    [line] = [line for line in err.splitlines() if "fenced out" in line]
    assert "its deadline passed while this process was stopped or suspended (it stepped " \
           "down " in line, err
    assert "unreachable" not in line and "waited on" not in line, err


@pytest.mark.parametrize("held", ["LOCK TABLE once_runs IN ACCESS EXCLUSIVE MODE",
                                  "SELECT 1 FROM once_jobs WHERE job = 'waits' FOR UPDATE"])
def test_a_claim_that_once_cancels_at_its_limit_says_why(
        ledger_url: str, once_env: dict[str, str], held: str) -> None:
    # PostgreSQL: once's watchdog cancels a statement at its limit (5 s with
    # --stale-after 10s), and the server blames a user for it ("canceling statement due to
    # user request"). The line says whose limit it was, and what it waited on where the server
    # says (a row's lock); an advisory or a table lock, or a slow server, it cannot tell.
    if not ledger_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's statements alone are cancelled by once's own watchdog")
    job = ["--job", "waits", "--every", "minute", "--stale-after", "10s"]
    assert run_once("run", *job, "--lag", "1", "--", "true", env=once_env).returncode == 0
    from once.ledger import parse_url
    from once.ledger.connect import connect

    holder = connect(parse_url(ledger_url), 10, autocommit=False)
    try:
        holder.cursor().execute(held)
        began = time.monotonic()
        caught = run_once("run", *job, "--", "true", env=once_env)
        took = time.monotonic() - began
    finally:
        holder.rollback()
        holder.close()
    assert caught.returncode == 75, caught.stderr
    [line] = caught.stderr.splitlines()
    assert "user request" not in line, line
    assert re.search(r"once's limit of [0-9.]+s for a statement, so once cancelled it", line), \
        line
    assert line.endswith("; nothing was run"), line
    if "FOR UPDATE" in held:
        assert "waited on a row lock held by another session past" in line, line
    else:
        assert "a lock another session holds, or a server that slow" in line, line
    assert took < 5 + 10, took

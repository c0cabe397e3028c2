"""Never twice across callers that disagree, and outcomes that say what the ledger holds.

Every backend, real `once` processes: staleness is judged by the owner's promise (the
--stale-after of the attempt that holds the row), not by the caller's; a rerun racing a rerun
is refused; a final write held up by a row lock reports what the row ends up holding;
--require-same-command is decided inside the claim; a host whose clock disagrees with the
database's claims nothing; on SQLite, a clock stepped forward cannot make a live owner stale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from child_log import stable_day
from helpers import ONCE, release_together, run_once, wait_for
from ledger_sql import lock_run_rows, query, scalar
from once.ledger import parse_url
from procs import alive, start_once

pytestmark = pytest.mark.tables_made  # none is about a first use

DAY = ["--every", "day"]
# A child that notes its pid and attempt, then waits for the test's word.
WAITER = ('echo $$ > "$DIR/pid.$ONCE_ATTEMPT"; '
          'while [ ! -e "$DIR/release" ]; do sleep 0.05; done')


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**once_env, "DIR": str(tmp_path)}


def _pid(tmp_path: Path, attempt: int = 1) -> int:
    path = tmp_path / f"pid.{attempt}"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(),
                        what=f"attempt {attempt}'s command"))


# -- the owner's promise ---------------------------------------------------------------------


@pytest.mark.parametrize("caller", ["run", "catchup"])
def test_a_shorter_stale_after_cannot_take_over_a_live_owner(
        env: dict[str, str], tmp_path: Path, ledger_url: str, caller: str) -> None:
    owner = start_once("run", "--job", "long", *DAY, "--stale-after", "60s", "--", "sh", "-c",
                       WAITER, env=env)
    try:
        _pid(tmp_path)
        time.sleep(3)  # the owner's heartbeat is now older than the caller's 1s
        if caller == "run":
            args = ["run", "--job", "long", *DAY, "--stale-after", "1s", "-v"]
        else:
            today = scalar(ledger_url, "SELECT period FROM once_runs")
            args = ["catchup", "--job", "long", *DAY, "--since", today, "--until", today,
                    "--stale-after", "1s", "-v"]
        other = run_once(*args, "--", "touch", str(tmp_path / "second"), env=env)
        assert other.returncode == 0, other.stderr
        assert not (tmp_path / "second").exists(), "a live owner was taken over"
        # Either claim judges the row by its owner's promise: held (a catch-up tries a held
        # period and names it, issue 34 row 14).
        assert "held by" in other.stderr and "stale after 60s" in other.stderr, other.stderr
        if caller == "catchup":
            assert "1 held by a live owner" in other.stderr, other.stderr
        # The reports judge the row by its owner's promise too, whatever the job's latest
        # --stale-after (the caller's 1s) says.
        status = run_once("status", "--json", env=env)
        (job,) = json.loads(status.stdout)
        assert job["stale_after_s"] == 1.0  # the latest claim's, the caller's
        assert [(r["attempt"], r["stale"], r["stale_after_s"]) for r in job["running"]] == [
            (1, False, 60.0)]
        check = run_once("check", "long", env=env)
        verdict = check.stdout.partition(" (ledger ")[0]  # the ledger's path may say "stale"
        assert check.stdout.startswith("OK ") and "stale" not in verdict, check.stdout
    finally:
        (tmp_path / "release").touch()
    _out, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


def test_a_longer_stale_after_of_the_owner_is_stored_with_its_row(
        env: dict[str, str], ledger_url: str) -> None:
    assert run_once("run", "--job", "p", *DAY, "--stale-after", "90s", "--", "true",
                    env=env).returncode == 0
    assert scalar(ledger_url, "SELECT stale_after FROM once_runs") == 90


# -- truthful outcomes -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_rerun_racing_a_rerun_is_refused(env: dict[str, str], tmp_path: Path,
                                           ledger_url: str) -> None:
    assert run_once("run", "--job", "r", *DAY, "--", "true", env=env).returncode == 0
    period = scalar(ledger_url, "SELECT period FROM once_runs")
    # The winner's command outlasts the loser's start, its wait for SQLite's period lock (1 s)
    # and a loaded machine's delays: the two reruns overlap for sure.
    for round_ in range(3):
        marker = tmp_path / f"ran.{round_}"
        rerun = [ONCE, "rerun", "--job", "r", "--period", period, "--", "sh", "-c",
                 f'echo $ONCE_ATTEMPT >> "{marker}"; sleep 3']
        results = release_together([rerun, rerun], tmp_path / "gate", env)
        statuses = sorted(r.returncode for r in results)
        assert statuses == [0, 69], [r.stderr for r in results]
        assert len(marker.read_text().split()) == 1
        refused = next(r for r in results if r.returncode == 69)
        assert "rerun refused" in refused.stderr, refused.stderr


@contextmanager
def _outsider_holds_the_row(ledger_url: str, seconds: float) -> Iterator[threading.Event]:
    """Another session locks the job's once_runs row (SQLite: the whole database) when told
    to, holds it for `seconds`, then lets go."""
    go = threading.Event()
    held = threading.Event()

    def hold() -> None:
        go.wait()
        conn = lock_run_rows(ledger_url)
        held.set()
        time.sleep(seconds)
        conn.rollback()
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield go
    finally:
        go.set()
        thread.join(seconds + 30)
    assert held.is_set()


@pytest.mark.slow
def test_a_held_up_final_write_reports_what_the_row_holds(env: dict[str, str],
                                                          tmp_path: Path,
                                                          ledger_url: str) -> None:
    """The final write waits on an outsider's lock past its watchdog and past the lease's
    deadline (PostgreSQL then commits the abandoned statement once the lock goes); the
    exit status must agree with the row: done by this attempt, exit 0."""
    with _outsider_holds_the_row(ledger_url, 9) as go:
        owner = start_once("run", "--job", "w", *DAY, "--stale-after", "6s", "--", "sh",
                           "-c", 'touch "$DIR/started"; '
                                 'while [ ! -e "$DIR/release" ]; do sleep 0.05; done', env=env)
        wait_for(lambda: (tmp_path / "started").exists(), what="the command")
        go.set()
        time.sleep(0.5)
        (tmp_path / "release").touch()
        _out, err = owner.communicate(timeout=90)
    assert query(ledger_url, "SELECT status, attempt, exit_code FROM once_runs") == [
        ("done", 1, 0)]
    assert owner.returncode == 0, err


# -- --require-same-command inside the claim -------------------------------------------------


def test_drift_is_decided_inside_the_claim(env: dict[str, str], tmp_path: Path) -> None:
    """Eight hosts, two commands, eight periods of a new job, released at one instant: the
    first claim to commit fixes the fingerprint, and every other command is refused."""
    log = tmp_path / "ran"
    commands = []
    for lag in range(8):
        name = "old" if lag % 2 else "new"
        commands.append([ONCE, "run", "--job", "d", *DAY, "--lag", str(lag),
                         "--require-same-command", "--", "sh", "-c",
                         f'echo {name} >> "{log}"', name])
    results = release_together(commands, tmp_path / "gate", env)
    ran = log.read_text().split()
    assert len(set(ran)) == 1, ran
    refused = [r for r in results if r.returncode == 2]
    assert len(refused) == 8 - len(ran), [r.stderr for r in results]
    assert all("last ran a different command" in r.stderr for r in refused)


def test_two_commands_of_a_new_job_held_inside_their_claims_run_one(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    """Deterministic form of the race above on PostgreSQL, whose claim of a new job had no
    row to lock: both hosts read no fingerprint, then wait on once_runs, which the test holds;
    let go, both ran. Now the second waits before its read, and is refused."""
    target = parse_url(ledger_url)
    if target.dialect != "postgresql":
        pytest.skip("MySQL's locking read of a missing row takes a gap lock; SQLite's claims "
                    "queue on its write lock")
    import psycopg

    log = tmp_path / "ran"
    waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND datname = current_database()")
    with psycopg.connect(target.connect_args["conninfo"]) as held:
        held.execute("LOCK TABLE once_runs IN SHARE MODE")
        fires = [start_once("run", "--job", "d", *DAY, "--lag", str(lag),
                            "--require-same-command", "--", "sh", "-c",
                            f'echo {name} >> "{log}"', name, env=env)
                 for lag, name in enumerate(["new", "old"])]
        wait_for(lambda: scalar(ledger_url, waiting) == 2, what="both claims waiting")
        held.rollback()
    results = [fire.communicate(timeout=60) for fire in fires]
    assert len(log.read_text().split()) == 1, results
    assert sorted(fire.returncode for fire in fires) == [0, 2], results
    assert any("last ran a different command" in err for _, err in results), results


def test_a_rerun_stores_its_fingerprint(env: dict[str, str], ledger_url: str) -> None:
    assert run_once("run", "--job", "f", *DAY, "--", "true", env=env).returncode == 0
    period = scalar(ledger_url, "SELECT period FROM once_runs")
    assert run_once("rerun", "--job", "f", "--period", period, "--", "true", "other",
                    env=env).returncode == 0
    again = run_once("run", "--job", "f", *DAY, "--lag", "1", "--require-same-command", "--",
                     "true", env=env)
    assert again.returncode == 2, again.stderr
    assert "last ran a different command" in again.stderr


# -- clocks ----------------------------------------------------------------------------------


def _faketime(env: dict[str, str], offset: str) -> dict[str, str]:
    """The environment of a host whose wall clock is `offset` off (libfaketime preloaded;
    the monotonic clocks stay true)."""
    import libfaketime

    library = os.path.join(os.path.dirname(libfaketime.__file__), "vendor", "libfaketime",
                           "src", "libfaketime.so.1")
    return {**env, "LD_PRELOAD": library, "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}


def _not_near_midnight(margin: float) -> None:
    """Wait out the last `margin` seconds of a UTC day, so that a test's periods stay put."""
    left = 86400 - time.time() % 86400
    if left < margin:
        time.sleep(left + 1)


@pytest.mark.parametrize("offset", ["-9000d", "-1d", "+1d"])
def test_a_host_with_a_wrong_clock_claims_nothing(env: dict[str, str], tmp_path: Path,
                                                  ledger_url: str, offset: str) -> None:
    if ledger_url.startswith("sqlite"):
        pytest.skip("one host, one clock: SQLite's clock is the host's")
    assert run_once("run", "--job", "c", *DAY, "--", "true", env=env).returncode == 0
    before = query(ledger_url, "SELECT first_period_start, schedule, fence FROM once_jobs")
    check_before = run_once("check", env=env)
    skewed = run_once("run", "--job", "c", *DAY, "--", "touch", str(tmp_path / "ran"),
                      env=_faketime(env, offset))
    assert skewed.returncode == 75, skewed.stderr
    (line,) = skewed.stderr.splitlines()
    assert line.startswith("once: ") and "clock" in line and "--max-clock-skew" in line
    assert not (tmp_path / "ran").exists()
    assert query(ledger_url, "SELECT first_period_start, schedule, fence FROM once_jobs") == (
        before)
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(1,)]
    check_after = run_once("check", env=env)
    assert (check_after.returncode, check_after.stdout) == (check_before.returncode,
                                                            check_before.stdout)
    # --max-clock-skew 0 turns the check off (a deliberate choice: the period is then the
    # host's).
    off = run_once("run", "--job", "c", *DAY, "--max-clock-skew", "0", "--", "touch",
                   str(tmp_path / "ran"), env=_faketime(env, offset))
    assert off.returncode == 0, off.stderr
    assert (tmp_path / "ran").exists()


def test_sqlite_a_clock_stepped_forward_does_not_take_over_a_live_owner(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    if not ledger_url.startswith("sqlite"):
        pytest.skip("the server backends judge staleness by the database's clock")
    # The step must not carry the next fire into the next day (another period).
    _not_near_midnight(margin=180)
    owner = start_once("run", "--job", "s", *DAY, "--stale-after", "5s", "--", "sh", "-c",
                       WAITER, env=env)
    try:
        pid = _pid(tmp_path)
        # The next fire believes it is a minute later: by the clock the owner is long stale.
        stepped = run_once("run", "--job", "s", *DAY, "--", "touch",
                           str(tmp_path / "second"), env=_faketime(env, "+60s"))
        assert stepped.returncode == 0, stepped.stderr
        assert not (tmp_path / "second").exists(), "a live owner was taken over"
        assert alive(pid)
    finally:
        (tmp_path / "release").touch()
    _out, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


def test_sqlite_a_dead_owner_is_still_taken_over(env: dict[str, str], tmp_path: Path,
                                                 ledger_url: str) -> None:
    """The lock goes with its process: a killed owner's stale row is taken over."""
    if not ledger_url.startswith("sqlite"):
        pytest.skip("SQLite's period locks")
    import signal

    owner = start_once("run", "--job", "k", *DAY, "--stale-after", "1s", "--", "sh", "-c",
                       WAITER, env=env)
    pid = _pid(tmp_path)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    wait_for(lambda: not alive(pid), timeout=10, what="the guard to kill the command")
    time.sleep(1.5)
    taken = run_once("run", "--job", "k", *DAY, "--", "touch", str(tmp_path / "second"),
                     env=env)
    assert taken.returncode == 0, taken.stderr
    assert (tmp_path / "second").exists()
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]


# A claimer mid-claim: holds the period's OS lock (once's own code) until told, writes no row.
_CLAIMER = """
import sys
from once.ledger.sqlite import _PeriodLocks
locks = _PeriodLocks(sys.argv[1])
assert locks.acquire((sys.argv[2], sys.argv[3]))
print("held", flush=True)
sys.stdin.readline()
"""


def _claimer(ledger_url: str, job: str, env: dict[str, str]) -> Any:
    stable_day()
    period = datetime.now(UTC).date().isoformat()
    claimer = subprocess.Popen([sys.executable, "-c", _CLAIMER, parse_url(ledger_url).path,
                                job, period], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert claimer.stdout is not None and claimer.stdout.readline() == "held\n"
    return claimer


def _has_open(pid: int, path: str) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.path.realpath(fd) == path for fd in fds.iterdir())


def test_sqlite_a_fire_waits_for_a_claimer_that_gives_up(env: dict[str, str], tmp_path: Path,
                                                         ledger_url: str) -> None:
    """A fire that finds the period's lock held and no row waits for that claimer, which here
    gives up (as a fire of an older once the ledger refuses does): the fire runs the period,
    instead of skipping it for a claimer that then ran nothing."""
    if not ledger_url.startswith("sqlite"):
        pytest.skip("SQLite's period locks")
    assert run_once("schema", env=env).returncode == 0
    claimer = _claimer(ledger_url, "k", env)
    fire = start_once("run", "--job", "k", *DAY, "--stale-after", "30s", "--", "touch",
                      str(tmp_path / "ran"), env=env)
    locks = os.path.realpath(parse_url(ledger_url).path + ".locks")
    wait_for(lambda: fire.poll() is not None or _has_open(fire.pid, locks),
             what="the fire to try the period's lock")
    claimer.communicate("\n", timeout=10)  # gives up: the lock goes with its process
    _out, err = fire.communicate(timeout=60)
    assert fire.returncode == 0 and (tmp_path / "ran").exists(), err
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


def test_sqlite_the_wait_for_a_claimer_is_bounded(env: dict[str, str], tmp_path: Path,
                                                  ledger_url: str) -> None:
    """A claimer that neither wins nor gives up (stopped, stuck) is waited for a statement
    timeout (a second at --stale-after 3s), then the fire skips as held."""
    if not ledger_url.startswith("sqlite"):
        pytest.skip("SQLite's period locks")
    assert run_once("schema", env=env).returncode == 0
    claimer = _claimer(ledger_url, "k", env)
    try:
        fire = run_once("run", "--job", "k", *DAY, "--stale-after", "3s", "-v", "--", "touch",
                        str(tmp_path / "ran"), env=env)
    finally:
        claimer.communicate("\n", timeout=10)
    assert fire.returncode == 0, fire.stderr
    assert "skipped: held by another process" in fire.stderr
    assert not (tmp_path / "ran").exists()

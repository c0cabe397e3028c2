"""`Run.finish_in` at every isolation level: the caller's transaction outlives heartbeats, a
taken-over owner is fenced out mid-transaction, a takeover waits for a marker in flight, and a
period whose owner died after its commit is never run again (docs/how-to/python.md).

The owner is a real process (tests/api_owner.py) where it must be stopped or killed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import once
from helpers import run_once, wait_for
from ledger_sql import query, scalar
from once.ledger import parse_url

LEVELS = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
STALE = 1.5  # seconds: a renewal every 0.5 s
OWNER = str(Path(__file__).resolve().parents[1] / "api_owner.py")


def dialect(url: str) -> str:
    return parse_url(url).dialect


def level_on(url: str, level: str) -> None:
    """SQLite has one isolation level, serializable: it runs under that name only."""
    if dialect(url) == "sqlite" and level != "SERIALIZABLE":
        pytest.skip("SQLite has one isolation level: serializable")


def connect(url: str, level: str) -> Any:
    target = parse_url(url)
    if target.dialect == "sqlite":
        import sqlite3

        return sqlite3.connect(target.path, timeout=30)
    if target.dialect == "postgresql":
        import psycopg

        conn = psycopg.connect(target.connect_args["conninfo"])
        conn.isolation_level = getattr(psycopg.IsolationLevel, level.replace(" ", "_"))
        return conn
    import pymysql

    conn = pymysql.connect(**target.connect_args)
    conn.cursor().execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")
    return conn


def execute(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    cur = conn.cursor()
    cur.execute(sql)
    return [tuple(r) for r in cur.fetchall()] if cur.description else []


@pytest.fixture
def work(ledger_url: str) -> str:
    """The job's own table, in the ledger's database, and the ledger's tables (a first use
    takes a second or so: the claims under test are quick)."""
    query(ledger_url, "CREATE TABLE work (x INTEGER)")
    with once.claim("warm-up", every="day", db=ledger_url):
        pass
    return ledger_url


def heartbeat(url: str, job: str) -> Any:
    return scalar(url, f"SELECT heartbeat_at FROM once_runs WHERE job = '{job}'")


def heartbeat_age(url: str, job: str) -> float:
    """Seconds since the row's heartbeat, by the database's clock."""
    age = {"postgresql": "extract(epoch FROM clock_timestamp() - heartbeat_at)",
           "mysql": "TIMESTAMPDIFF(MICROSECOND, heartbeat_at, UTC_TIMESTAMP(6)) / 1e6",
           "sqlite": "(julianday('now') - julianday(heartbeat_at)) * 86400.0"}[dialect(url)]
    return float(scalar(url, f"SELECT {age} FROM once_runs WHERE job = '{job}'"))


def rows(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(once_runs' status and attempt, once_attempts' attempt, status and outcome)."""
    return (query(url, "SELECT status, attempt FROM once_runs WHERE job <> 'warm-up'"),
            query(url, "SELECT attempt, status, outcome FROM once_attempts "
                       "WHERE job <> 'warm-up' ORDER BY attempt"))


# -- a transaction longer than two heartbeats -------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_transaction_longer_than_two_heartbeats_commits_work_and_marker(
        work: str, level: str) -> None:
    """Fails before the marker moved to once_attempts: at REPEATABLE READ and SERIALIZABLE
    PostgreSQL refused finish_in (could not serialize access due to concurrent update)."""
    if dialect(work) == "sqlite":
        pytest.skip("SQLite: its write lock holds renewals back (the tests below)")
    with once.claim("long", every="day", db=work, stale_after=STALE) as run:
        conn = connect(work, level)
        execute(conn, "SELECT count(*) FROM work")  # the snapshot, before any renewal
        execute(conn, "INSERT INTO work VALUES (1)")
        first = heartbeat(work, "long")
        seen = [first]
        wait_for(lambda: _renewed(work, seen) >= 2, what="two renewals during the transaction")
        run.finish_in(conn)
        assert rows(work)[0] == [("running", 1)]  # nothing before the commit
        conn.commit()
        conn.close()
        assert not run.lost
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])
    assert query(work, "SELECT count(*) FROM work") == [(1,)]


def _renewed(url: str, seen: list[Any]) -> int:
    """How many times the heartbeat has moved since the first value in seen."""
    now = heartbeat(url, "long")
    if now != seen[-1]:
        seen.append(now)
    return len(seen) - 1


def test_sqlite_renewals_wait_for_the_callers_write_lock(work: str) -> None:
    """A write takes SQLite's one write lock, which renewals need too: they wait for the
    commit (past two renewal intervals here, within stale_after), then go through."""
    if dialect(work) != "sqlite":
        pytest.skip("SQLite's write lock")
    claimed = time.monotonic()  # before the claim: the lease's clock starts there too
    with once.claim("long", every="day", db=work, stale_after=STALE) as run:
        conn = connect(work, "SERIALIZABLE")
        execute(conn, "INSERT INTO work VALUES (1)")  # the write lock, from here to the commit
        before = heartbeat(work, "long")
        assert time.monotonic() - claimed < STALE / 3, "the first renewal came before the lock"
        # The transaction's length under test: past two renewal intervals, and short enough
        # that the renewal waiting since the first (SQLite's busy timeout, 1 s) gets in.
        time.sleep(claimed + 1.2 - time.monotonic())
        assert heartbeat(work, "long") == before  # no renewal got through
        run.finish_in(conn)
        conn.commit()
        conn.close()
        wait_for(lambda: heartbeat(work, "long") != before, what="a renewal after the commit")
        assert not run.lost
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])
    assert query(work, "SELECT count(*) FROM work") == [(1,)]


def test_sqlite_a_write_lock_held_past_stale_after_loses_the_lease_not_the_period(
        work: str) -> None:
    """Past stale_after without a renewal the lease runs out (run.lost: run.check() raises),
    but nothing can take the period over while the write lock and the row's OS lock are
    held: finish_in and the finish after the block still record it done."""
    if dialect(work) != "sqlite":
        pytest.skip("SQLite's write lock")
    with once.claim("held", every="day", db=work, stale_after=STALE) as run:
        conn = connect(work, "SERIALIZABLE")
        execute(conn, "INSERT INTO work VALUES (1)")
        wait_for(lambda: run.lost, what="the lease to run out")
        with pytest.raises(once.FencedOut):
            run.check()
        run.finish_in(conn)
        conn.commit()
        conn.close()
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])
    assert query(work, "SELECT count(*) FROM work") == [(1,)]


# -- what the block's end records ---------------------------------------------------------------


def test_a_marker_rolled_back_records_failed(work: str) -> None:
    with once.claim("undo", every="day", db=work, stale_after=STALE) as run:
        conn = connect(work, "READ COMMITTED")
        execute(conn, "INSERT INTO work VALUES (1)")
        run.finish_in(conn)
        conn.rollback()
        conn.close()
    assert rows(work) == ([("failed", 1)], [(1, "failed", "failed")])
    with once.claim("undo", every="day", db=work) as retry:
        assert retry.won and retry.attempt == 2


def test_an_exception_after_the_commit_records_done(work: str) -> None:
    with pytest.raises(RuntimeError), once.claim("late", every="day", db=work) as run:
        conn = connect(work, "READ COMMITTED")
        execute(conn, "INSERT INTO work VALUES (1)")
        run.finish_in(conn)
        conn.commit()
        conn.close()
        raise RuntimeError("after the commit")
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])


def test_a_block_that_ends_before_the_commit_is_settled_by_the_next_claim(work: str) -> None:
    """The claim inside the transaction: its end records nothing (the marker may still roll
    back); the row goes stale, and the next claim finds the marker committed: done, not run."""
    conn = connect(work, "READ COMMITTED")
    with once.claim("outside", every="day", db=work, stale_after=STALE) as run:
        execute(conn, "INSERT INTO work VALUES (1)")
        run.finish_in(conn)
    assert rows(work)[0] == [("running", 1)]
    conn.commit()
    conn.close()
    wait_for(lambda: heartbeat_age(work, "outside") > STALE, what="the row to go stale")
    with once.claim("outside", every="day", db=work) as again:
        assert not again.won and again.skip_reason == "skipped-done"
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])


# -- a real owner, stopped, taken over, killed --------------------------------------------------


class Owner:
    """tests/api_owner.py, one step at a time."""

    def __init__(self, url: str, job: str, level: str) -> None:
        self.proc = subprocess.Popen([sys.executable, OWNER, url, job, level, str(STALE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.line() == "claimed 1"

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def step(self, step: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(step + "\n")
        self.proc.stdin.flush()
        return self.line()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for owner in started:
        owner.close()


def fire(env: dict[str, str], job: str, marker: Path) -> subprocess.CompletedProcess[str]:
    """A cron fire of the same job and day: the command touches marker when it runs."""
    return run_once("run", "--job", job, "--every", "day", "--stale-after", "2s",
                    "--", "touch", str(marker), env=env)


@pytest.mark.parametrize("level", LEVELS)
def test_an_owner_taken_over_mid_transaction_is_fenced_out_and_rolls_back(
        work: str, once_env: dict[str, str], owners: list[Owner], tmp_path: Path,
        level: str) -> None:
    """Stopped in its transaction past stale_after, the owner is taken over; continued, its
    finish_in finds its attempt marked taken-over: FencedOut (at REPEATABLE READ and
    SERIALIZABLE, PostgreSQL's serialization failure), and its work is rolled back."""
    level_on(work, level)
    owner = Owner(work, "job", level)
    owners.append(owner)
    assert owner.step("begin").startswith("ok begin")
    owner.signal(signal.SIGSTOP)
    marker = tmp_path / "ran"
    if dialect(work) == "sqlite":
        # The stopped owner holds the row's OS lock and the write lock: never taken over.
        wait_for(lambda: heartbeat_age(work, "job") > STALE, what="the row to go stale")
        assert fire(once_env, "job", marker).returncode in (0, 75) and not marker.exists()
        owner.signal(signal.SIGCONT)
        assert [owner.step(s) for s in ("mark", "commit")] == ["ok mark", "ok commit"]
        assert owner.step("leave") == "left"
        assert rows(work) == ([("done", 1)], [(1, "done", "done")])
        return
    wait_for(lambda: fire(once_env, "job", marker).returncode == 0 and marker.exists(),
             timeout=60, what="a fire to take the stale row over")
    owner.signal(signal.SIGCONT)
    refused = owner.step("mark")
    serializable = dialect(work) == "postgresql" and level != "READ COMMITTED"
    assert refused in (("error mark FencedOut", "error mark SerializationFailure")
                       if serializable else ("error mark FencedOut",))
    assert owner.step("rollback") == "ok rollback"
    assert owner.step("leave") == "left-error FencedOut"
    assert query(work, "SELECT count(*) FROM work") == [(0,)]
    assert rows(work) == ([("done", 2)], [(1, "running", "taken-over"), (2, "done", "done")])


def blocked_by(url: str, session: int) -> int:
    """How many server sessions wait for a lock that the session holds."""
    if dialect(url) == "postgresql":
        return int(scalar(url, "SELECT count(*) FROM pg_stat_activity "
                               f"WHERE {session} = ANY(pg_blocking_pids(pid))"))
    waits = int(scalar(url, "SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS w "
                            "JOIN information_schema.INNODB_TRX t "
                            "ON t.trx_id = w.blocking_trx_id "
                            f"WHERE t.trx_mysql_thread_id = {session}"))
    # MariaDB does not always list a locking read that waits while its plan is made (state
    # "Statistics", the row read as a constant) in INNODB_LOCK_WAITS: a read by primary key
    # still going after 2 s is one waiting for the lock, the only writer being the session.
    return waits or int(scalar(url, "SELECT count(*) FROM information_schema.PROCESSLIST "
                                    "WHERE info LIKE '%FROM once_attempts%FOR UPDATE' "
                                    f"AND time >= 2 AND id <> {session}"))


@pytest.mark.parametrize("ending", ["commit", "rollback"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_takeover_waits_for_a_marker_in_flight(
        work: str, once_env: dict[str, str], owners: list[Owner], tmp_path: Path,
        level: str, ending: str) -> None:
    """The owner marked the period done but has not committed when it is stopped past
    stale_after: a fire waits for that transaction, then records the period done (commit)
    and runs nothing, or takes it over and runs it (rollback). Never both, never neither."""
    if dialect(work) == "sqlite":
        pytest.skip("SQLite: a live owner's row is never taken over (its OS lock)")
    owner = Owner(work, "job", level)
    owners.append(owner)
    session = int(owner.step("begin").rsplit(" ", 1)[1])
    assert owner.step("mark") == "ok mark"
    owner.signal(signal.SIGSTOP)
    wait_for(lambda: heartbeat_age(work, "job") > STALE, what="the row to go stale")
    marker = tmp_path / "ran"
    cron = subprocess.Popen(
        [str(Path(sys.executable).with_name("once")), "run", "--job", "job", "--every", "day",
         "--stale-after", "30s", "--", "touch", str(marker)],
        env=once_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: blocked_by(work, session) > 0, what="the fire to wait for the marker")
        owner.signal(signal.SIGCONT)
        assert owner.step(ending) == f"ok {ending}"
        _out, err = cron.communicate(timeout=60)
    finally:
        if cron.poll() is None:
            cron.kill()
    assert cron.returncode == 0, err
    if ending == "commit":
        assert not marker.exists()
        assert owner.step("leave") == "left"
        assert rows(work) == ([("done", 1)], [(1, "done", "done")])
        assert query(work, "SELECT count(*) FROM work") == [(1,)]
    else:
        assert marker.exists()
        assert owner.step("leave") == "left-error FencedOut"
        assert rows(work) == ([("done", 2)], [(1, "running", "taken-over"), (2, "done", "done")])
        assert query(work, "SELECT count(*) FROM work") == [(0,)]


def test_a_fire_skips_a_live_owner_whose_marker_is_in_flight(
        work: str, once_env: dict[str, str], owners: list[Owner], tmp_path: Path) -> None:
    """The marker's row is locked only behind a stale heartbeat: a fire at a live owner whose
    transaction holds its marker skips at once, without waiting for that transaction (a
    wait would last until the fire's statement timeout, 10 s, then exit 75)."""
    if dialect(work) == "sqlite":
        pytest.skip("SQLite: every claim waits for the owner's write lock")
    owner = Owner(work, "job", "READ COMMITTED")
    owners.append(owner)
    assert owner.step("begin").startswith("ok begin")
    assert owner.step("mark") == "ok mark"
    marker = tmp_path / "ran"
    skipped = run_once("run", "--job", "job", "--every", "day", "-v", "--", "touch",
                       str(marker), env=once_env)
    assert skipped.returncode == 0 and not marker.exists(), skipped.stderr
    assert [owner.step("commit"), owner.step("leave")] == ["ok commit", "left"]
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])


@pytest.mark.parametrize("level", LEVELS)
def test_an_owner_killed_after_its_commit_is_not_run_again(
        work: str, once_env: dict[str, str], owners: list[Owner], tmp_path: Path,
        level: str) -> None:
    """The owner commits its work and marker, then is killed before the block ends: its row
    stays running until stale, and the fire that finds it then records it done (the marker's
    time) instead of running the period again."""
    level_on(work, level)
    owner = Owner(work, "job", level)
    owners.append(owner)
    assert [owner.step(s).split(" ")[:2] for s in ("begin", "mark", "commit")] == [
        ["ok", "begin"], ["ok", "mark"], ["ok", "commit"]]
    owner.step("die")  # answered by the kill: no line
    owner.proc.wait(timeout=30)
    assert rows(work)[0] == [("running", 1)]
    marker = tmp_path / "ran"
    wait_for(lambda: fire(once_env, "job", marker).returncode == 0
             and rows(work)[0] == [("done", 1)], timeout=60, what="a fire to settle the row")
    assert not marker.exists()
    assert rows(work) == ([("done", 1)], [(1, "done", "done")])
    assert query(work, "SELECT count(*) FROM work") == [(1,)]
    assert query(work, "SELECT r.finished_at = a.finished_at FROM once_runs r, once_attempts a "
                       "WHERE r.job = 'job' AND a.job = r.job AND a.period = r.period "
                       "AND a.attempt = r.attempt") in ([(True,)], [(1,)])
    assert fire(once_env, "job", marker).returncode == 0 and not marker.exists()


def test_prune_keeps_the_marker_of_a_period_not_yet_settled(
        work: str, once_env: dict[str, str], owners: list[Owner], tmp_path: Path) -> None:
    """The marker of an owner killed after its commit is what keeps the period from running
    again: `once prune` keeps it however old, while the row it holds is running."""
    owner = Owner(work, "job", "SERIALIZABLE" if dialect(work) == "sqlite" else "READ COMMITTED")
    owners.append(owner)
    assert [owner.step(s).split(" ")[:2] for s in ("begin", "mark", "commit")] == [
        ["ok", "begin"], ["ok", "mark"], ["ok", "commit"]]
    owner.step("die")
    owner.proc.wait(timeout=30)
    query(work, "UPDATE once_attempts SET finished_at = "
          + {"postgresql": "finished_at - INTERVAL '400 days'",
             "mysql": "finished_at - INTERVAL 400 DAY",
             "sqlite": "'2025-01-01 00:00:00.000000'"}[dialect(work)] + " WHERE job = 'job'")
    pruned = run_once("prune", "--older-than", "30d", env=once_env)
    assert pruned.returncode == 0, pruned.stderr
    assert rows(work) == ([("running", 1)], [(1, "done", "done")])
    marker = tmp_path / "ran"
    wait_for(lambda: fire(once_env, "job", marker).returncode == 0
             and rows(work)[0] == [("done", 1)], timeout=60, what="a fire to settle the row")
    assert not marker.exists()


def test_a_rerun_runs_a_period_whose_owner_died_after_its_commit(
        work: str, once_env: dict[str, str], owners: list[Owner], tmp_path: Path) -> None:
    """`once rerun` is asked to run the period again: the marker does not stop it (a fire
    would have recorded the period done), and the marked attempt stays done in the history."""
    owner = Owner(work, "job", "SERIALIZABLE" if dialect(work) == "sqlite" else "READ COMMITTED")
    owners.append(owner)
    for step in ("begin", "mark", "commit"):
        assert owner.step(step).startswith(f"ok {step}")
    owner.step("die")
    owner.proc.wait(timeout=30)
    day = scalar(work, "SELECT period FROM once_runs WHERE job = 'job'")
    wait_for(lambda: heartbeat_age(work, "job") > STALE, what="the row to go stale")
    marker = tmp_path / "ran"
    rerun = run_once("rerun", "--job", "job", "--period", day, "--", "touch", str(marker),
                     env=once_env)
    assert rerun.returncode == 0 and marker.exists(), rerun.stderr
    assert rows(work) == ([("done", 2)], [(1, "done", "done"), (2, "done", "done")])

"""Liveness on every backend: heartbeats, fencing out, owner death, signals, timeouts.

Real `once` processes, real signals, real databases. Tests wait on what they can observe (a
file the child writes, a row in the ledger, /proc); where staleness needs time to pass, they
let it pass, with bounds generous enough for a loaded two-core machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from helpers import ONCE, continue_if_sqlite, run_once, wait_for
from ledger_sql import query, scalar
from once.ledger import Claim, Job, open_ledger, parse_url
from once.run.attempt import FINISH_GRACE_MIN as FINISH_GRACE
from private_postgres import PrivatePostgres
from procs import (
    Terminal,
    alive,
    children,
    group_leaders,
    parent,
    pids,
    start_once,
    zombie_children,
)

pytestmark = pytest.mark.tables_made  # none is about a first use

STALE = "2s"  # where staleness is the subject: it has to pass within a test
CALM = "60s"  # where it is not: a database stalled by a loaded machine must not fence out
DAY = ["--every", "day"]

# A child that records its pid, then a background sleep's, and waits: `sh -c 'sleep & wait'`.
# On SIGTERM (or INT/HUP: $SIG) it notes that it saw the signal, then dies of it.
# The shells' own stderr ("Terminated", say) goes to a file: once's stderr is under test.
SLEEPER = ('exec 2>>"$DIR/child.err"; echo $$ > "$DIR/pids"; '
           'trap \'touch "$DIR/got-signal"; trap - $SIG; kill -$SIG $$\' $SIG; '
           'sleep 600 & echo $! >> "$DIR/pids"; wait')
# Notes that it started, then waits for $DIR/release.
WAITER = 'touch "$DIR/started"; while [ ! -e "$DIR/release" ]; do sleep 0.05; done'
# A SLEEPER deaf to SIGTERM (the background sleep inherits the ignored signal).
DEAF = ('exec 2>>"$DIR/child.err"; echo $$ > "$DIR/pids"; trap "" TERM; '
        'sleep 600 & echo $! >> "$DIR/pids"; wait')


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**once_env, "DIR": str(tmp_path), "SIG": "TERM"}


def epoch(value: Any) -> float:
    """A timestamp from the ledger (text on SQLite, naive UTC on MySQL) as seconds."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


def once_lines(stderr: str) -> list[str]:
    """stderr must be exactly one `once:` line; return it as a list."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("once: "), stderr
    return lines


def finished(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def child_pids(tmp_path: Path) -> list[int]:
    """The shell's pid and its background sleep's, once both are written."""
    return wait_for(lambda: pids(tmp_path / "pids", 2), what="the child's pids")


# -- heartbeats ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_live_owner_keeps_a_run_longer_than_stale_after(env: dict[str, str], tmp_path: Path,
                                                          ledger_url: str) -> None:
    # 6s, not less: the owner steps down when its renewals (every 2 s here) go unanswered
    # for most of it, as a SQLite commit stalled by a loaded machine's disk can (CI saw 3s
    # lost once, the owner stepping down and a fire rightly taking over).
    owner = start_once("run", "--job", "long", *DAY, "--stale-after", "6s", "--", "sh", "-c",
                       WAITER, env=env)
    wait_for(lambda: (tmp_path / "started").exists(), what="the owner's child")
    began = time.monotonic()
    others = []
    # Fire for well over twice --stale-after, and at least four times however slow a fire is
    # on a loaded machine.
    while time.monotonic() - began < 13 or len(others) < 4:
        others.append(run_once("run", "--job", "long", *DAY, "--stale-after", "6s", "--",
                               "touch", str(tmp_path / "second"), env=env))
        time.sleep(0.5)
    assert [r.returncode for r in others] == [0] * len(others), [r.stderr for r in others]
    if (tmp_path / "second").exists() or owner.poll() is not None:
        owner.kill()
        pytest.fail(f"a fire took over a live owner; the owner said: {owner.communicate()}")
    started, beat = query(ledger_url, "SELECT started_at, heartbeat_at FROM once_runs")[0]
    assert epoch(beat) - epoch(started) > 10  # renewed all along (every 2 s)
    (tmp_path / "release").touch()
    assert finished(owner)[0] == 0
    assert query(ledger_url, "SELECT status, attempt, exit_code FROM once_runs") == [
        ("done", 1, 0)]


# -- owner death -----------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_of_the_wrapper_kills_the_whole_command_and_the_claim_goes_stale(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    # Generous: a `once` started on a loaded two-core machine may take seconds to claim, and
    # the early fire below must have its answer within it (with 6 s, under load, it came past
    # the deadline and rightly took over).
    stale = 15.0
    args = ["run", "--job", "killed", *DAY, "--stale-after", f"{stale:g}s", "--"]
    owner = start_once(*args, "sh", "-c", SLEEPER, env=env)
    shell, sleeper = child_pids(tmp_path)
    guard = parent(shell)
    assert parent(guard) == owner.pid
    owner.kill()
    killed = time.monotonic()
    # Before --stale-after has passed, another `once run` skips the period.
    early = start_once(*args, "touch", str(tmp_path / "early"), env=env)
    wait_for(lambda: not any(alive(p) for p in (guard, shell, sleeper)), timeout=stale / 3,
             what="the guard, the shell and its child to die with the wrapper")
    owner.wait(10)
    assert finished(early)[0] == 0
    assert time.monotonic() - killed < stale - 1, "the early run came too late to prove a skip"
    assert not (tmp_path / "early").exists()
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("running", 1)]
    # After it, the first `once run` takes over as attempt 2 with a larger fence.
    time.sleep(max(0.0, killed + stale + 0.5 - time.monotonic()))
    late = run_once(*args, "sh", "-c", 'echo "$ONCE_ATTEMPT $ONCE_FENCE" > "$DIR/late"', env=env)
    assert late.returncode == 0, late.stderr
    attempt, fence = (tmp_path / "late").read_text().split()
    assert attempt == "2"
    first_fence = scalar(ledger_url, "SELECT fence FROM once_attempts WHERE attempt = 1")
    assert int(fence) > first_fence
    assert query(ledger_url, "SELECT status, attempt, fence FROM once_runs") == [
        ("done", 2, int(fence))]


# -- fencing out -----------------------------------------------------------------------------


def test_a_paused_owner_is_fenced_out_when_it_wakes(env: dict[str, str], tmp_path: Path,
                                                    ledger_url: str) -> None:
    args = ["run", "--job", "paused", *DAY, "--stale-after", STALE, "--"]
    first = start_once(*args, "sh", "-c", SLEEPER, env=env)
    shell, sleeper = child_pids(tmp_path)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        # Others skip while the heartbeat is fresh; once it is stale, one takes over.
        def second_ran() -> bool:
            result = run_once(*args, "sh", "-c", 'echo "$ONCE_ATTEMPT" > "$DIR/second"',
                              env=env)
            assert result.returncode == 0, result.stderr
            return (tmp_path / "second").exists()

        continue_if_sqlite(ledger_url, first, sleeper, second_ran, 2.0)
        wait_for(second_ran, what="a second instance to take over")
        assert (tmp_path / "second").read_text().split() == ["2"]
        # The guard stopped it at the deadline: it never runs beside the takeover's command.
        assert not alive(shell) and not alive(sleeper), (
            "the first owner's child ran on while its owner was stopped")
    finally:
        first.send_signal(signal.SIGCONT)  # (reaped already on SQLite: then a no-op)
    woke = time.monotonic()
    status, _, err = finished(first)
    assert status == 70
    assert time.monotonic() - woke < 2 / 3 + 5  # one renewal interval, and a margin
    assert "fenced out" in once_lines(err)[0]
    wait_for(lambda: not alive(shell) and not alive(sleeper), timeout=5,
             what="the fenced-out child to die")
    assert (tmp_path / "got-signal").exists()  # stopped with SIGTERM first
    assert query(ledger_url, "SELECT status, attempt, exit_code FROM once_runs") == [
        ("done", 2, 0)]
    # The first attempt wrote nothing, not even to the history.
    assert query(ledger_url, "SELECT attempt, status FROM once_attempts ORDER BY attempt") == [
        (1, "running"), (2, "done")]


def test_an_owner_woken_past_its_deadline_writes_nothing_and_says_it_was_stopped(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    # Renewals every 2 s: the stop below lands between two of them even on a loaded machine
    # (with STALE's 0.67 s, it caught the next one in flight there).
    stale = 6.0
    args = ["run", "--job", "woken", *DAY, "--stale-after", f"{stale:g}s", "--"]
    first = start_once(*args, "sh", "-c", SLEEPER, env=env)
    _shell, sleeper = child_pids(tmp_path)
    # Stopped once renewals have begun: between two, or (its commit seen is not its return)
    # with the renewing thread still on its way back, which the woken wrapper's overrun wait
    # names a stop too (the guard's own step-down at the deadline reaches it a few waits
    # after the stop). Continued after the guard's SIGTERM, a grace before the deadline, the
    # renewing thread sends nothing (it sent one there: 3 runs in 16, 8 at once, said the
    # ledger gave no answer).
    sent = query(ledger_url, "SELECT heartbeat_at FROM once_runs")
    wait_for(lambda: query(ledger_url, "SELECT heartbeat_at FROM once_runs") != sent,
             timeout=30, what="a renewal")
    os.kill(first.pid, signal.SIGSTOP)
    try:  # the guard keeps the deadline: the command dies by it
        wait_for(lambda: not alive(sleeper), timeout=30, what="the guard to stop the command")
        beat = query(ledger_url, "SELECT heartbeat_at FROM once_runs")
    finally:
        first.send_signal(signal.SIGCONT)
    status, _, err = finished(first)
    assert status == 70
    line = once_lines(err)[0]
    # Stopped between renewals, or (under load) with one still on its way back: either way
    # the line says that this process was stopped, never that the ledger failed.
    assert ("its deadline passed before this process could renew (it was stopped" in line
            or "its deadline passed while this process was stopped or suspended (it " in line), line
    assert "unreachable" not in line
    # No renewal sent after waking: a renewal caught mid-statement by the stop may land, but
    # none that would hold the period one more promise (before, the heartbeat was "now").
    late = epoch(query(ledger_url, "SELECT heartbeat_at FROM once_runs")[0][0])
    assert late - epoch(beat[0][0]) < stale, (late, beat)  # within the promise it had made
    def taken_over() -> bool:
        assert run_once(*args, "true", env=env).returncode == 0
        return query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]
    wait_for(taken_over, timeout=stale + 10, what="the next fire to take the period over")


def test_a_renewal_that_finds_the_row_taken_fences_out(env: dict[str, str], tmp_path: Path,
                                                       ledger_url: str) -> None:
    first = start_once("run", "--job", "taken", *DAY, "--stale-after", STALE, "--", "sh", "-c",
                       SLEEPER, env=env)
    shell, sleeper = child_pids(tmp_path)
    # Another attempt owns the row now (as a takeover would leave it).
    query(ledger_url, "UPDATE once_runs SET attempt = 2, fence = fence + 100")
    status, _, err = finished(first, timeout=30)
    assert status == 70
    assert "fenced out" in once_lines(err)[0]
    assert not alive(shell) and not alive(sleeper)
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("running", 2)]


# -- signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_signal_to_the_wrapper_is_forwarded(env: dict[str, str], tmp_path: Path,
                                              ledger_url: str, sig: signal.Signals) -> None:
    env = {**env, "SIG": sig.name[3:]}
    owner = start_once("run", "--job", "signalled", *DAY, "--stale-after", CALM, "--", "sh",
                       "-c", SLEEPER, env=env)
    shell, sleeper = child_pids(tmp_path)
    os.kill(owner.pid, sig)
    status, _, err = finished(owner)
    assert status == 128 + sig, err
    assert "Traceback" not in err
    assert (tmp_path / "got-signal").exists()  # the child saw the signal itself
    # A shell's background child ignores SIGINT; it is killed all the same.
    wait_for(lambda: not alive(shell) and not alive(sleeper), timeout=5,
             what="the command and its child to end")
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [
        ("failed", 128 + sig)]


# -- timeout ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("script", "killed_by"), [(SLEEPER, 15), (DEAF, 9)],
                         ids=["sigterm", "sigkill"])
def test_timeout_exits_124_and_records_failed(env: dict[str, str], tmp_path: Path,
                                              ledger_url: str, script: str,
                                              killed_by: int) -> None:
    timeout, kill_after = 1.0, 1.0
    began = time.monotonic()
    owner = start_once("run", "--job", "slow", *DAY, "--stale-after", CALM, "--timeout",
                       f"{timeout:g}s", "--kill-after", f"{kill_after:g}s", "--", "sh", "-c",
                       script, env=env)
    status, _, err = finished(owner)
    took = time.monotonic() - began
    assert status == 124
    assert "timed out" in once_lines(err)[0]
    least = timeout + (kill_after if killed_by == 9 else 0)
    assert least <= took < timeout + kill_after + 15, took  # generous: a loaded machine
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [
        ("failed", 128 + killed_by)]
    assert not any(alive(p) for p in pids(tmp_path / "pids", 2) or [])


# -- the terminal ----------------------------------------------------------------------------


def test_on_a_terminal_the_command_reads_it(env: dict[str, str], ledger_url: str) -> None:
    term = Terminal([ONCE, "run", "--job", "tty", *DAY, "--stale-after", CALM, "--", "sh",
                     "-c", 'echo ready; read x; echo "got $x"'], env)
    term.expect("ready")
    term.write(b"hello\n")
    term.expect("got hello")
    assert term.wait() == 0, term.output
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("done", 0)]


def test_on_a_terminal_ctrl_c_reaches_the_command(env: dict[str, str], ledger_url: str) -> None:
    term = Terminal([ONCE, "run", "--job", "tty", *DAY, "--stale-after", CALM, "--", "sh",
                     "-c", 'echo ready; read x; echo "not interrupted"'], env)
    term.expect("ready")
    term.write(b"\x03")
    assert term.wait() == 130, term.output
    assert b"not interrupted" not in term.output
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 130)]


# -- PID 1 -----------------------------------------------------------------------------------


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --pid (namespaces)")
def test_as_pid_1_orphans_are_reaped_and_signals_work(env: dict[str, str], tmp_path: Path,
                                                      ledger_url: str) -> None:
    # A grandchild orphaned by its shell is reparented to PID 1, the wrapper, which must reap
    # it when it ends; a SIGTERM to PID 1 is forwarded (PID 1 has no default handlers).
    script = ('sh -c \'(sleep 0.3; touch "$DIR/orphan-done") & \'; ' + SLEEPER)
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", ONCE, "run", "--job",
                            "init", *DAY, "--stale-after", CALM, "--", "sh", "-c", script],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child_pids(tmp_path)  # pids in the namespace: the host knows them by others
    (init,) = wait_for(lambda: children(box.pid), what="once as PID 1")
    nspid = Path(f"/proc/{init}/status").read_text().split("NSpid:")[1].splitlines()[0]
    assert nspid.split()[-1] == "1"
    # The guard leads its group; the orphan may end while the children are looked at.
    (guard,) = wait_for(lambda: group_leaders(init), what="the guard")
    wait_for(lambda: (tmp_path / "orphan-done").exists(), what="the orphan to end")
    wait_for(lambda: not zombie_children(init), timeout=5, what="PID 1 to reap the orphan")
    os.kill(init, signal.SIGTERM)
    status, _, err = finished(box)
    assert status == 143, err
    assert not alive(guard)
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 143)]


# -- the ledger's side of a renewal ----------------------------------------------------------


def test_renewals_within_one_clock_tick_are_still_ours(ledger_url: str, backend: Any) -> None:
    # MariaDB reports the rows an UPDATE changed, not those it matched, unless the client asks
    # for FOUND_ROWS: two renewals within one tick would read as "lost". Freeze its clock to
    # make every renewal a same-tick one.
    ledger = open_ledger(parse_url(ledger_url))
    job = Job("tick", "every", "day", "UTC", stale_after=60)
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    with ledger:
        claim = ledger.claim(job, "2026-01-01", start, end, "me")
        assert claim.won
        if backend.dialect == "mysql":
            ledger._conn.cursor().execute("SET timestamp = UNIX_TIMESTAMP(UTC_TIMESTAMP(6))")
        assert ledger.renew(job.name, "2026-01-01", claim)
        assert ledger.renew(job.name, "2026-01-01", claim)
        assert ledger.renew(job.name, "2026-01-01", claim)
        stranger = Claim(True, claim.attempt, claim.fence, claim_id="0" * 16)
        assert not ledger.renew(job.name, "2026-01-01", stranger)  # same attempt, not ours
        assert ledger.finish(job.name, "2026-01-01", claim, "done", 0, "exited")
        assert not ledger.renew(job.name, "2026-01-01", claim)
    if backend.dialect == "mysql":
        # Without FOUND_ROWS the same-tick renewal reads 0 rows: the test above means it.
        import pymysql

        conn = pymysql.connect(**parse_url(ledger_url).connect_args, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SET timestamp = UNIX_TIMESTAMP(UTC_TIMESTAMP(6))")
                renew = "UPDATE once_runs SET heartbeat_at = UTC_TIMESTAMP(6)"
                assert cur.execute(renew) == 1
                assert cur.execute(renew) == 0
        finally:
            conn.close()


# -- PostgreSQL stopped and restarted mid-run (tests/private_postgres.py; not per backend) ----


@pytest.mark.slow
def test_a_short_database_outage_is_ridden_out(private_pg: PrivatePostgres,
                                               pg_env: dict[str, str], tmp_path: Path) -> None:
    url = pg_env["ONCE_DATABASE_URL"]
    stale = 12.0  # renewals every 4 s; the outage below lasts 4.5 s plus the restart
    # An outage is ridden out when it ends before the deadline less --kill-after (the
    # SIGTERM, 11 s after the claim): a short grace leaves a loaded machine's server the
    # seconds its restart takes.
    owner = start_once("run", "--job", "outage", *DAY, "--stale-after", f"{stale:g}s",
                       "--kill-after", "1s", "--",
                       "sh", "-c", WAITER, env=pg_env)
    wait_for(lambda: (tmp_path / "started").exists(), what="the child")
    private_pg.stop()
    time.sleep(4.5)  # longer than a renewal interval: at least one renewal fails
    private_pg.start()
    back = private_pg.now()
    # Renewals resume on a fresh connection.
    wait_for(lambda: epoch(scalar(url, "SELECT heartbeat_at FROM once_runs")) > back,
             timeout=stale, what="a renewal after the restart")
    assert owner.poll() is None
    (tmp_path / "release").touch()
    status, _, err = finished(owner)
    assert status == 0, err
    assert query(url, "SELECT status, attempt, exit_code FROM once_runs") == [("done", 1, 0)]


def test_a_long_database_outage_makes_the_owner_step_down(private_pg: PrivatePostgres,
                                                          pg_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    url = pg_env["ONCE_DATABASE_URL"]
    stale = 3.0
    args = ["run", "--job", "outage", *DAY, "--stale-after", f"{stale:g}s", "--"]
    owner = start_once(*args, "sh", "-c", SLEEPER, env=pg_env)
    shell, sleeper = child_pids(tmp_path)
    private_pg.stop()
    stopped = time.monotonic()
    status, _, err = finished(owner, timeout=30)
    took = time.monotonic() - stopped
    assert status == 70
    line = once_lines(err)[0]
    assert "fenced out" in line and "unreachable" in line
    assert took < stale + 3, took  # by the deadline: the last renewal sent + --stale-after
    # The child is gone while the database is still down: nobody could have taken over yet.
    assert (tmp_path / "got-signal").exists()
    assert not alive(shell) and not alive(sleeper)
    signalled = (tmp_path / "got-signal").stat().st_mtime
    private_pg.start()
    (running, attempt, beat), = query(url, "SELECT status, attempt, heartbeat_at FROM once_runs")
    assert (running, attempt) == ("running", 1)  # nothing was written
    # The SIGTERM left when the row could first be taken over by the database's clock
    # (a little slack for the child's trap to run on a loaded machine).
    assert signalled < epoch(beat) + stale + 0.5, (signalled - epoch(beat))
    time.sleep(max(0.0, epoch(beat) + stale + 0.5 - private_pg.now()))
    late = run_once(*args, "sh", "-c", 'echo "$ONCE_ATTEMPT" > "$DIR/late"', env=pg_env)
    assert late.returncode == 0, late.stderr
    assert (tmp_path / "late").read_text().split() == ["2"]


@pytest.mark.slow
def test_a_result_that_cannot_be_written_exits_75(private_pg: PrivatePostgres,
                                                  pg_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    url = pg_env["ONCE_DATABASE_URL"]
    stale = 3.0
    owner = start_once("run", "--job", "outage", *DAY, "--stale-after", f"{stale:g}s", "--",
                       "sh", "-c", WAITER, env=pg_env)
    wait_for(lambda: (tmp_path / "started").exists(), what="the child")
    private_pg.stop()
    stopped = time.monotonic()
    try:
        (tmp_path / "release").touch()  # the child succeeds, but its result has nowhere to go
        # The fenced write is retried past the deadline, for finish_grace (30 s at least).
        status, _, err = finished(owner, timeout=FINISH_GRACE + 60)
        took = time.monotonic() - stopped
    finally:
        private_pg.start()
    assert status == 75
    assert "not recorded" in once_lines(err)[0]
    assert took < stale + FINISH_GRACE + 10, took
    assert query(url, "SELECT status, attempt FROM once_runs") == [("running", 1)]


def test_a_hung_database_makes_the_owner_step_down(private_pg: PrivatePostgres,
                                                   pg_env: dict[str, str],
                                                   tmp_path: Path) -> None:
    # A server that stops answering (frozen, or cut off) rather than refusing: a renewal
    # blocks in the driver. The owner still steps down by its deadline and exits.
    stale = 3.0
    owner = start_once("run", "--job", "hung", *DAY, "--stale-after", f"{stale:g}s", "--",
                       "sh", "-c", SLEEPER, env=pg_env)
    shell, sleeper = child_pids(tmp_path)
    with private_pg.frozen():
        stopped = time.monotonic()
        status, _, err = finished(owner, timeout=30)
        took = time.monotonic() - stopped
    assert status == 70, err
    line = once_lines(err)[0]
    assert "fenced out" in line and "no answer" in line, line
    assert took < stale + 3, took
    assert not alive(shell) and not alive(sleeper)


@pytest.mark.slow
def test_a_database_that_hangs_during_the_final_write_exits_75(private_pg: PrivatePostgres,
                                                               pg_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    url = pg_env["ONCE_DATABASE_URL"]
    stale = 3.0
    owner = start_once("run", "--job", "hung", *DAY, "--stale-after", f"{stale:g}s", "--",
                       "sh", "-c", WAITER, env=pg_env)
    wait_for(lambda: (tmp_path / "started").exists(), what="the child")
    with private_pg.frozen():
        stopped = time.monotonic()
        (tmp_path / "release").touch()
        status, _, err = finished(owner, timeout=FINISH_GRACE + 60)
        took = time.monotonic() - stopped
    assert status == 75, err
    assert "not recorded" in once_lines(err)[0]
    # The deadline, the finish's retries past it, a last short wait, and a margin.
    assert took < stale + FINISH_GRACE + 1 + 10, took
    # Never a wrong status: the row still runs (or the write the server finally read is right).
    assert query(url, "SELECT status, attempt FROM once_runs") in ([("running", 1)],
                                                                   [("done", 1)])

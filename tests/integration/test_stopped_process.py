"""A process stopped (SIGSTOP, a suspended VM) inside its work with the ledger holds no lock
for long.

Right after its renewal's statement it holds none: a renewal is one statement, committed by
the server as it ends (Ledger._single). When the COMMIT was sent apart, a process stopped
between the two kept SQLite's write lock (every other writer of the ledger waited, then
exited 75) or, on MySQL/MariaDB, the row's lock (no host could take the period over until it
was continued or the server dropped its session).

Inside a transaction of several statements (MySQL/MariaDB's claim, a lease's acquire) it
holds its locks until the server ends its session, IDLE_TRANSACTION seconds after its last
statement (MariaDB's idle_transaction_timeout, PostgreSQL's
idle_in_transaction_session_timeout): before, every claim of the job exited 75, or no
candidate could lead, for as long as it stayed stopped.

Stopped at the claim's commit or before the result's write, then sent SIGTERM and continued,
a single `once run` holds the signal back until the ledger has it (once.run.stops.held_back),
within its grace.

Real processes on every backend: an owner that claims through once.claim (leads through
once.lead, runs `once run`'s command line) and stops itself the moment its driver has run a
given statement, and real `once run` and `once lead` beside it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import ONCE, wait_for
from ledger_sql import lock_run_rows, query
from procs import stat

pytestmark = pytest.mark.tables_made  # none is about a first use

# The owner: once.claim with a 2 s promise (a renewal every 2/3 s); its connection wrapped so
# that the process stops itself once the driver has run the first statement that begins
# with one of argv[3]'s (`|` between them), once.
OWNER = r"""
import os, signal, sys, time

import once
from once.ledger import parse_url
from once.ledger.dialects import of

url = sys.argv[1]
cls = of(parse_url(url)).ledger_class()
opened = cls._open


STOPS = tuple(sys.argv[3].lstrip("<").split("|"))
BEFORE = sys.argv[3].startswith("<")  # stops before the statement is sent, not after


stopped = []  # at the first statement named alone


def stops_at(sql, before):
    if before == BEFORE and not stopped and " ".join(str(sql).split()).startswith(STOPS):
        stopped.append(sql)
        os.kill(os.getpid(), signal.SIGSTOP)


class Stops:
    def __init__(self, inner):
        self.__dict__["inner"] = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def _around(self, sql, send):
        stops_at(sql, True)
        result = send()
        stops_at(sql, False)
        return result

    def execute(self, sql, *args, **kwargs):
        return self._around(sql, lambda: self.inner.execute(sql, *args, **kwargs))

    def commit(self):  # MySQL/MariaDB's, as "COMMIT" (SQLite and PostgreSQL send statements)
        return self._around("COMMIT", self.inner.commit)

    def cursor(self, *args, **kwargs):
        outer = self

        class Cursor:
            def __init__(self, inner):
                self.__dict__["inner"] = inner

            def __getattr__(self, name):
                return getattr(self.inner, name)

            def execute(self, sql, *a, **k):
                return outer._around(sql, lambda: self.inner.execute(sql, *a, **k))

        return Cursor(self.inner.cursor(*args, **kwargs))


cls._open = lambda self: Stops(opened(self))
if sys.argv[2] == "claim":
    with once.claim("held", every="hour", db=url, stale_after=2) as run:
        assert run.won
        time.sleep(120)
elif sys.argv[2] == "run":  # the command line, in this process
    from once.cli import main

    sys.argv = ["once", "run", "--db", url, *sys.argv[4:]]
    main()
else:
    with once.lead("beat", db=url, lease=3):
        time.sleep(120)
"""


def _stopped(pid: int) -> bool:
    fields = stat(pid)
    return fields is not None and fields[0] == "T"


RENEWALS = "UPDATE once_runs SET heartbeat_at|UPDATE once_leases SET renewed_at"


@contextmanager
def stopped_at(kind: str, ledger_url: str, env: dict[str, str], tmp_path: Path,
               statements: str = RENEWALS, *args: str) -> Iterator[subprocess.Popen[str]]:
    """OWNER as `kind` (claim, lead, run: `once run` with args), until it has stopped itself
    after the first of `statements` (by default its first renewal; before it when they begin
    with `<`); SIGKILLed at the end (which ends a stopped process too)."""
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(script), ledger_url, kind, statements,
                              *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _stopped(owner.pid) or owner.poll() is not None, timeout=60,
                 what=f"the owner stopped at {statements}")
        assert owner.poll() is None, owner.stderr.read() if owner.stderr else ""
        yield owner
    finally:
        owner.kill()
        owner.wait(timeout=30)


def _run(env: dict[str, str], job: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ONCE, "run", "--job", job, "--every", "hour", *extra, "--", "true"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_a_process_stopped_after_its_renewal_holds_no_lock(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    with stopped_at("claim", ledger_url, once_env, tmp_path):
        _run(once_env, "other")  # another job's claim and finish: SQLite's write lock is free
        if ledger_url.startswith("sqlite"):
            return  # a live owner keeps its claim by its OS lock, stopped or not (by design)
        # Its own row, once stale, is taken over: no row lock is held.
        (stale,) = query(ledger_url, "SELECT stale_after FROM once_runs WHERE job = 'held'")[0]
        assert float(stale) == 2.0
        wait_for(lambda: "took over as attempt 2" in _run(once_env, "held", "--stale-after",
                                                            "2s").stderr,
                 timeout=60, what="the stopped owner's row taken over")  # skips while fresh
        assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                                 "WHERE job = 'held'") == [("done", 2)]


def test_a_leader_stopped_after_its_renewal_holds_no_lock(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """The lease's renewal: a candidate leads once the stopped leader's lease has run out
    (SQLite: the ledger's write lock is free; the lead name's OS lock stays with the live
    leader's process, stopped or not, by design: docs/concepts/leases.md, "on SQLite, also")."""
    with stopped_at("lead", ledger_url, once_env, tmp_path):
        if ledger_url.startswith("sqlite"):
            _run(once_env, "other")
            return
        led = subprocess.run([ONCE, "lead", "--name", "beat", "--lease", "3s", "--", "sh",
                              "-c", "echo $ONCE_TERM"], env=once_env, capture_output=True,
                             text=True, timeout=120)
        assert led.returncode == 0, led.stderr
        assert led.stdout.strip() == "2", led.stdout


def test_a_claimer_stopped_inside_its_claim_holds_the_job_for_moments(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """MySQL/MariaDB's claim is a transaction of several statements: one stopped after it
    wrote the job's row holds that row's lock until the server ends its session (MariaDB:
    IDLE_TRANSACTION seconds idle in the transaction), then it is rolled back and the next claim of
    the job wins the period. PostgreSQL's claim is one statement; SQLite's holds the file's
    write lock (docs/concepts/liveness.md says so)."""
    if not ledger_url.startswith(("mysql", "mariadb")):
        return
    with stopped_at("claim", ledger_url, once_env, tmp_path, "INSERT INTO once_runs"):
        _run(once_env, "held")  # exit 0: it won the period, and its command ran
    assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                             "WHERE job = 'held'") == [("done", 1)]


# A claim with one of these flags is a transaction of several statements on every server:
# stopped after the statement named (MySQL/MariaDB's | PostgreSQL's), it holds the job's row.
CHECKED_CLAIMS = [
    # The job row locked by a read (SELECT ... FOR UPDATE): no write, to MariaDB's counting.
    ("--require-same-command", "SELECT fence FROM once_jobs|SELECT 1 FROM once_jobs"),
    # After the claim's own write, the look for another period's live attempt.
    ("--no-overlap", "SELECT period, owner, attempt, fence"),
]


@pytest.mark.parametrize(("flag", "statements"), CHECKED_CLAIMS, ids=["require-same", "no-overlap"])
def test_a_claimer_stopped_inside_a_checked_claim_holds_the_job_for_moments(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path, flag: str,
        statements: str) -> None:
    """The claims' connections bound every idle transaction (MariaDB's
    idle_transaction_timeout: its write-only bound misses a locking read; PostgreSQL's
    SET LOCAL idle_in_transaction_session_timeout in the claim's transaction). SQLite: the
    file's write lock stays with the stopped process (docs/concepts/liveness.md)."""
    if ledger_url.startswith("sqlite"):
        return
    _run(once_env, "held", "--lag", "1")  # the job's row exists (PostgreSQL locks no gap)
    with stopped_at("run", ledger_url, once_env, tmp_path, statements,
                    "--job", "held", "--every", "hour", flag, "--", "true"):
        _run(once_env, "held", flag)
    assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                             "WHERE job = 'held'") == [("done", 1), ("done", 1)]


def test_a_candidate_stopped_inside_its_acquire_holds_the_lease_for_moments(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """A lease's acquire is a transaction of several statements: a candidate stopped after its
    UPDATE took the row holds the row's lock until the server ends its session, IDLE_TRANSACTION
    seconds idle in the transaction (PostgreSQL, MariaDB), which rolls its term back: another
    candidate leads, in the first term. SQLite: the stopped process keeps the name's OS lock
    and the file's write lock (docs/concepts/leases.md)."""
    if ledger_url.startswith("sqlite"):
        return
    with stopped_at("lead", ledger_url, once_env, tmp_path, "UPDATE once_leases SET holder"):
        led = subprocess.run([ONCE, "lead", "--name", "beat", "--lease", "3s", "--", "sh",
                              "-c", "echo $ONCE_TERM"], env=once_env, capture_output=True,
                             text=True, timeout=120)
    assert led.returncode == 0, led.stderr
    assert led.stdout.strip() == "1", led.stdout


def _terminated(owner: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM to the stopped owner, then SIGCONT: its status and what it said."""
    owner.send_signal(signal.SIGTERM)
    owner.send_signal(signal.SIGCONT)
    _, err = owner.communicate(timeout=60)
    return owner.returncode, err


FINISHES = "<WITH fin AS|UPDATE once_runs SET status"  # before the result's write


def test_a_stop_signal_while_the_result_is_written_loses_no_result(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM to a single `once run` as it is about to write its command's result: the
    result is written, then once dies of the signal. It was lost: the row stayed running, to
    be taken over after --stale-after and the done period run again."""
    with stopped_at("run", ledger_url, once_env, tmp_path, FINISHES, "--job", "held",
                    "--every", "hour", "--on-success", "echo hook", "--", "true") as owner:
        status, err = _terminated(owner)
    assert status == -signal.SIGTERM, err
    assert "hook" not in err  # dead before its hooks, as the signal would have left it
    assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                             "WHERE job = 'held'") == [("done", 1)]


def test_a_stop_signal_as_the_claim_commits_starts_no_command_and_records_it(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM to a single `once run` right after its claim committed: no command starts,
    the attempt is recorded interrupted (not counted against --max-attempts), as in a
    catch-up, and once dies of the signal. It was left running, holding the period for
    --stale-after."""
    with stopped_at("run", ledger_url, once_env, tmp_path, "WITH clock AS|COMMIT", "--job",
                    "held", "--every", "hour", "--", "sh", "-c", "echo ran") as owner:
        status, err = _terminated(owner)
    assert status == -signal.SIGTERM, err
    assert "SIGTERM received before its command started, which was not started" in err
    assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                             "WHERE job = 'held'") == [("failed", 1)]


@contextmanager
def _row_locked(ledger_url: str) -> Iterator[None]:
    """Another session holds the run rows' locks (SQLite: the file's write lock)."""
    conn = lock_run_rows(ledger_url)
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def test_a_stop_signal_held_back_by_a_write_that_hangs_ends_once_within_its_grace(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM right after the claim committed, and the write of the interrupted attempt
    cannot land (another session holds the row; SQLite: the file): once ends promptly, STOP_GRACE
    (5 s) later at most, saying so (or sooner, dead of the signal, where the server gave up on
    the write first), where it retried the write for minutes. The row is left as the signal
    left it before it was held back."""
    with stopped_at("run", ledger_url, once_env, tmp_path, "WITH clock AS|COMMIT", "--job",
                    "held", "--every", "hour", "--stale-after", "10m", "--", "true") as owner, \
            _row_locked(ledger_url):
        began = time.monotonic()
        status, err = _terminated(owner)
        took = time.monotonic() - began
    assert took < 40.0, took  # the grace, on a loaded machine
    assert status in (143, -signal.SIGTERM), err
    if status == 143:
        assert "stopped by SIGTERM while the ledger was being written" in err
    # Running, or failed (interrupted) where the server kept the write waiting on the lock
    # and carried it out once the lock went, the client gone: never done, no command run.
    assert query(ledger_url, "SELECT status FROM once_runs WHERE job = 'held'") in (
        [("running",)], [("failed",)]), (status, took, err)

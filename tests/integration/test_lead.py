"""`once lead` on every backend: one child at a time, whatever happens to its leader.

Real `once lead` processes, real signals, real databases. The verdict on overlap comes from
the children's own log (tests/lead_log.py), never from once's word: each child writes a line
every 100 ms, and no two children's spans may overlap. Leases are 3 s (the least once takes);
bounds are generous for a loaded two-core machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import ONCE, run_here, wait_for
from lead_log import child, judge, leading_children, spans, stop_leads
from ledger_sql import query
from procs import alive, children

pytestmark = pytest.mark.tables_made  # none is about a first use

LEASE = 3.0
NAME = "scheduler"
# How soon a candidate's child writes after a leader's end, on a loaded machine: the lease
# and a second or so when idle (`make bench` times that gap: the lead rows); .ci/run's four
# sessions at load 15 took 7.2 s after a release (3.0 s more than the lease was passed).
TAKEOVER = LEASE + 10.0


def start_lead(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([ONCE, "lead", "--name", NAME, "--lease", f"{LEASE:g}s", *extra,
                             "--", *child(log)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def leader_of(procs: list[subprocess.Popen[str]], log: Path,
              since: float = 0.0) -> tuple[subprocess.Popen[str], int, int]:
    """The `once lead` whose child is writing now: (its process, its guard, the child)."""
    def found() -> tuple[subprocess.Popen[str], int, int] | None:
        writing = leading_children(log, since)
        for proc in procs:
            if proc.poll() is not None:
                continue
            for guard in children(proc.pid):
                for kid in children(guard):
                    if any(pid == kid for _, pid in writing):
                        return proc, guard, kid
        return None

    return wait_for(found, timeout=30, what="a leader's child writing")  # type: ignore[no-any-return]


def term_of(log: Path, pid: int) -> int:
    return next(s.term for s in spans(log) if s.pid == pid)


def dead_by(pid: int, deadline: float) -> None:
    """The process is gone by `deadline` (CLOCK_MONOTONIC), with a little slack for the kill
    to be delivered and seen."""
    wait_for(lambda: not alive(pid), timeout=max(0.1, deadline + 1.0 - time.monotonic()),
             what=f"pid {pid} dead by its lease's deadline")


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc, said in zip(procs, stop_leads(procs, timeout=30), strict=True):
        # What each said, for a failure's report (pytest shows a failed test's output).
        print(f"once lead {proc.pid} exited {proc.returncode}:\n{said}")


@pytest.mark.slow
def test_one_child_at_a_time_through_kills_pauses_and_signals(
        once_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "children.log"
    procs = [start_lead(once_env, log) for _ in range(3)]
    try:
        # Three candidates at once: one child runs.
        leader, guard, kid = leader_of(procs, log)
        time.sleep(1.0)
        assert len(leading_children(log, time.monotonic() - 0.5)) == 1

        # The leader's `once lead` killed: its child dies with it (the guard), and a candidate
        # leads within the lease and a second or so.
        killed_at = time.monotonic()
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        dead_by(kid, killed_at + 0.5)
        leader, guard, kid = leader_of(procs, log, since=killed_at)
        first = min(s.first for s in spans(log) if s.pid == kid)
        assert first - killed_at < TAKEOVER

        # Its guard killed: the child dies with the guard, once lead releases and exits 137.
        killed_at = time.monotonic()
        os.kill(guard, signal.SIGKILL)
        dead_by(kid, killed_at + 0.5)
        assert leader.wait(timeout=30) == 137, leader.stderr
        said = leader.stderr.read()
        assert "released term" in said, said  # not left to run out
        assert "guard process was killed by signal 9" in said, said  # as once run says
        leader, guard, kid = leader_of(procs, log, since=killed_at)
        first = min(s.first for s in spans(log) if s.pid == kid)
        assert first - killed_at < TAKEOVER  # released: the gap itself is bench's (TAKEOVER)
        procs.append(start_lead(once_env, log, "--rejoin"))

        # Stopped past its lease: the guard stops the child by the deadline; woken, the old
        # leader steps down (exit 70) and never starts its child again.
        stopped_at = time.monotonic()
        os.kill(leader.pid, signal.SIGSTOP)
        dead_by(kid, stopped_at + LEASE)
        new_leader, _, _ = leader_of(procs, log, since=stopped_at + LEASE)
        os.kill(leader.pid, signal.SIGCONT)
        assert leader.wait(timeout=30) == 70
        assert "lost the lease" in leader.stderr.read()
        time.sleep(0.5)
        old = term_of(log, kid)
        assert not [s for s in spans(log) if s.term == old and s.pid != kid]

        # SIGTERM: forwarded; the child ends, the lease is released at once.
        procs.append(start_lead(once_env, log))
        time.sleep(1.0)  # standing
        termed_at = time.monotonic()
        new_leader.terminate()
        status = new_leader.wait(timeout=30)
        said = new_leader.stderr.read() if new_leader.stderr else ""
        assert status == 128 + signal.SIGTERM, said
        assert "released term" in said, said  # at once, not left to run out
        _, _, last_kid = leader_of(procs, log, since=termed_at + 0.2)
        first = min(s.first for s in spans(log) if s.pid == last_kid)
        assert first - termed_at < TAKEOVER  # as above
    finally:
        stop_all(procs)
    found = judge(log)
    assert len(found) >= 5


def test_the_lease_is_released_when_the_command_ends(once_env: dict[str, str],
                                                    tmp_path: Path) -> None:
    first = subprocess.run([ONCE, "lead", "--name", NAME, "--", "sh", "-c",
                            'echo "$ONCE_LEAD $ONCE_TERM"; exit 3'], env=once_env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 3, first.stderr
    assert first.stdout.split() == [NAME, "1"]
    second = subprocess.run([ONCE, "lead", "--name", NAME, "--", "sh", "-c",
                             'echo "$ONCE_TERM"; kill -TERM $$'], env=once_env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 128 + signal.SIGTERM
    assert int(second.stdout) == 2
    status = run_here("lead", "--name", NAME, "--retire", env=once_env)
    assert status.returncode == 0, status.stderr
    # A retired name used again goes on from its history: never a term it has had.
    third = subprocess.run([ONCE, "lead", "--name", NAME, "--", "sh", "-c", "echo $ONCE_TERM"],
                           env=once_env, capture_output=True, text=True, timeout=60)
    assert third.returncode == 0 and int(third.stdout) == 3, third.stderr


def test_a_candidate_stopped_by_a_signal_exits_0(once_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    log, said = tmp_path / "children.log", tmp_path / "candidate.err"
    leader = start_lead(once_env, log)
    candidate = None
    try:
        leader_of([leader], log)
        with open(said, "w") as err:
            candidate = subprocess.Popen(
                [ONCE, "lead", "--name", NAME, "--lease", f"{LEASE:g}s", "--", *child(log)],
                env=once_env, stderr=err, text=True)
        wait_for(lambda: "candidate;" in said.read_text(), timeout=30,
                 what="the candidate's line")
        assert "leads (term 1)" in said.read_text()
        candidate.terminate()
        assert candidate.wait(timeout=30) == 0
        assert "stopped while a candidate" in said.read_text()
        assert leader.poll() is None
    finally:
        stop_all([p for p in (leader, candidate) if p is not None])


@pytest.mark.parametrize(("args", "words"), [
    (["--lease", "2s"], "--lease 2s: use 3s to 365d (1 year;"),
    (["--lease", "366d"], "--lease 31622400s: use 3s to 365d (1 year;"),  # the docs' limit
    (["--lease", "6s", "--kill-after", "3s"], "does not fit --lease 6s"),
    (["--lease", "60s", "--kill-after", "30s"], "at most a third of the lease (20s)"),
    (["--retire", "--", "true"], "--retire takes no COMMAND"),
    ([], "no command given"),
])
def test_settings_that_cannot_keep_the_promise_are_refused(
        once_env: dict[str, str], args: list[str], words: str) -> None:
    command = ["--", "true"] if args and "--retire" not in args else []
    result = run_here("lead", "--name", NAME, *args, *command, env=once_env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr


API_LEADER = """
import sys, time, once
with once.lead("scheduler", db=sys.argv[1], lease=3) as leader:
    print(leader.term, flush=True)
    while not leader.lost.wait(0.1):
        pass
    print("lost", flush=True)
"""


def test_the_python_api_leads_one_process_and_sets_lost(ledger_url: str,
                                                        tmp_path: Path) -> None:
    import sys

    first = subprocess.Popen([sys.executable, "-c", API_LEADER, ledger_url],
                             stdout=subprocess.PIPE, text=True)
    second = None
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "1"
        second = subprocess.Popen([sys.executable, "-c", API_LEADER, ledger_url],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(1.5)  # it stands as a candidate meanwhile
        assert second.poll() is None
        # Another holder takes the lease (as after an expiry; on SQLite the leader's OS
        # lock keeps every other acquire out, so it is written by hand): the leader's next
        # renewal finds it gone, and `lost` is set well within the lease.
        stolen = time.monotonic()
        _steal(ledger_url)
        assert first.stdout.readline().strip() == "lost"
        assert time.monotonic() - stolen < 3.0 + 2.0
        assert first.wait(timeout=30) == 0
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()


def _steal(ledger_url: str) -> None:
    from once.ledger import open_ledger, parse_url

    with open_ledger(parse_url(ledger_url)) as ledger:
        ledger.connect()
        ledger._write("UPDATE once_leases SET holder = 'thief', term = term + 1", {})


def test_a_command_that_cannot_start_is_said_in_one_line(once_env: dict[str, str]) -> None:
    done = subprocess.run([ONCE, "lead", "--name", NAME, "-q", "--", "/nonexistent/cmd"],
                          env=once_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 127
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "could not start (No such file or directory)" in lines[0], lines
    # The term was released: the next leader comes at once.
    again = subprocess.run([ONCE, "lead", "--name", NAME, "--", "sh", "-c", "echo $ONCE_TERM"],
                           env=once_env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == "2"


API_FAILING = """
import sys, once
try:
    with once.lead("scheduler", db=sys.argv[1], lease=3) as leader:
        raise RuntimeError("boom")
except RuntimeError:
    pass
with once.lead("scheduler", db=sys.argv[1], lease=3) as leader:
    print(leader.term)
"""


def test_the_python_api_releases_when_the_block_raises(ledger_url: str) -> None:
    import sys

    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", API_FAILING, ledger_url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert time.monotonic() - began < LEASE + 5.0  # not waiting the first lease out


# The first acquire commits, and its caller is told it failed: the answer lost (a connection
# cut, a read that timed out while a Galera cluster settled).
API_UNANSWERED = """
import sys, once
from once.ledger.leases import Leases
from once.ledger.records import LedgerError

real, calls = Leases.acquire, []


def acquire(self, *args, **kwargs):
    calls.append(real(self, *args, **kwargs))
    if len(calls) == 1:
        raise LedgerError("lost connection to the server during the query")
    return calls[-1]


Leases.acquire = acquire
with once.lead("scheduler", db=sys.argv[1], lease=30) as leader:
    print(calls[0][0], leader.term)
"""


def test_a_term_won_by_an_acquire_whose_answer_was_lost_is_not_waited_out(
        ledger_url: str) -> None:
    """The candidate finds the lease held under its own holder id: it releases that term
    (nothing ran under it) and leads at once, where it waited the whole lease (30 s) for
    it to run out."""
    began = time.monotonic()
    assert _script(API_UNANSWERED, ledger_url) == "1 2"
    assert time.monotonic() - began < 20.0  # the lease is 30 s
    assert query(ledger_url, "SELECT term, ended FROM once_lead_terms ORDER BY term") == [
        (1, "released"), (2, "released")]


# An Elector on the real ledger (once.api's way): argv[2] says what to do.
ELECTOR = """
import sys
from once.ledger import open_ledger, parse_url
from once.ledger.leases import Leases
from once.ledger.records import LedgerError
from once.run import lead

ledger = open_ledger(parse_url(sys.argv[1]), timeout=2)
elector = lead.Elector(ledger, "scheduler", 3, "me", lead.Voice("scheduler", "me", -1))
if sys.argv[2] == "led-unreleased":  # a term led and never released (its release failed)
    term, _ = elector.campaign()
    elector.leases.hand_over()  # SQLite: the name's OS lock goes, as with a dead guard
    print(term, elector.campaign()[0])  # the second waits for the first to run out
else:  # stopped right after an acquire that committed, its answer lost
    real = Leases.acquire

    def acquire(self, *args, **kwargs):
        real(self, *args, **kwargs)
        elector.stop.set()
        raise LedgerError("lost connection to the server during the query")

    Leases.acquire = acquire
    print(elector.campaign())
    elector.withdraw()
"""


def _script(script: str, *args: str) -> str:
    """A Python script run to its end, exit 0: what it printed."""
    import sys

    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _elector(ledger_url: str, what: str) -> str:
    return _script(ELECTOR, ledger_url, what)


def test_a_term_the_candidate_led_is_no_unanswered_acquire(ledger_url: str) -> None:
    """A term this candidate led, left held (its release failed: `--rejoin` after an
    outage), is not released as one an unanswered acquire won: it runs out and the next
    acquire ends it `expired`, as it really ended."""
    assert _elector(ledger_url, "led-unreleased") == "1 2"
    assert query(ledger_url, "SELECT term, ended FROM once_lead_terms ORDER BY term") == [
        (1, "expired"), (2, None)]


def test_a_candidate_stopped_after_an_unanswered_acquire_releases_its_term(
        ledger_url: str) -> None:
    """Stopped (SIGTERM) right after an acquire that committed though it raised, the
    candidate's withdrawal releases the term: the next candidate does not wait a lease."""
    assert _elector(ledger_url, "stopped") == "None"
    assert query(ledger_url, "SELECT term, ended FROM once_lead_terms") == [(1, "released")]
    assert query(ledger_url, "SELECT holder FROM once_leases") == [(None,)]


def test_a_dropped_connection_does_not_end_the_term(backend: object, ledger_url: str,
                                                    once_env: dict[str, str],
                                                    tmp_path: Path) -> None:
    from silent_relay import tcp_upstream

    if not ledger_url.startswith("postgresql") or ":6432" in ledger_url \
            or tcp_upstream(ledger_url) is None:
        pytest.skip("PostgreSQL over TCP: the server ends the leader's session, found by port")
    import psycopg

    from once.ledger import parse_url

    log = tmp_path / "children.log"
    leader = start_lead(once_env, log, "--lease", "6s")
    try:
        _, _, kid = leader_of([leader], log)
        conninfo = parse_url(ledger_url).connect_args["conninfo"]
        ports = _local_ports(leader.pid)
        assert ports, "the leader holds a connection"
        with psycopg.connect(conninfo, autocommit=True) as admin:
            ended = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE client_port = ANY(%s)", (list(ports),)).fetchall()
        assert ended
        time.sleep(8.0)  # past the lease: renewals on a fresh connection kept it
        assert leader.poll() is None, leader.stderr
        assert alive(kid)
    finally:
        stop_all([leader])


def _local_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets (its connections to the server)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_a_stderr_that_cannot_be_written_changes_nothing(once_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    with open("/dev/full", "w") as full:
        done = subprocess.run([ONCE, "lead", "--name", NAME, "--", "sh", "-c",
                               f'touch "{ran}"; exit 4'], env=once_env, stderr=full,
                              timeout=60)
    assert done.returncode == 4 and ran.exists()
    again = subprocess.run([ONCE, "lead", "--name", NAME, "--", "sh", "-c", "echo $ONCE_TERM"],
                           env=once_env, capture_output=True, text=True, timeout=30)
    assert again.stdout.strip() == "2", again.stderr  # the first term was released


def test_a_lease_past_its_expiry_that_nobody_took_is_renewed(ledger_url: str) -> None:
    # On SQLite the host's clock stepped forward puts every lease past its expiry: the
    # leader's renewal (holder and term) must still hold it; a takeover must end it.
    from once.ledger import open_ledger, parse_url
    from once.ledger.leases import Leases

    with open_ledger(parse_url(ledger_url)) as ledger:
        leases = Leases(ledger)
        won = leases.acquire("step", "me", "me", 0.5)
        assert won is not None
        leases.hand_over()  # (SQLite) as a leader's guard would take it
        time.sleep(1.0)
        assert leases.renew("step", "me", won[0], 0.5)
        time.sleep(1.0)
        other = Leases(ledger).acquire("step", "other", "other", 60)
        assert other is not None and other[0] == won[0] + 1
        assert not leases.renew("step", "me", won[0], 0.5)


API_FORKING = """
import os, sys, time, once
with once.lead("scheduler", db=sys.argv[1], lease=3) as leader:
    pid = os.fork()
    if pid == 0:
        pass  # the child leaves the block: it must not release the parent's lease
    else:
        os.waitpid(pid, 0)
        print(leader.term, flush=True)
        time.sleep(4)
        leader.check()
        print("still", flush=True)
if pid == 0:
    os._exit(0)
"""


def test_a_child_forked_in_the_python_api_s_block_releases_nothing(ledger_url: str) -> None:
    import sys

    done = subprocess.run([sys.executable, "-c", API_FORKING, ledger_url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "still"]


@pytest.mark.parametrize(("args", "says"), [
    ("lease=float('nan')", "bad lease nan: use 3 to 31536000 seconds"),
    ("lease=-5", "bad lease -5: use 3 to 31536000 seconds"),
    ("lease=31536001", "lease 31536001s: use 3s to 365d"),
    ("stop_within=-1", "bad stop_within -1"), ("stop_within=float('nan')", "bad stop_within nan"),
])
def test_the_python_api_refuses_what_the_command_line_refuses(ledger_url: str, args: str,
                                                               says: str) -> None:
    import once  # noqa: F401  (the expression names it)

    with pytest.raises(ValueError, match=says), \
            eval(f"once.lead('x', db={ledger_url!r}, {args})"):
        pass


def test_a_lead_nested_in_itself_is_refused(ledger_url: str) -> None:
    import once

    with once.lead("nest", db=ledger_url, lease=3), \
            pytest.raises(ValueError, match="inside"), once.lead("nest", db=ledger_url, lease=3):
        pass


def test_a_bad_lead_name_is_refused_as_a_lead_name(once_env: dict[str, str]) -> None:
    for command in (["lead", "--name", "a\x1bb", "--", "true"], ["history", "--lead", "a b"]):
        result = run_here(*command, env=once_env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("once: bad lead name "), result.stderr

"""`once lead`'s rows of `make bench` (`BENCH_ONLY=lead` runs them alone):

- the failover gap: from the leader's `once lead` killed (SIGKILL) to the next leader's child
  running (goal: within the lease + 1 s), and from a SIGTERM to the leader to the next child
  running, the child's own stop time included (goal: within 1 s + that stop time, here ~0);
- a waiting candidate's cost: CPU per candidate and the server's transactions a second per
  candidate, with BENCH_LEAD_CANDIDATES (default 100) of one name waiting (PostgreSQL:
  pg_stat_database's commits);
- the leader's memory while its command runs: PSS of `once lead` and its guard, beside
  `once run`'s row (bench.wrapper_memory).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ONCE = str(Path(sys.executable).with_name("once"))
LEASE = 3.0
CANDIDATES = int(os.environ.get("BENCH_LEAD_CANDIDATES", "100"))
# A child that says when it started (CLOCK_MONOTONIC) in a file of its term, then waits.
CHILD = ("import os, sys, time; open(os.path.join(sys.argv[1], os.environ['ONCE_TERM']), "
         "'w').write(repr(time.monotonic())); time.sleep(3600)")


def _lead(env: dict[str, str], name: str, marks: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([ONCE, "lead", "--name", name, "--lease", f"{LEASE:g}s", "--",
                             sys.executable, "-c", CHILD, str(marks)], env=env,
                            stderr=None if os.environ.get("BENCH_VERBOSE") else subprocess.DEVNULL)


def _started(marks: Path, term: int, timeout: float = 60) -> float:
    path = marks / str(term)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return float(path.read_text())
        time.sleep(0.005)
    raise RuntimeError(f"term {term} did not start within {timeout}s")


def _leader(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """The `once lead` with a guard (the one that leads)."""
    for proc in procs:
        if proc.poll() is None and _children(proc.pid):
            return proc
    raise RuntimeError("no leader")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(c) for c in children.read().split()]
    except OSError:
        return []


def failover_gaps(name: str, url: str, rounds: int = 3) -> None:
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    crash, term_gap = [], []
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp)
        lead_name = f"bench-gap-{time.time_ns()}"
        procs = [_lead(env, lead_name, marks) for _ in range(2 * rounds + 1)]
        try:
            term = 1
            _started(marks, term)
            for turn in range(2 * rounds):
                time.sleep(0.5)
                leader = _leader(procs)
                began = time.monotonic()
                if turn % 2 == 0:
                    leader.kill()
                else:
                    leader.terminate()
                leader.wait()
                term += 1
                (crash if turn % 2 == 0 else term_gap).append(_started(marks, term) - began)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    _row(name, "gap after the leader's crash (SIGKILL)", crash, LEASE + 1.0)
    _row(name, "gap after a SIGTERM to the leader", term_gap, 1.0)


def _row(name: str, what: str, values: list[float], goal: float) -> None:
    worst = max(values)
    verdict = "ok" if worst <= goal else "OVER GOAL"
    shown = ", ".join(f"{v:.2f}" for v in values)
    print(f"{name:<11} lead, {what}: {shown} s (lease {LEASE:g}s; goal <= {goal:g} s)  "
          f"{verdict}")


def candidate_cost(name: str, url: str, count: int = CANDIDATES) -> None:
    """CPU and server transactions a second per waiting candidate. Each candidate keeps one
    connection: on PostgreSQL a hundred need a server with room for them (its default
    max_connections is 100) or PgBouncer in front (ONCE_BENCH_PGBOUNCER_URL)."""
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    stats = _stats(url)  # before the candidates take the server's connections
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp)
        lead_name = f"bench-wait-{time.time_ns()}"
        procs = [_lead(env, lead_name, marks)]
        try:
            _started(marks, 1)
            procs += [_lead(env, lead_name, marks) for _ in range(count)]
            time.sleep(15)  # started, connected, standing
            cpu0, commits0, t0 = _cpu(procs[1:]), stats(), time.monotonic()
            time.sleep(10)
            cpu1, commits1, t1 = _cpu(procs[1:]), stats(), time.monotonic()
            alive = sum(proc.poll() is None for proc in procs[1:])
            gone = [proc for proc in procs[1:] if proc.poll() is not None]
            if gone:
                print(f"  {len(gone)} candidates exited, statuses "
                      f"{sorted({proc.returncode for proc in gone})}", file=sys.stderr)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    seconds = t1 - t0
    cpu = (cpu1 - cpu0) / seconds / count * 100
    rate = "" if commits0 is None or commits1 is None else \
        f", {(commits1 - commits0) / seconds / count:.2f} server commits/s each"
    print(f"{name:<11} lead, a waiting candidate ({count} of one name, {alive} waiting to the "
          f"end): {cpu:.2f}% of a core each{rate}")


def _cpu(procs: list[subprocess.Popen[bytes]]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in procs:
        try:
            with open(f"/proc/{proc.pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _stats(url: str) -> Callable[[], int | None]:
    """A reader of the server's committed transactions (PostgreSQL; None elsewhere), on a
    connection of its own taken now, straight to the server (not through PgBouncer)."""
    if not url.startswith("postgresql"):
        return lambda: None
    import psycopg

    from once.ledger import parse_url

    conninfo = parse_url(os.environ.get("ONCE_BENCH_POSTGRES_URL") or url
                         ).connect_args["conninfo"]
    conn = psycopg.connect(conninfo, autocommit=True)

    def commits() -> int | None:
        row = conn.execute("SELECT sum(xact_commit) FROM pg_stat_database").fetchone()
        return None if row is None else int(row[0])

    return commits


def leader_memory(name: str, url: str) -> None:
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp)
        proc = _lead(env, f"bench-pss-{time.time_ns()}", marks)
        try:
            _started(marks, 1)
            time.sleep(LEASE)  # a renewal or two: the heartbeat thread settled
            leader = _pss(proc.pid)
            guards = sum(_pss(pid) for pid in _children(proc.pid))
        finally:
            proc.terminate()
            proc.wait()
    print(f"{name:<11} lead memory: once lead {leader / 1024:5.1f} MiB + guard "
          f"{guards / 1024:5.1f} MiB = {(leader + guards) / 1024:5.1f} MiB PSS (beside once "
          f"run's row)")


def _pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))


def run(sqlite_url: str, pg_url: str) -> None:
    bouncer = os.environ.get("ONCE_BENCH_PGBOUNCER_URL")
    for name, url in (("sqlite", sqlite_url), ("postgresql", pg_url)):
        failover_gaps(name, url)
        if name == "sqlite" or bouncer:
            candidate_cost(name if name == "sqlite" else "pgbouncer",
                           url if name == "sqlite" else bouncer or url)
        else:  # a hundred connections would not fit a default server beside the others
            candidate_cost(name, url, min(CANDIDATES, 40))
        leader_memory(name, url)

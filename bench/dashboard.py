"""The dashboard row of `make bench` (issue 28): `once serve`'s main page over a fleet.

10,000 jobs x 100 periods (1M rows, seeded as the report rows seed theirs: bench.report_rows)
on SQLite and PostgreSQL; `once serve` started on each, `/` (the first page of 100 jobs,
problems first) fetched DASHBOARD_ROUNDS times, each after the server's shared read has gone
stale (once.serve.reads.FRESH), and `/api/status` beside it: a page of 100 jobs with problems
(what a script polls), and every job in full; and `/metrics`. Printed: the median wall time
of a request and the server's CPU time for it (what the wall time would be on an idle
machine, the database server's share aside). Goals: `/` under 1 s, `/api/status` (every job
in full) at most 1 s. bench.reports times `/metrics` over 100 jobs x 10,000 periods with
served() too.

BENCH_DASHBOARD_JOBS and BENCH_DASHBOARD_PERIODS make the fleet smaller for a quick run;
`BENCH_ONLY=dashboard` runs this row alone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ONCE = str(Path(sys.executable).with_name("once"))
JOBS = int(os.environ.get("BENCH_DASHBOARD_JOBS", "10000"))
PERIODS = int(os.environ.get("BENCH_DASHBOARD_PERIODS", "100"))
ROUNDS = int(os.environ.get("BENCH_DASHBOARD_ROUNDS", "5"))
# The paths timed, each with its goal in seconds (None: none) and whether it must be under
# it (<) or at most it (<=).
PATHS: dict[str, tuple[float | None, str]] = {
    "/": (1.0, "<"), "/api/status?state=problems&limit=100": (None, ""),
    "/api/status": (1.0, "<="), "/metrics": (None, "")}


def run(directory: Path, pg: str) -> None:
    import bench

    jobs, runs = bench.report_rows(datetime.now(UTC), JOBS, PERIODS)
    print(f"dashboard: {len(jobs)} jobs, {len(runs)} rows; once serve, median of {ROUNDS} "
          f"requests")
    sqlite_url = f"sqlite:///{directory / 'dashboard.db'}"
    bench.seed_sqlite(sqlite_url, jobs, runs)
    timed("sqlite", sqlite_url)
    pg_url, drop = bench.pg_schema(pg, "once_bench_dashboard")
    try:
        bench.seed_postgres(pg_url, jobs, runs)
        timed("postgresql", pg_url)
    finally:
        drop()


def timed(name: str, url: str) -> None:
    served(name, url, PATHS)


def served(name: str, url: str, paths: dict[str, tuple[float | None, str]]) -> None:
    """`once serve` on url; each path's median wall time and the server's CPU time for it,
    beside its goal."""
    from once.serve.reads import FRESH

    port = _free_port()
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    server = subprocess.Popen([ONCE, "serve", "--listen", f"127.0.0.1:{port}",
                               "--read-timeout", "60s"], env=env, stderr=subprocess.PIPE)
    try:
        _get(port, "/healthz", wait=True)
        for path, (goal, under) in paths.items():
            _get(port, path)  # the server's lazy imports, the ledger's pages in the cache
            times = []
            for _ in range(ROUNDS):
                time.sleep(FRESH + 0.1)  # the server's shared read gone stale: read anew
                cpu = _cpu(server.pid)
                start = time.perf_counter()
                _get(port, path)
                times.append((time.perf_counter() - start, _cpu(server.pid) - cpu))
            wall, cpu = sorted(times)[len(times) // 2]
            met = wall < goal if under == "<" else wall <= goal if goal is not None else True
            said = (f"(goal {under} {goal:g} s)  {'ok' if met else 'OVER GOAL'}"
                    if goal is not None else "")
            print(f"{name:<11} once serve {path:<37} {wall * 1000:6.0f} ms wall  "
                  f"{cpu * 1000:6.0f} ms cpu  {said}".rstrip())
    finally:
        server.terminate()
        server.wait(30)


def _get(port: int, path: str, wait: bool = False) -> bytes:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as r:
                return bytes(r.read())
        except OSError:
            if not wait or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _cpu(pid: int) -> float:
    """The process's user + system CPU seconds so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

"""The fleet row of `make bench`: N `once run` fired at one instant, as a fleet's crontabs do.

Each process imports `once` first (a fleet's hosts have theirs on disk and warm), then waits on
one shared lock; the bench lets go of it and every process claims the same period at once.
Against PostgreSQL through a login limited to a few connections (what a small max_connections
does to a storm) and, when ONCE_BENCH_PGBOUNCER_URL names one, through PgBouncer. Printed:
exit statuses, how many ran the command (must be 1), and the time from the release to each
process's exit (p50, p99).

BENCH_FLEET sets N (default 100). For 1,000 on a bigger machine: BENCH_FLEET=1000 with a
login limit above what the pooler or server allows per host, and ulimit -n above 4 * N.
"""

from __future__ import annotations

import collections
import fcntl
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

FLEET = int(os.environ.get("BENCH_FLEET", "100"))
CONNECTION_LIMIT = 6

# Imports once, parks on the gate, then fires; atexit records release and exit instants.
LAUNCHER = """
import atexit, fcntl, sys, time
gate, out = sys.argv[1], sys.argv[2]
from once.cli import main
import once.run.flow, once.ledger, once.run.wrapper
from once.ledger.postgres import PostgresLedger
import psycopg
with open(gate) as held:
    fcntl.flock(held, fcntl.LOCK_SH)
released = time.time()
atexit.register(lambda: open(out, "a").write(f"{released} {time.time()}\\n"))
main(sys.argv[3:])
"""


def fleet(name: str, url: str) -> None:
    """Fire FLEET processes at one instant at url; print the outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        gate, times, ran = directory / "gate", directory / "times", directory / "ran"
        gate.touch()
        env = {**os.environ, "ONCE_DATABASE_URL": url}
        job = f"fleet-{uuid.uuid4().hex[:8]}"
        command = [sys.executable, "-c", LAUNCHER, str(gate), str(times), "run", "--job", job,
                   "--every", "day", "--", "sh", "-c", f'echo x >> "{ran}"']
        with open(gate) as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            procs = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True) for _ in range(FLEET)]
            _wait_parked(gate, FLEET)
            fcntl.flock(held, fcntl.LOCK_UN)
        codes = collections.Counter(p.wait() for p in procs)
        errors = [p.stderr.read() for p in procs if p.returncode and p.stderr is not None]
        spans = sorted(end - start for start, end in (
            map(float, line.split()) for line in times.read_text().splitlines()))
        runs = len(ran.read_text().split()) if ran.exists() else 0
    statuses = ", ".join(f"exit {code}x{n}" for code, n in sorted(codes.items()))
    p99 = spans[min(len(spans) - 1, int(len(spans) * 0.99))] if spans else float("nan")
    verdict = "ok" if runs == 1 and set(codes) == {0} else "OVER GOAL"
    print(f"{name:<11} fleet: {FLEET} at one instant: {statuses}; runs {runs} (goal 1, no 75); "
          f"decision p50 {statistics.median(spans):.2f} s, p99 {p99:.2f} s  {verdict}")
    if errors:
        print(f"{'':<11} first error: {errors[0].strip()[:200]}")


def _wait_parked(gate: Path, count: int) -> None:
    inode = os.stat(gate).st_ino
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with open("/proc/locks") as locks:
            if sum(1 for line in locks if "->" in line and f":{inode} " in line) >= count:
                return
        time.sleep(0.05)
    raise SystemExit("bench: the fleet's processes did not all park on the gate")


def limited_login(admin_url: str) -> tuple[str, object]:
    """A PostgreSQL login limited to CONNECTION_LIMIT connections in a schema of its own:
    (its URL, a function that drops both)."""
    import psycopg

    from once.ledger import parse_url

    admin = parse_url(admin_url).connect_args["conninfo"]
    name = "once_fleet_" + uuid.uuid4().hex[:8]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN CONNECTION LIMIT {CONNECTION_LIMIT}")
        conn.execute(f"GRANT ALL ON SCHEMA {name} TO {name}")
    parts = urlsplit(admin_url)
    # The server's address as written (host:port, or none: a unix socket in the query).
    address = parts.netloc.rpartition("@")[2]
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("options="))
    url = parts._replace(netloc=f"{name}@{address}",
                         query="&".join(filter(None, [query, f"options=-csearch_path%3D{name}"]))
                         ).geturl()
    subprocess.run([str(Path(sys.executable).with_name("once")), "schema"], check=True,
                   env={**os.environ, "ONCE_DATABASE_URL": url}, capture_output=True)

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")
            conn.execute(f"DROP ROLE {name}")

    return url, drop


def run(pg_admin_url: str) -> None:
    url, drop = limited_login(pg_admin_url)
    try:
        fleet(f"pg({CONNECTION_LIMIT})", url)
    finally:
        drop()  # type: ignore[operator]
    bouncer = os.environ.get("ONCE_BENCH_PGBOUNCER_URL")
    if bouncer:
        fleet("pgbouncer", bouncer)

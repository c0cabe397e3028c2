"""`make bench`: figures for the hot path. Prints, pair by pair in one run:

1. a no-op `once run` (the period is already done) against a bare script that imports click and
   the driver and sends the same claim, on SQLite and PostgreSQL: median wall time and ratio
   (goals: <= 1.3 on SQLite, <= 1.2 on PostgreSQL);
2. 50 simultaneous no-op `once run` against 50 simultaneous bare scripts: time until all end.

PostgreSQL: ONCE_BENCH_POSTGRES_URL, else an embedded server started for the run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from once import ledger

ONCE = str(Path(sys.executable).with_name("once"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "40"))

BARE = '''
import sys
import click
{driver_import}

SQL = {sql!r}

@click.command()
@click.option("--job")
@click.option("--period")
@click.argument("command", nargs=-1)
def main(job, period, command):
    {body}

main()
'''

SQLITE_BODY = """conn = sqlite3.connect(sys.argv[-1], isolation_level=None, timeout=10)
    params = dict(job=job, period=period, owner="bare", kind="every", schedule="day",
                  tz="UTC", lag=0, max_attempts=3, stale_after=300.0, rerun=0, reason=None,
                  period_start="2026-01-01 00:00:00.000000",
                  period_end="2026-01-02 00:00:00.000000")
    conn.execute("BEGIN IMMEDIATE")
    (fence,) = conn.execute(SQL[0], params).fetchone()
    row = conn.execute(SQL[1], dict(params, fence=fence)).fetchone()
    if row is None:
        conn.execute(SQL[2], params).fetchone()
    conn.execute("COMMIT")"""

PG_BODY = """import datetime
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    conn = psycopg.connect(sys.argv[-1], autocommit=True, prepare_threshold=None)
    conn.execute(SQL, dict(job=job, period=period, owner="bare", kind="every",
                 schedule="day", tz="UTC", lag=0, max_attempts=3, stale_after=300.0,
                 rerun=False, reason=None, period_start=start,
                 period_end=start + datetime.timedelta(days=1))).fetchone()"""


def bare_script(dialect: str, directory: Path) -> Path:
    if dialect == "sqlite":
        cls = ledger.SqliteLedger
        text = BARE.format(driver_import="import sqlite3", body=SQLITE_BODY,
                           sql=(cls.UPSERT_JOB, cls.CLAIM_RUN, cls.HOLDER))
    else:
        text = BARE.format(driver_import="import psycopg", body=PG_BODY,
                           sql=ledger.PostgresLedger.CLAIM)
    path = directory / f"bare_{dialect}.py"
    path.write_text(text)
    return path


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"bench: {cmd[:3]} failed: {result.stderr.decode().strip()}")
    return elapsed


def together(cmd: list[str], env: dict[str, str], count: int) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(count)]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    if any(codes):
        raise SystemExit(f"bench: {codes.count(0)} of {count} simultaneous runs succeeded")
    return elapsed


def compare(name: str, url: str, bare: Path, bare_arg: str, goal: float) -> None:
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    once_cmd = [ONCE, "run", "--job", "bench", "--every", "day", "--", "true"]
    bare_cmd = [sys.executable, str(bare), "--job", "bench-bare", "--period", "p", bare_arg]
    timed(once_cmd, env)  # create the tables and mark today's period done
    timed(bare_cmd, env)
    once_times, bare_times = [], []
    for _ in range(ROUNDS):  # interleaved, so that machine noise hits both alike
        once_times.append(timed(once_cmd, env))
        bare_times.append(timed(bare_cmd, env))
    o, b = statistics.median(once_times), statistics.median(bare_times)
    verdict = "ok" if o / b <= goal else "OVER GOAL"
    print(f"{name:<11} no-op once run {o * 1000:7.1f} ms   bare claim {b * 1000:7.1f} ms   "
          f"ratio {o / b:5.2f} (goal <= {goal})  {verdict}")
    o50, b50 = together(once_cmd, env, 50), together(bare_cmd, env, 50)
    print(f"{name:<11} 50 at once: once run {o50 * 1000:7.0f} ms   bare {b50 * 1000:7.0f} ms   "
          f"ratio {o50 / b50:5.2f}")


def postgres_url() -> str:
    url = os.environ.get("ONCE_BENCH_POSTGRES_URL")
    if url:
        return url
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from conftest import start_embedded_postgres

    return start_embedded_postgres()


def main() -> None:
    python = sys.version.split()[0]
    print(f"once bench: {ROUNDS} rounds, median wall time per process, python {python}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        db = directory / "ledger.db"
        compare("sqlite", f"sqlite:///{db}", bare_script("sqlite", directory), str(db), 1.3)
        pg = postgres_url()
        target = ledger.parse_url(pg)
        compare("postgresql", pg, bare_script("postgresql", directory),
                target.connect_args["conninfo"], 1.2)


if __name__ == "__main__":
    main()

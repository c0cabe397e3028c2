"""`make bench`: figures for the hot path. Prints, pair by pair in one run:

1. a no-op `once run` (the period is already done) against a bare script that imports click and
   the driver and sends the same claim, on SQLite and PostgreSQL: median wall time and ratio
   (goals: <= 1.3 on SQLite, <= 1.2 on PostgreSQL);
2. 50 simultaneous no-op `once run` against 50 simultaneous bare scripts: time until all end;
3. catch-up overhead per period beyond the child's own run, wall and CPU (goal <= 2 ms);
4. the fleet row (bench/fleet.py): 100 `once run` released at one instant against PostgreSQL
   through a login limited to 6 connections (and through PgBouncer when
   ONCE_BENCH_PGBOUNCER_URL is set): exit statuses, runs (must be 1), time to decision;
5. the wrapper's memory while the command runs: PSS of `once run` and its guard, on
   PostgreSQL (goal <= 35 MiB together);
6. report times over 100 jobs x 10,000 periods (goal <= 0.5 s for status and check, <= 0.2 s
   for metrics and once serve's /metrics: Prometheus scrapes every 15-30 s), and `once
   serve`'s main page over 10,000 jobs x 100 periods (bench/dashboard.py; goal < 1 s;
   /api/status, every job in full, <= 1 s);
7. the output relay (bench/output.py): 1 GiB through `once run` against directly (goal: a
   ratio >= 0.8), the delay it adds to a line written every 10 ms (goal: p99 < 5 ms), the
   wrapper's PSS with capture on and off while the command writes (goal: within 2 MiB).
   `BENCH_ONLY=output` runs these rows alone; BENCH_OUTPUT_MIB makes the first smaller;
8. `once lead` (bench/lead.py): the failover gap after a crash and after a SIGTERM, a waiting
   candidate's CPU and server commits a second (100 of one name), the leader's PSS.
   `BENCH_ONLY=lead` runs these rows alone.

`BENCH_ONLY=catchup` runs row 3 alone (BENCH_CATCHUP_PERIODS, BENCH_CATCHUP_ROUNDS).
`BENCH_ONLY=noop` runs row 1 alone (no-op `once run` against the bare script, SQLite and
PostgreSQL), without the 50-at-once line.
`BENCH_ONLY=reports` runs the report rows (6) alone but the dashboard's,
`BENCH_ONLY=dashboard` the dashboard's alone, `BENCH_SKIP_REPORTS=1` all but them.

Each figure is printed beside its goal, with "ok" or "OVER GOAL".

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
from typing import Any

import once
from once import ledger
from once.ledger.postgres import PostgresLedger
from once.ledger.sqlite import SqliteLedger

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
                  tz="UTC", lag=0, max_attempts=3, attempt_cap=9, stale_after=300.0,
                  rerun=0, reason=None, claim_id="0123456789abcdef", no_overlap=0,
                  shards=1, command_hash=None,
                  period_start="2026-01-01 00:00:00.000000",
                  period_end="2026-01-02 00:00:00.000000")
    conn.execute("BEGIN IMMEDIATE")
    fence = conn.execute(SQL[0], params).fetchone()[0]
    row = conn.execute(SQL[1], dict(params, fence=fence)).fetchone()
    if row is None:
        conn.execute(SQL[2], params).fetchone()
    conn.execute("COMMIT")"""

PG_BODY = """import datetime
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    conn = psycopg.connect(sys.argv[-1], autocommit=True, prepare_threshold=None)
    conn.execute(SQL, dict(job=job, period=period, owner="bare", kind="every",
                 schedule="day", tz="UTC", lag=0, max_attempts=3, attempt_cap=9,
                 stale_after=300.0, claim_id="0123456789abcdef", no_overlap=0,
                 rerun=False, reason=None, shards=1, command_hash=None, period_start=start,
                 period_end=start + datetime.timedelta(days=1), max_skew=60.0,
                 host_now=datetime.datetime.now(datetime.timezone.utc))).fetchone()"""


def bare_script(dialect: str, directory: Path) -> Path:
    if dialect == "sqlite":
        cls = SqliteLedger
        text = BARE.format(driver_import="import sqlite3", body=SQLITE_BODY,
                           sql=(cls.UPSERT_JOB, cls.CLAIM_RUN, cls.HOLDER))
    else:
        text = BARE.format(driver_import="import psycopg", body=PG_BODY,
                           sql=PostgresLedger.CLAIM)
    path = directory / f"bare_{dialect}.py"
    path.write_text(text)
    # Run through a tiny importer, so that the script itself is byte-compiled like once.
    module = directory / f"run_bare_{dialect}.py"
    module.write_text(f"import sys\nsys.path.insert(0, {str(directory)!r})\n"
                      f"import bare_{dialect}\n")
    compile_sources(path)
    return module


def timed(cmd: list[str], env: dict[str, str]) -> float:
    return timed_cpu(cmd, env)[0]


def timed_cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time, and the CPU time (user + sys) of the process and its children."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"bench: {cmd[:3]} failed: {result.stderr.decode().strip()}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def together(cmd: list[str], env: dict[str, str], count: int) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(count)]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    if any(codes):
        raise SystemExit(f"bench: {codes.count(0)} of {count} simultaneous runs succeeded")
    return elapsed


def compare(name: str, url: str, bare: Path, bare_arg: str, goal: float,
            at_once: bool = True) -> None:
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
    if not at_once:
        return
    o50, b50 = together(once_cmd, env, 50), together(bare_cmd, env, 50)
    print(f"{name:<11} 50 at once: once run {o50 * 1000:7.0f} ms   bare {b50 * 1000:7.0f} ms   "
          f"ratio {o50 / b50:5.2f}")


CATCHUP_PERIODS = int(os.environ.get("BENCH_CATCHUP_PERIODS", "1000"))
CATCHUP_ROUNDS = int(os.environ.get("BENCH_CATCHUP_ROUNDS", "3"))  # catch-ups (median)


def catchup_overhead(name: str, url: str) -> None:
    """once catchup over 1,000 minute periods with `true`, less the children's own cost
    (the same number of `true` spawned from Python) and less a catch-up with nothing to do;
    the median of CATCHUP_ROUNDS, wall and CPU (once's processes and the children's, the
    database server's aside)."""
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    last = f"2026-01-01T{(CATCHUP_PERIODS - 1) // 60:02d}:{(CATCHUP_PERIODS - 1) % 60:02d}"
    rounds = []
    for _ in range(CATCHUP_ROUNDS):
        cmd = [ONCE, "catchup", "--job", f"bench-catchup-{time.time_ns()}", "--every",
               "minute", "--since", "2026-01-01T00:00", "--until", last, "-q", "--", "true"]
        full = timed_cpu(cmd, env)
        empty = timed_cpu(cmd, env)  # the same again: every period is done, nothing runs
        children = children_alone()
        beyond = [(f - e - c) / CATCHUP_PERIODS
                  for f, e, c in zip(full, empty, children, strict=True)]
        rounds.append((full[0], children[0], *beyond))
    full_s, children_s, per, cpu = sorted(rounds, key=lambda r: r[2])[len(rounds) // 2]
    verdict = "ok" if per <= CATCHUP_GOAL else "OVER GOAL"
    print(f"{name:<11} catch-up: {CATCHUP_PERIODS} periods in {full_s:6.1f} s, children alone "
          f"{children_s:5.1f} s: {per * 1000:5.2f} ms per period beyond the child, "
          f"{cpu * 1000:5.2f} ms cpu (goal <= {CATCHUP_GOAL * 1000:g} ms)  {verdict}")


def children_alone() -> tuple[float, float]:
    """Wall and CPU time of CATCHUP_PERIODS `true` started from Python (vfork)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for _ in range(CATCHUP_PERIODS):
        subprocess.run(["true"], check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


CATCHUP_GOAL = 0.002  # seconds per period beyond the child's own run (issue 37)
PSS_GOAL = 35 * 1024  # KiB: the wrapper and its guard together, while the command runs


def wrapper_memory(name: str, url: str) -> None:
    """PSS of `once run` and its guard (`once-guard JOB PERIOD`) while the command sleeps."""
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    with tempfile.TemporaryDirectory() as tmp:
        started = Path(tmp) / "started"
        proc = subprocess.Popen([ONCE, "run", "--job", f"bench-pss-{time.time_ns()}",
                                 "--every", "day", "--", "sh", "-c",
                                 f'touch "{started}"; sleep 3'], env=env)
        try:
            deadline = time.monotonic() + 60
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # the heartbeat thread and the guard settled
            wrapper = _pss(proc.pid)
            guards = [_pss(pid) for pid in _children(proc.pid)]
        finally:
            proc.wait()
    total = wrapper + sum(guards)
    verdict = "ok" if total <= PSS_GOAL else "OVER GOAL"
    print(f"{name:<11} wrapper memory: once run {wrapper / 1024:5.1f} MiB + guard "
          f"{sum(guards) / 1024:5.1f} MiB = {total / 1024:5.1f} MiB PSS "
          f"(goal <= {PSS_GOAL // 1024} MiB)  {verdict}")


def _pss(pid: int) -> int:
    """Proportional set size in KiB (shared pages split among their users)."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(c) for c in children.read().split()]


def postgres_url() -> str:
    url = os.environ.get("ONCE_BENCH_POSTGRES_URL")
    if url:
        return url
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from conftest import start_embedded_postgres

    return start_embedded_postgres()


def compile_sources(*paths: Path) -> None:
    """Byte-compile once and the bare scripts first, as an installed wheel is: with
    PYTHONDONTWRITEBYTECODE set (as on some machines) an editable install would otherwise
    recompile every module on every run, which no installed `once` does."""
    import compileall

    for path in paths:
        if path.is_dir():
            compileall.compile_dir(str(path), quiet=1)
        else:
            compileall.compile_file(str(path), quiet=1)


def main() -> None:
    compile_sources(Path(once.__file__).parent)
    python = sys.version.split()[0]
    print(f"once bench: {ROUNDS} rounds, median wall time per process, python {python}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        db = directory / "ledger.db"
        sys.path.insert(0, str(Path(__file__).parent))
        import output

        if os.environ.get("BENCH_ONLY") == "output":
            output.run(f"sqlite:///{db}")
            return
        if os.environ.get("BENCH_ONLY") == "reports":
            reports(directory, postgres_url())
            return
        import dashboard

        if os.environ.get("BENCH_ONLY") == "dashboard":
            dashboard.run(directory, postgres_url())
            return
        if os.environ.get("BENCH_ONLY") == "lead":
            import lead

            lead.run(f"sqlite:///{db}", postgres_url())
            return
        if os.environ.get("BENCH_ONLY") == "catchup":
            catchup_overhead("sqlite", f"sqlite:///{db}")
            catchup_overhead("postgresql", postgres_url())
            return
        noop = os.environ.get("BENCH_ONLY") == "noop"
        compare("sqlite", f"sqlite:///{db}", bare_script("sqlite", directory), str(db), 1.3,
                at_once=not noop)
        pg = postgres_url()
        target = ledger.parse_url(pg)
        compare("postgresql", pg, bare_script("postgresql", directory),
                target.connect_args["conninfo"], 1.2, at_once=not noop)
        if noop:
            return
        catchup_overhead("sqlite", f"sqlite:///{db}")
        catchup_overhead("postgresql", pg)
        wrapper_memory("postgresql", pg)
        output.run(f"sqlite:///{db}")
        if os.environ.get("BENCH_SKIP_FLEET") != "1":
            import fleet

            fleet.run(pg)
        import lead

        lead.run(f"sqlite:///{db}", pg)
        if os.environ.get("BENCH_SKIP_REPORTS") != "1":
            reports(directory, pg)
            dashboard.run(directory, pg)


# -- reports: once status and once check over 100 jobs x 10,000 periods ---------------------

REPORT_JOBS = int(os.environ.get("BENCH_REPORT_JOBS", "100"))
REPORT_PERIODS = int(os.environ.get("BENCH_REPORT_PERIODS", "10000"))
# Schedules the seeded jobs take in turn (hourly and 15-minute ones cross DST changes).
REPORT_SCHEDULES = [("hour", "Europe/Berlin"), ("day", "UTC"), ("15m", "America/New_York"),
                    ("minute", "UTC")]
REPORT_GOAL = 0.5  # seconds, wall time of the whole command (once status, check)
# seconds, wall time of once metrics (the whole command) and of once serve's /metrics: what
# Prometheus or its textfile collector asks for every 15-30 s
SCRAPE_GOAL = 0.2
REPORT_ROUNDS = int(os.environ.get("BENCH_REPORT_ROUNDS", "7"))  # runs per command (median)


def reports(directory: Path, pg: str) -> None:
    """Seed a ledger of REPORT_JOBS jobs x REPORT_PERIODS periods (every 20th job with gaps,
    failures and a stale attempt) on SQLite and PostgreSQL; time once status, check, metrics
    and once serve's /metrics."""
    from datetime import UTC, datetime

    jobs, runs = report_rows(datetime.now(UTC))
    print(f"reports: {len(jobs)} jobs, {len(runs)} rows in once_runs and once_attempts, "
          f"median of {REPORT_ROUNDS} wall times per command")
    sqlite_url = f"sqlite:///{directory / 'reports.db'}"
    seed_sqlite(sqlite_url, jobs, runs)
    time_reports("sqlite", sqlite_url)
    pg_url, drop = pg_schema(pg, "once_bench_reports")
    try:
        seed_postgres(pg_url, jobs, runs)
        time_reports("postgresql", pg_url)
    finally:
        drop()


def report_rows(now: object, count: int = REPORT_JOBS, length: int = REPORT_PERIODS
                ) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """(once_jobs rows, once_runs rows) of `count` jobs x `length` periods (every 20th job
    with gaps, failures and a stale attempt); times as aware UTC datetimes."""
    from datetime import UTC, datetime, timedelta

    from once.schedules import schedule

    assert isinstance(now, datetime)
    periods = {}
    for spec, tz in REPORT_SCHEDULES:  # each schedule walked once, shared by its jobs
        sched = schedule(spec, None, tz)
        walk = [sched.containing(now)]
        while len(walk) < length:
            walk.append(sched.previous(walk[-1]))
        periods[spec, tz] = [(p.key, p.start.astimezone(UTC), p.end.astimezone(UTC))
                             for p in reversed(walk)]
    jobs: list[tuple[object, ...]] = []
    runs: list[tuple[object, ...]] = []
    for i in range(count):
        spec, tz = REPORT_SCHEDULES[i % len(REPORT_SCHEDULES)]
        name = f"bench-{spec}-{i:03d}"
        mine = periods[spec, tz]
        troubled = i % 20 == 0
        jobs.append((name, len(mine), len(mine), "every", spec, tz, 0, 3, 300.0, mine[0][1],
                     now, now))
        for n, (key, start, end) in enumerate(mine):
            if troubled and length // 2 <= n < length // 2 + 10:
                continue  # missing
            status, code, beat = "done", 0, end
            if troubled and n in (length * 6 // 10, length * 7 // 10):
                status, code = "failed", 1
            if troubled and n == length * 8 // 10:
                status, code, beat = "running", None, now - timedelta(hours=1)  # stale
            finished = None if status == "running" else end
            runs.append((name, key, status, 1, n + 1, "seed", start, end, end, beat, finished,
                         code))
    return jobs, runs


# The seeded columns of once_runs (the rest take their defaults).
RUN_COLUMNS = ("(job, period, status, attempt, fence, owner, period_start, period_end, "
               "started_at, heartbeat_at, finished_at, exit_code)")


def seed_sqlite(url: str, jobs: list[tuple[object, ...]], runs: list[tuple[object, ...]]) -> None:
    import sqlite3
    from datetime import datetime

    from once.ledger import schema

    target = ledger.parse_url(url)
    schema.ensure(target)

    def text(row: tuple[object, ...]) -> tuple[object, ...]:
        return tuple(v.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(v, datetime) else v
                     for v in row)

    conn = sqlite3.connect(target.path)
    with conn:
        conn.executemany(f"INSERT INTO once_jobs (job, fence, fire_count, kind, schedule, tz, lag, "
                         f"max_attempts, stale_after, first_period_start, created_at, "
                         f"last_fired_at) VALUES ({', '.join('?' * 12)})", map(text, jobs))
        conn.executemany(f"INSERT INTO once_runs {RUN_COLUMNS} VALUES ({', '.join('?' * 12)})",
                         map(text, runs))
        conn.executemany("INSERT INTO once_attempts (job, period, attempt, fence, owner, status, "
                         "started_at, finished_at, exit_code, claim_id) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'seed')",
                         (text((r[0], r[1], r[3], r[4], r[5], r[2], r[8], r[10], r[11]))
                          for r in runs))
    conn.execute("ANALYZE")
    conn.close()


def pg_schema(url: str, name: str) -> tuple[str, Any]:
    """A fresh schema on the server, its URL, and a function that drops it."""
    from urllib.parse import quote

    import psycopg

    conninfo = ledger.parse_url(url).connect_args["conninfo"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")

    def drop() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote('-csearch_path=' + name)}", drop


def seed_postgres(url: str, jobs: list[tuple[object, ...]],
                  runs: list[tuple[object, ...]]) -> None:
    import psycopg

    from once.ledger import schema

    target = ledger.parse_url(url)
    schema.ensure(target)
    with psycopg.connect(target.connect_args["conninfo"], autocommit=True) as conn:
        with conn.cursor() as cur:
            with cur.copy("COPY once_jobs (job, fence, fire_count, kind, schedule, tz, lag, "
                          "max_attempts, stale_after, first_period_start, created_at, "
                          "last_fired_at) FROM STDIN") as copy:
                for row in jobs:
                    copy.write_row(row)
            with cur.copy(f"COPY once_runs {RUN_COLUMNS} FROM STDIN") as copy:
                for row in runs:
                    copy.write_row(row)
            with cur.copy("COPY once_attempts (job, period, attempt, fence, owner, status, "
                          "started_at, finished_at, exit_code, claim_id) FROM STDIN") as copy:
                for r in runs:
                    copy.write_row((r[0], r[1], r[3], r[4], r[5], r[2], r[8], r[10], r[11],
                                    "seed"))
        conn.execute("VACUUM ANALYZE")


def time_reports(name: str, url: str) -> None:
    """Median wall time of REPORT_ROUNDS runs per command, and its CPU time (user + sys of
    the process: what the wall time would be on an idle machine, the database server's share
    aside)."""
    import resource

    env = {**os.environ, "ONCE_DATABASE_URL": url}
    for command in ("status", "check", "metrics"):
        times = []
        for _ in range(REPORT_ROUNDS):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            result = subprocess.run([ONCE, command], env=env, capture_output=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            times.append((wall, cpu))
            if result.returncode not in (0, 1, 2):
                raise SystemExit(f"bench: once {command} failed: "
                                 f"{result.stderr.decode().strip()}")
        wall, cpu = sorted(times)[len(times) // 2]
        most = SCRAPE_GOAL if command == "metrics" else REPORT_GOAL
        goal = f"(goal <= {most:g} s)  {'ok' if wall <= most else 'OVER GOAL'}"
        print(f"{name:<11} once {command:<8} {wall * 1000:6.0f} ms wall  {cpu * 1000:6.0f} ms cpu"
              f"  {goal}".rstrip())
    import dashboard

    dashboard.served(name, url, {"/metrics": (SCRAPE_GOAL, "<=")})

if __name__ == "__main__":
    main()

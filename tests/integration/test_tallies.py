"""PostgreSQL's tallies (once.ledger.pg_tallies, docs/reference/tables.md "The tallies"): each
job's done rows and attempts, kept by triggers, are the rows' own counts whoever writes them
(this `once`, an older build of the same schema, a DBA's statements, many writers at once,
writers while `once schema` makes the tallies), and the reads use them only while every
trigger is there, enabled and once's own. Real servers (the machine's PostgreSQL and the
embedded one), real `once` processes.
"""

from __future__ import annotations

import random
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from helpers import ONCE
from ledger_sql import query
from once.ledger import parse_url, schema
from once.ledger.fleet import Snapshot
from versions import build

# The last commit of main before the tallies (schema 5, as this once).
BEFORE_TALLIES = "4f2f90808a7a03c357da1d29f1d205af5473e6b7"


def _ok(once: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([once, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{once} {' '.join(args)}: {done.stderr}"
    return done


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(parse_url(url).connect_args["conninfo"], autocommit=True)


def tallies(url: str) -> dict[str, tuple[int, int]]:
    """Each job's tally (done rows, attempts), its zero jobs left out."""
    rows = query(url, "SELECT job, sum(done_runs), sum(attempts) FROM once_tallies GROUP BY job")
    return {job: (int(d), int(a)) for job, d, a in rows if d or a}


def counts(url: str) -> dict[str, tuple[int, int]]:
    """Each job's done rows and attempts, counted."""
    done = dict(query(url, "SELECT job, count(*) FROM once_runs WHERE status = 'done' "
                           "GROUP BY job"))
    tries = dict(query(url, "SELECT job, count(*) FROM once_attempts GROUP BY job"))
    return {job: (int(done.get(job, 0)), int(tries.get(job, 0)))
            for job in set(done) | set(tries)}


def tallied(url: str) -> bool:
    with Snapshot.open(parse_url(url)) as snap:
        snap.tallies_allowed = True
        return snap.tallied()


def _exact(url: str) -> None:
    assert tallies(url) == counts(url)


def _prune(url: str, once: str, env: dict[str, str]) -> None:
    """`once prune` of rows made old: it deletes some, and the tallies follow."""
    for table in ("once_runs", "once_attempts"):
        query(url, f"UPDATE {table} SET finished_at = finished_at - interval '2 days' "
                   "WHERE finished_at IS NOT NULL")
    before = counts(url)
    _ok(once, env, "prune", "--older-than", "1d")
    assert counts(url) != before
    _exact(url)


def _metrics(env: dict[str, str]) -> list[str]:
    """`once metrics`' samples but the ones that move with the clock."""
    text = _ok(ONCE, env, "metrics").stdout
    return [line for line in text.splitlines() if not line.startswith("#")
            and "seconds" not in line.split("{")[0]]


def test_every_writer_of_once_keeps_the_tallies_exact(pg_url: str,
                                                      once_env: dict[str, str]) -> None:
    run = ["--every", "minute", "--max-attempts", "2"]
    _ok(ONCE, once_env, "run", "--job", "a", "--catchup", "5", *run, "--", "true")
    assert tallied(pg_url)
    _exact(pg_url)
    failed = subprocess.run([ONCE, "run", "--job", "b", *run, "--", "false"], env=once_env,
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode != 0
    _ok(ONCE, once_env, "run", "--job", "b", *run, "--", "true")  # the retry, done
    period = query(pg_url, "SELECT period FROM once_runs WHERE job = 'a' ORDER BY period")[0][0]
    subprocess.run([ONCE, "rerun", "--job", "a", "--period", period, "--", "false"],
                   env=once_env, capture_output=True, timeout=60)  # the period failed
    _ok(ONCE, once_env, "state", "c", "--set", "7", "--every", "day")
    _exact(pg_url)
    assert tallies(pg_url)["b"] == (1, 2) and tallies(pg_url)["c"] == (0, 1)
    # A DBA's statements: a row moved, rows deleted, a table truncated.
    query(pg_url, "UPDATE once_runs SET job = 'moved' WHERE job = 'b'")
    query(pg_url, "UPDATE once_attempts SET job = 'moved' WHERE job = 'b'")
    query(pg_url, "DELETE FROM once_attempts WHERE job = 'a' AND attempt = 1 "
                  "AND period = (SELECT min(period) FROM once_attempts WHERE job = 'a')")
    _exact(pg_url)
    _prune(pg_url, ONCE, once_env)
    query(pg_url, "TRUNCATE once_attempts")
    _exact(pg_url)
    assert tallied(pg_url)


def test_an_older_once_of_the_same_schema_keeps_them_exact(pg_url: str,
                                                           once_env: dict[str, str]) -> None:
    older = str(build(BEFORE_TALLIES) / "bin" / "once")
    _ok(older, once_env, "run", "--job", "old", "--every", "minute", "--catchup", "3",
        "--", "true")
    # A ledger an older once made has no tallies: the reads count, and `once schema` makes
    # them from the rows there.
    assert query(pg_url, "SELECT to_regclass('once_tallies')") == [(None,)]
    before = _metrics(once_env)
    assert not tallied(pg_url)
    _ok(ONCE, once_env, "schema")
    assert tallied(pg_url)
    _exact(pg_url)
    assert _metrics(once_env) == before
    # The older once's claims, finishes, reruns and prune fire the triggers as any other.
    _ok(older, once_env, "run", "--job", "old", "--every", "hour", "--catchup", "2",
        "--", "true")
    period = query(pg_url, "SELECT max(period) FROM once_runs WHERE job = 'old'")[0][0]
    _ok(older, once_env, "rerun", "--job", "old", "--period", period, "--", "true")
    _exact(pg_url)
    _prune(pg_url, older, once_env)


def test_reads_count_the_rows_unless_every_trigger_is_there_and_once_s(
        pg_url: str, once_env: dict[str, str]) -> None:
    _ok(ONCE, once_env, "run", "--job", "j", "--every", "minute", "--catchup", "4", "--", "true")
    query(pg_url, "ALTER TABLE once_attempts DISABLE TRIGGER once_tally_attempts_new")
    assert not tallied(pg_url)
    _ok(ONCE, once_env, "run", "--job", "k", "--every", "minute", "--", "true")  # not tallied
    assert tallies(pg_url) != counts(pg_url)
    assert 'once_runs_total{once_job="k",status="done"} 1' in _metrics(once_env)
    _ok(ONCE, once_env, "schema")  # a trigger turned off is the DBA's: left
    assert not tallied(pg_url)
    query(pg_url, "ALTER TABLE once_attempts ENABLE TRIGGER once_tally_attempts_new")
    # A trigger missing: `once schema` makes them again, from the rows.
    query(pg_url, "DROP TRIGGER once_tally_runs_changed ON once_runs")
    assert not tallied(pg_url)
    _ok(ONCE, once_env, "schema")
    assert tallied(pg_url)
    _exact(pg_url)
    # A body that is not once's: never read.
    query(pg_url, "CREATE OR REPLACE FUNCTION once_tally_runs() RETURNS trigger "
                  "LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$")
    assert not tallied(pg_url)
    assert _metrics(once_env) == _metrics(once_env)  # read by counting, no error


def _writer(url: str, job: str, rounds: int, isolation: str,
            errors: list[BaseException]) -> Callable[[], None]:
    """Claims and finishes, rows made done and undone and deleted, by plain SQL."""
    def write() -> None:
        try:
            with _connect(url) as conn:
                rng = random.Random(job)
                for n in range(rounds):
                    with conn.transaction():
                        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                        period = f"{job}-{n}"
                        conn.execute(
                            "INSERT INTO once_runs (job, period, status, attempt, fence, owner, "
                            "period_start, period_end, started_at, heartbeat_at) VALUES "
                            "(%s, %s, 'running', 1, 1, 'w', now(), now(), now(), now())",
                            (job[0], period))
                        conn.execute(
                            "INSERT INTO once_attempts (job, period, attempt, fence, owner, "
                            "status, started_at, claim_id) VALUES "
                            "(%s, %s, 1, 1, 'w', 'running', now(), 'x')", (job[0], period))
                    conn.execute("UPDATE once_runs SET status = 'done' WHERE job = %s "
                                 "AND period = %s", (job[0], period))
                    if rng.random() < 0.2:
                        conn.execute("UPDATE once_runs SET status = 'failed' WHERE job = %s "
                                     "AND period = %s", (job[0], f"{job}-{rng.randrange(n + 1)}"))
                    if rng.random() < 0.1:
                        conn.execute("DELETE FROM once_runs WHERE job = %s AND period LIKE %s "
                                     "AND period < %s", (job[0], f"{job}-%", period))
        except BaseException as exc:
            errors.append(exc)
    return write


def test_writers_at_once_and_folds_keep_exact_sums(pg_url: str) -> None:
    schema.ensure(parse_url(pg_url))
    errors: list[BaseException] = []
    # Writers of the same jobs (their first letters), one of them in REPEATABLE READ.
    names = ["a1", "a2", "a3", "b1", "b2", "c1"]
    threads = [threading.Thread(target=_writer(pg_url, name, 150,
                                               "REPEATABLE READ" if name == "c1"
                                               else "READ COMMITTED", errors))
               for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    _exact(pg_url)
    # Folded as they went: far fewer rows than the deltas written (6 x 150 x 2 at least).
    (rows,) = query(pg_url, "SELECT count(*) FROM once_tallies")[0]
    assert rows < 6 * 150, rows


def test_made_while_writers_write(pg_url: str) -> None:
    target = parse_url(pg_url)
    schema.ensure(target)
    query(pg_url, "DROP TABLE once_tallies")  # the triggers left: they count nothing
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_writer(pg_url, name, 200, "READ COMMITTED", errors))
               for name in ("x1", "x2", "y1")]
    for t in threads:
        t.start()
    for _ in range(3):  # made, then found missing a trigger, made again, while they write
        schema.ensure(target)
        query(pg_url, "DROP TRIGGER IF EXISTS once_tally_attempts_gone ON once_attempts")
    schema.ensure(target)
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    _exact(pg_url)
    assert tallied(pg_url)


def test_schema_sql_makes_them_from_the_rows(pg_url: str, once_env: dict[str, str]) -> None:
    """`once schema --sql`'s tallies, run by hand on a ledger with rows, count those rows."""
    _ok(ONCE, once_env, "run", "--job", "j", "--every", "minute", "--catchup", "3", "--", "true")
    query(pg_url, "DROP TABLE once_tallies")
    statements = _ok(ONCE, once_env, "schema", "--sql").stdout
    start = statements.index("DO $tallies$")
    end = statements.index("END $tallies$") + len("END $tallies$")
    with _connect(pg_url) as conn:
        conn.execute(statements[start:end])
    _exact(pg_url)
    assert tallied(pg_url)


def test_done_rows_outside_the_due_range_are_left_out_as_counted(
        pg_url: str, once_env: dict[str, str]) -> None:
    """A done row of a period not yet due (as a rerun --allow-future makes) and done rows
    before the job's first period (its first period moved later): the range's count is the
    tally less what lies outside it, and a gap in the range is not hidden by them."""
    _ok(ONCE, once_env, "run", "--job", "j", "--every", "minute", "--", "true")
    query(pg_url, "UPDATE once_jobs SET first_period_start = first_period_start "
                  "- interval '10 minutes'")
    _ok(ONCE, once_env, "run", "--job", "j", "--every", "minute", "--catchup", "20",
        "--", "true")
    query(pg_url, "INSERT INTO once_runs (job, period, status, attempt, fence, owner, "
                  "period_start, period_end, started_at, heartbeat_at, finished_at) "
                  "SELECT job, 'future', 'done', 1, 1, 'dba', now() + interval '1 day', "
                  "now() + interval '1 day 1 minute', now(), now(), now() FROM once_jobs")
    query(pg_url, "UPDATE once_jobs SET first_period_start = first_period_start "
                  "+ interval '3 minutes'")
    query(pg_url, "DELETE FROM once_runs r USING once_jobs j WHERE r.job = j.job "
                  "AND r.period_start = j.first_period_start + interval '2 minutes'")
    tallied_metrics = _metrics(once_env)
    assert tallied(pg_url)
    (missing,) = [m for m in tallied_metrics if m.startswith("once_missing_periods")]
    assert int(missing.split()[-1]) >= 1  # the gap (3 rows before the range would hide it)
    query(pg_url, "DROP TABLE once_tallies")
    assert _metrics(once_env) == tallied_metrics

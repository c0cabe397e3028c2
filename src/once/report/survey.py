"""Every job's state in one snapshot: its due range, the counts of its done rows, its open
rows, its latest done row, the last lines of its failures, its missing periods, and the rows
of its timeline (SQLAlchemy Core over once.ledger.schema's tables, on a connection of
once.report.snapshot).

Scale: the number of due periods is counted arithmetically (once.gaps) and compared with one
COUNT of done rows over an index range per job (index once_runs_job_status_start); only a job
whose count shows a gap has its gaps located, by counting ever smaller stretches
(once.gaps.GapFinder, which catch-up uses too: about log8(periods) round trips per gap; the
stretch after a job's latest row costs none), and only the first few missing keys and the last
one are walked. So `once status` and `once check` read O(jobs) index ranges and walk O(listed)
periods, not every period of every job. A cron schedule has no closed-form count: its gaps are
the stretches between its done rows (a window query over the job's done rows, in index order),
walked up to WALK_LIMIT.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from functools import cache
from itertools import islice
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.sql import Executable

from once import gaps
from once.ledger import Target, from_db_time
from once.ledger import schema as tables
from once.periods import Period, SpecError, utc_instant
from once.report.model import (
    LIST_LIMIT,
    MAX_LAST,
    NEVER,
    JobState,
    RunRow,
    Unit,
    default_last,
    last_line,
    period_state,
)
from once.report.snapshot import bind, db_now
from once.stored import job_schedule, period_key

WALK_LIMIT = 100_000  # missing units walked per job to count the gaps of a cron job
CHUNK = 200  # jobs per statement (SQLite allows 500 terms in a compound SELECT)

runs, attempts, jobs = tables.runs, tables.attempts, tables.jobs

RUN_COLUMNS = (runs.c.job, runs.c.period, runs.c.status, runs.c.attempt, runs.c.fence,
               runs.c.owner, runs.c.period_start, runs.c.period_end, runs.c.started_at,
               runs.c.heartbeat_at, runs.c.finished_at, runs.c.exit_code,
               runs.c.stale_after)


def select_jobs(conn: Connection, names: Sequence[str] | None,
                namespace: str | None) -> list[Any]:
    """The once_jobs rows of the named jobs (all of them, or those of a namespace), by name."""
    query = select(jobs.c.job, jobs.c.kind, jobs.c.schedule, jobs.c.tz, jobs.c.lag,
                   jobs.c.max_attempts, jobs.c.stale_after, jobs.c.fires,
                   jobs.c.first_period_start, jobs.c.shards)
    if names:
        found: list[Any] = []
        for chunk in chunks(list(names), 500):
            found += conn.execute(query.where(jobs.c.job.in_(chunk))).all()
        return sorted(found, key=lambda r: r.job)
    if namespace:
        query = query.where(jobs.c.job.startswith(namespace + ":", autoescape=True))
    return sorted(conn.execute(query).all(), key=lambda r: r.job)


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def survey_jobs(conn: Connection, target: Target, names: Sequence[str] | None,
                namespace: str | None, grace: float = 0.0) -> tuple[list[JobState], datetime]:
    """The named jobs (all of them, or those of a namespace) at the database's now."""
    now = db_now(conn, target)
    return survey(conn, target, select_jobs(conn, names, namespace), now, grace), now


def survey(conn: Connection, target: Target, job_rows: Sequence[Any], now: datetime,
           grace: float = 0.0) -> list[JobState]:
    """Every named job's state at `now`: due range, counts, open rows, missing periods."""
    states = [_plan(row, now, grace) for row in job_rows]
    ready = [s for s in states if s.sched is not None]
    _count_done(conn, target, ready)
    _read_open_rows(conn, ready)
    _read_last_done(conn, ready)
    _read_failure_lines(conn, ready)
    for state in ready:
        _locate_missing(conn, target, state)
    return states


def _plan(row: Any, now: datetime, grace: float) -> JobState:
    """The job's periods at `now`, from its stored schedule: no database needed."""
    state = JobState(row.job, row.kind, row.schedule, row.tz, row.lag, row.max_attempts,
                     float(row.stale_after), row.fires, from_db_time(row.first_period_start), now,
                     max(1, int(row.shards or 1)))
    try:
        sched = job_schedule(row.kind, row.schedule, row.tz)
        state.sched = sched
        state.first = sched.containing(state.first_period_start)
        running_now = sched.containing(now)
        state.current = sched.shifted(running_now, -row.lag)
        state.next = sched.next(state.current)
        state.next_at = utc_instant(running_now.end)
        due_last = sched.shifted(sched.containing(now - timedelta(seconds=grace)),
                                 -(row.lag + 1))
        if utc_instant(due_last.start) >= utc_instant(state.first.start):
            state.due_last = due_last
            state.expected = gaps.count(sched, state.first, due_last)
    except (SpecError, ValueError, OverflowError) as exc:
        state.sched = None
        state.error = str(exc)
    return state


def _count_done(conn: Connection, target: Target, states: list[JobState]) -> None:
    """done rows in each job's due range: one COUNT over an index range per job, CHUNK jobs
    per statement."""
    due = [s for s in states if s.due_last is not None and s.first is not None]
    for chunk in chunks(due, CHUNK):
        params: dict[str, Any] = {}
        for i, s in enumerate(chunk):
            assert s.first is not None and s.due_last is not None
            params[f"j{i}"] = s.name
            params[f"a{i}"] = bind(target, s.first.start)
            params[f"b{i}"] = bind(target, s.due_last.end)
        for i, n in conn.execute(_done_counts(len(chunk)), params).all():
            chunk[int(i)].done_due = int(n)


@cache
def _done_counts(size: int) -> Executable:
    """done rows of job j_i in [a_i, b_i) for i < size: text, not a Core construct, since a
    compound SELECT of CHUNK terms took SQLAlchemy a tenth of a second to compile, in every
    report (a new process each time)."""
    when = runs.c.period_start.type
    sql = " UNION ALL ".join(
        f"SELECT {i} AS i, count(*) AS n FROM once_runs WHERE job = :j{i} AND status = 'done'"
        f" AND period_start >= :a{i} AND period_start < :b{i}" for i in range(size))
    return text(sql).bindparams(*(bindparam(f"{edge}{i}", type_=when)
                                  for i in range(size) for edge in "ab"))


def _read_open_rows(conn: Connection, states: list[JobState]) -> None:
    """The running and failed rows of the jobs (index once_runs_job_status)."""
    by_name = {s.name: s for s in states}
    for chunk in chunks(list(by_name), 500):
        query = select(*RUN_COLUMNS).where(runs.c.job.in_(chunk),
                                           runs.c.status.in_(("running", "failed")))
        for row in conn.execute(query.order_by(runs.c.job, runs.c.period_start)):
            by_name[row.job].open_rows.append(RunRow.of(row))


def _read_last_done(conn: Connection, states: list[JobState]) -> None:
    """Each job's latest done period (by period start): one index seek per job."""
    by_name = {s.name: s for s in states}
    latest = runs.alias("latest")
    newest = (select(func.max(latest.c.period_start))
              .where(latest.c.job == jobs.c.job, latest.c.status == "done")
              .scalar_subquery())
    for chunk in chunks(list(by_name), 500):
        query = (select(*RUN_COLUMNS)
                 .select_from(jobs.join(runs, and_(runs.c.job == jobs.c.job,
                                                   runs.c.status == "done",
                                                   runs.c.period_start == newest)))
                 .where(jobs.c.job.in_(chunk)))
        for row in conn.execute(query):
            by_name[row.job].last_done = RunRow.of(row)


def _read_failure_lines(conn: Connection, states: list[JobState]) -> None:
    """The last line of output of each failed row listed: the end of its attempt's stored
    output (primary-key lookups, only where a job has failed rows)."""
    wanted = [(s, r) for s in states for r in s.listed_failures]
    by_key = {(s.name, r.period, r.attempt): s for s, r in wanted}
    for chunk in chunks(list(by_key), 100):
        match = or_(*(and_(attempts.c.job == job, attempts.c.period == period,
                           attempts.c.attempt == attempt) for job, period, attempt in chunk))
        query = select(attempts.c.job, attempts.c.period, attempts.c.attempt,
                       output_end(conn).label("output_end")).where(match)
        for row in conn.execute(query):
            state = by_key[(row.job, row.period, row.attempt)]
            state.failure_lines[row.period] = last_line(row.output_end)


# How much of the end of a stored output the reports read to find its last line.
LAST_LINE_SCAN = 2000


def output_end(conn: Connection) -> Any:
    """SQL for the last LAST_LINE_SCAN characters of once_attempts.output (up to 1 MiB: the
    reports never fetch it whole)."""
    if conn.dialect.name == "sqlite":
        return func.substr(attempts.c.output, -LAST_LINE_SCAN)
    return func.right(attempts.c.output, LAST_LINE_SCAN)


def _locate_missing(conn: Connection, target: Target, s: JobState) -> None:
    """Count the due periods (with --shards: shards) that have no row; list the first few and
    the last one (once.gaps.GapFinder, as catch-up finds them)."""
    if s.due_last is None or s.first is None or s.sched is None:
        return
    lo, hi = utc_instant(s.first.start), utc_instant(s.due_last.end)
    starts = [r.period_start for r in s.open_rows]
    if s.last_done is not None:
        starts.append(s.last_done.period_start)
    finder = gaps.GapFinder(s.sched, s.shards, _Rows(conn, target, s.name),
                            [(r.period_start, r.period) for r in s.open_rows],
                            max(starts, default=None))
    if s.expected is None:  # cron: no count; walk the gaps between the done rows
        _walk_missing(s, finder, lo, hi)
        return
    present = s.done_due + sum(1 for r in s.open_rows if lo <= r.period_start < hi)
    missing = s.expected * s.shards - present
    if missing <= 0:
        return  # every due period has its rows: the common, cheap case
    s.no_row = missing
    s.no_row_listed = [(utc_instant(p.start), key) for p, key
                       in islice(finder.units(lo, hi, missing), LIST_LIMIT + 1)]
    s.no_row_last = next(((utc_instant(p.start), key) for p, key
                          in finder.units(lo, hi, missing, backwards=True)), None)


def _walk_missing(s: JobState, finder: gaps.GapFinder, lo: datetime, hi: datetime) -> None:
    """A cron job's missing units, counted by walking them (up to WALK_LIMIT)."""
    listed: list[Unit] = []
    for period, key in finder.units(lo, hi):
        s.no_row += 1
        s.no_row_last = (utc_instant(period.start), key)
        if len(listed) <= LIST_LIMIT:
            listed.append(s.no_row_last)
        if s.no_row >= WALK_LIMIT:
            s.no_row_at_least = True
            break
    s.no_row_listed = listed


@cache
def _split_counts() -> Executable:
    """Done rows of job in [a0, b0), ..., [a7, b7): one statement, built and compiled once."""
    when = runs.c.period_start.type
    return union_all(*[
        select(literal_column(str(i)).label("i"), func.count().label("n")).where(
            runs.c.job == bindparam("job"), runs.c.status == "done",
            runs.c.period_start >= bindparam(f"a{i}", type_=when),
            runs.c.period_start < bindparam(f"b{i}", type_=when))
        for i in range(gaps.SPLIT)])


class _Rows:
    """once.gaps.Rows for the reports: SQLAlchemy Core, inside the report's snapshot."""

    def __init__(self, conn: Connection, target: Target, job: str) -> None:
        self.conn, self.target, self.job = conn, target, job

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        params: dict[str, Any] = {"job": self.job}
        for i in range(gaps.SPLIT):
            a, b = stretches[i] if i < len(stretches) else (NEVER, NEVER)
            params[f"a{i}"], params[f"b{i}"] = bind(self.target, a), bind(self.target, b)
        done: dict[Any, Any] = dict(self.conn.execute(_split_counts(), params).all())
        return [int(done.get(i, 0)) for i in range(len(stretches))]

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        found: dict[datetime, set[str]] = {}
        for chunk in chunks([bind(self.target, x) for x in starts], 500):
            keys = select(runs.c.period_start, runs.c.period).where(
                runs.c.job == self.job, runs.c.period_start.in_(chunk))
            for at, key in self.conn.execute(keys):
                found.setdefault(from_db_time(at), set()).add(key)
        return found

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        in_range = and_(runs.c.job == self.job, runs.c.status == "done",
                        runs.c.period_start >= bind(self.target, lo),
                        runs.c.period_start < bind(self.target, hi))
        following = func.lead(runs.c.period_start, type_=runs.c.period_start.type).over(
            order_by=runs.c.period_start)
        rows = (select(runs.c.period_start.label("s"), runs.c.period_end.label("e"),
                       following.label("f"))
                .where(in_range).subquery())
        query = (select(rows.c.e, rows.c.f)
                 .where(or_(rows.c.f.is_(None), rows.c.f > rows.c.e))
                 .order_by(rows.c.s))
        first = self.conn.execute(select(func.min(runs.c.period_start)).where(in_range)).scalar()
        return (None if first is None else from_db_time(first),
                [(from_db_time(e), None if f is None else from_db_time(f))
                 for e, f in self.conn.execute(query)])

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        short = (select(runs.c.period_start)
                 .where(runs.c.job == self.job, runs.c.period_start >= bind(self.target, lo),
                        runs.c.period_start < bind(self.target, hi))
                 .group_by(runs.c.period_start).having(func.count() < shards))
        return [from_db_time(x) for x in self.conn.execute(short.limit(limit)).scalars()]


def timeline_cells(conn: Connection, target: Target, s: JobState,
                   last: int | None) -> list[tuple[Period, str]]:
    """The job's `last` latest periods (default_last when None), up to the one `once run`
    claims now, and their states, oldest first, as `once status --timeline` draws them:
    done, failed, missing, running, stale, pending (not due yet) or none (before the first)."""
    if s.sched is None or s.current is None:
        return []
    count = min(max(1, last or default_last(s)), MAX_LAST)
    periods = [s.current]
    first = utc_instant(s.first.start) if s.first is not None else NEVER
    while len(periods) < count and utc_instant(periods[-1].start) > first:
        periods.append(s.sched.previous(periods[-1]))  # not before the job's first period
    periods.reverse()
    query = select(runs.c.period, runs.c.status, runs.c.heartbeat_at,
                   runs.c.stale_after).where(
        runs.c.job == s.name,
        runs.c.period_start >= bind(target, periods[0].start),
        runs.c.period_start < bind(target, periods[-1].end))
    rows: dict[str, list[Any]] = {}
    for row in conn.execute(query):
        rows.setdefault(period_key(row.period), []).append(row)
    return [(p, period_state(s, p, rows.get(p.key, []))) for p in periods]

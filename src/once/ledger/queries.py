"""The reports' reads, by name: every statement `once status`, `check`, `history`, `logs`,
`metrics` and `once serve` send (SQLAlchemy Core over once.ledger.schema's tables).

Callers pass a connection and plain values and get rows or values back; they never build a
statement (as procrastinate's named queries). Rows keep the stored column names; times come
back as the driver hands them (once.ledger.from_db_time reads them).
Never on the hot path: this module imports SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.sql import Executable

from once.gaps import SPLIT
from once.ledger import schema as tables
from once.ledger.records import from_db_time, schema_missing
from once.ledger.url import Target

runs, attempts, jobs, meta = tables.runs, tables.attempts, tables.jobs, tables.meta

CHUNK = 200  # jobs per COUNT statement (SQLite allows 500 terms in a compound SELECT)
STATE_PERIOD = "(state)"  # the attempts' rows of `once state --set`: no attempt ran
LAST_LINE_SCAN = 2000  # how much of the end of a stored output is read to find its last line

# once_runs' columns, as once.report's RunRow reads them.
RUN_COLUMNS = (runs.c.job, runs.c.period, runs.c.status, runs.c.attempt, runs.c.fence,
               runs.c.owner, runs.c.period_start, runs.c.period_end, runs.c.started_at,
               runs.c.heartbeat_at, runs.c.finished_at, runs.c.exit_code,
               runs.c.stale_after)
_NEVER = datetime.min.replace(tzinfo=UTC)


def is_missing_table(target: Target, exc: BaseException) -> bool:
    """A read failed because the ledger's tables do not exist (nothing has run): `exc` is
    SQLAlchemy's error, its driver's error judged by once.ledger.records.schema_missing."""
    orig = getattr(exc, "orig", None)
    return orig is not None and schema_missing(target.dialect, orig, columns=False)


def bind(target: Target, instant: datetime) -> datetime:
    """An instant as the dialect's column type wants it bound: UTC, naive outside PostgreSQL."""
    at = instant.astimezone(UTC)
    return at if target.dialect == "postgresql" else at.replace(tzinfo=None)


def chunks(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    items = list(items)
    for i in range(0, len(items), size):
        yield items[i:i + size]


# -- the session -------------------------------------------------------------------------------


def schema_version(conn: Connection) -> int:
    """The ledger's schema version (0 when it has none yet)."""
    value = conn.execute(select(meta.c.value).where(meta.c.name == "schema_version")).scalar()
    return int(value or 0)


def db_now(conn: Connection, target: Target) -> datetime:
    """The database's clock, which wrote every heartbeat."""
    if target.dialect == "sqlite":
        now = conn.execute(select(func.strftime("%Y-%m-%d %H:%M:%f", "now"))).scalar_one()
        return datetime.fromisoformat(str(now)).replace(tzinfo=UTC)
    expr = func.clock_timestamp() if target.dialect == "postgresql" else func.utc_timestamp(6)
    return from_db_time(conn.execute(select(expr)).scalar_one())


def begin_read_only(conn: Connection, target: Target, timeout: float) -> None:
    """Make this transaction read-only (SQLite: the connection is; PostgreSQL: the
    postgresql_readonly option) and bound each statement on the server to `timeout`."""
    if target.dialect == "postgresql":
        conn.execute(text(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}"))
    elif target.dialect == "mysql":  # the driver's read timeout bounds each statement
        conn.exec_driver_sql("START TRANSACTION READ ONLY")


# -- jobs and their runs ---------------------------------------------------------------------


def job_rows(conn: Connection, names: Sequence[str] | None,
             namespace: str | None) -> list[Any]:
    """The once_jobs rows of the named jobs (all of them, or those of a namespace), by name."""
    query = select(jobs.c.job, jobs.c.kind, jobs.c.schedule, jobs.c.tz, jobs.c.lag,
                   jobs.c.max_attempts, jobs.c.stale_after, jobs.c.fires,
                   jobs.c.first_period_start, jobs.c.shards)
    if names:
        found: list[Any] = []
        for chunk in chunks(names, 500):
            found += conn.execute(query.where(jobs.c.job.in_(chunk))).all()
        return sorted(found, key=lambda r: r.job)
    if namespace:
        query = query.where(jobs.c.job.startswith(namespace + ":", autoescape=True))
    return sorted(conn.execute(query).all(), key=lambda r: r.job)


def done_counts(conn: Connection, target: Target,
                ranges: Sequence[tuple[str, datetime, datetime]]) -> list[int]:
    """The done rows of each (job, a, b) whose period starts in [a, b): one COUNT over an index
    range per job (once_runs_job_status_start), CHUNK jobs per statement."""
    counts = [0] * len(ranges)
    for offset in range(0, len(ranges), CHUNK):
        chunk = ranges[offset:offset + CHUNK]
        params: dict[str, Any] = {}
        for i, (job, a, b) in enumerate(chunk):
            params[f"j{i}"] = job
            params[f"a{i}"], params[f"b{i}"] = bind(target, a), bind(target, b)
        for i, n in conn.execute(_done_counts(len(chunk)), params).all():
            counts[offset + int(i)] = int(n)
    return counts


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


def open_rows(conn: Connection, names: Sequence[str]) -> Iterator[Any]:
    """The running and failed rows of the jobs, by job and period start (RUN_COLUMNS; index
    once_runs_job_status)."""
    for chunk in chunks(names, 500):
        query = select(*RUN_COLUMNS).where(runs.c.job.in_(chunk),
                                           runs.c.status.in_(("running", "failed")))
        yield from conn.execute(query.order_by(runs.c.job, runs.c.period_start))


def last_done_rows(conn: Connection, names: Sequence[str]) -> Iterator[Any]:
    """Each job's latest done row, by period start (RUN_COLUMNS): one index seek per job."""
    latest = runs.alias("latest")
    newest = (select(func.max(latest.c.period_start))
              .where(latest.c.job == jobs.c.job, latest.c.status == "done")
              .scalar_subquery())
    for chunk in chunks(names, 500):
        query = (select(*RUN_COLUMNS)
                 .select_from(jobs.join(runs, and_(runs.c.job == jobs.c.job,
                                                   runs.c.status == "done",
                                                   runs.c.period_start == newest)))
                 .where(jobs.c.job.in_(chunk)))
        yield from conn.execute(query)


def run_rows(conn: Connection, job: str, periods: Sequence[str]) -> Iterator[Any]:
    """The job's once_runs rows of these periods (RUN_COLUMNS)."""
    for chunk in chunks(sorted(periods), 500):
        yield from conn.execute(select(*RUN_COLUMNS).where(runs.c.job == job,
                                                           runs.c.period.in_(chunk)))


def timeline_rows(conn: Connection, target: Target, job: str, lo: datetime,
                  hi: datetime) -> Iterator[Any]:
    """(period, status, heartbeat_at, stale_after) of the job's rows starting in [lo, hi)."""
    query = select(runs.c.period, runs.c.status, runs.c.heartbeat_at,
                   runs.c.stale_after).where(
        runs.c.job == job, runs.c.period_start >= bind(target, lo),
        runs.c.period_start < bind(target, hi))
    yield from conn.execute(query)


# -- once.gaps.Rows: one job's rows, for the gap finder -------------------------------------


def split_done_counts(conn: Connection, target: Target, job: str,
                      stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
    """The job's done rows whose period starts in each [a, b) (at most SPLIT)."""
    params: dict[str, Any] = {"job": job}
    for i in range(SPLIT):
        a, b = stretches[i] if i < len(stretches) else (_NEVER, _NEVER)
        params[f"a{i}"], params[f"b{i}"] = bind(target, a), bind(target, b)
    done: dict[Any, Any] = dict(conn.execute(_split_counts(), params).all())
    return [int(done.get(i, 0)) for i in range(len(stretches))]


@cache
def _split_counts() -> Executable:
    """Done rows of job in [a0, b0), ..., [a7, b7): one statement, built and compiled once."""
    when = runs.c.period_start.type
    return union_all(*[
        select(literal_column(str(i)).label("i"), func.count().label("n")).where(
            runs.c.job == bindparam("job"), runs.c.status == "done",
            runs.c.period_start >= bindparam(f"a{i}", type_=when),
            runs.c.period_start < bindparam(f"b{i}", type_=when))
        for i in range(SPLIT)])


def keys_at(conn: Connection, target: Target, job: str,
            starts: Sequence[datetime]) -> dict[datetime, set[str]]:
    """The keys of the job's rows, whatever their status, by period start (UTC)."""
    found: dict[datetime, set[str]] = {}
    for chunk in chunks([bind(target, x) for x in starts], 500):
        keys = select(runs.c.period_start, runs.c.period).where(
            runs.c.job == job, runs.c.period_start.in_(chunk))
        for at, key in conn.execute(keys):
            found.setdefault(from_db_time(at), set()).add(key)
    return found


def done_breaks(conn: Connection, target: Target, job: str, lo: datetime,
                hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
    """Over the job's done rows starting in [lo, hi), in order: the first one's start, and
    (end, the next one's start or None) for each one not followed directly by another."""
    in_range = and_(runs.c.job == job, runs.c.status == "done",
                    runs.c.period_start >= bind(target, lo),
                    runs.c.period_start < bind(target, hi))
    following = func.lead(runs.c.period_start, type_=runs.c.period_start.type).over(
        order_by=runs.c.period_start)
    rows = (select(runs.c.period_start.label("s"), runs.c.period_end.label("e"),
                   following.label("f"))
            .where(in_range).subquery())
    query = (select(rows.c.e, rows.c.f)
             .where(or_(rows.c.f.is_(None), rows.c.f > rows.c.e))
             .order_by(rows.c.s))
    first = conn.execute(select(func.min(runs.c.period_start)).where(in_range)).scalar()
    return (None if first is None else from_db_time(first),
            [(from_db_time(e), None if f is None else from_db_time(f))
             for e, f in conn.execute(query)])


def short_starts(conn: Connection, target: Target, job: str, lo: datetime, hi: datetime,
                 shards: int, limit: int) -> list[datetime]:
    """Period starts in [lo, hi) with rows of the job, but fewer than shards (at most limit)."""
    short = (select(runs.c.period_start)
             .where(runs.c.job == job, runs.c.period_start >= bind(target, lo),
                    runs.c.period_start < bind(target, hi))
             .group_by(runs.c.period_start).having(func.count() < shards))
    return [from_db_time(x) for x in conn.execute(short.limit(limit)).scalars()]


# -- attempts --------------------------------------------------------------------------------


def _output_end(conn: Connection) -> Any:
    """The last LAST_LINE_SCAN characters of once_attempts.output (up to 1 MiB: the reports
    never fetch it whole)."""
    if conn.dialect.name == "sqlite":
        return func.substr(attempts.c.output, -LAST_LINE_SCAN)
    return func.right(attempts.c.output, LAST_LINE_SCAN)


def failure_output_ends(conn: Connection,
                        keys: Sequence[tuple[str, str, int]]) -> Iterator[Any]:
    """(job, period, attempt, output_end) of these attempts: primary-key lookups."""
    for chunk in chunks(keys, 100):
        match = or_(*(and_(attempts.c.job == job, attempts.c.period == period,
                           attempts.c.attempt == attempt) for job, period, attempt in chunk))
        yield from conn.execute(select(attempts.c.job, attempts.c.period, attempts.c.attempt,
                                       _output_end(conn).label("output_end")).where(match))


def attempt_rows(conn: Connection, job: str, limit: int, period: str | None = None,
                 attempt: int | None = None, output: bool = False,
                 runs_only: bool = False) -> list[Any]:
    """The job's latest attempts, newest first: every column of once_attempts, the output's
    end as output_end and, with output, the whole output; runs_only leaves out the records of
    `once state --set`."""
    columns = [*(c for c in attempts.c if c.name != "output"),
               _output_end(conn).label("output_end")]
    query = select(*columns, *([attempts.c.output] if output else []))
    query = query.where(*_attempts_of(job, runs_only))
    if period is not None:
        query = query.where(attempts.c.period == period)
    if attempt is not None:
        query = query.where(attempts.c.attempt == attempt)
    query = query.order_by(attempts.c.started_at.desc(), attempts.c.attempt.desc())
    return list(conn.execute(query.limit(limit)).all())


def latest_attempt_period(conn: Connection, job: str) -> str | None:
    """The period of the job's latest attempt (not a `once state --set` record)."""
    return conn.execute(select(attempts.c.period).where(*_attempts_of(job, True))
                        .order_by(attempts.c.started_at.desc(), attempts.c.attempt.desc())
                        .limit(1)).scalar()


def _attempts_of(job: str, runs_only: bool) -> tuple[Any, ...]:
    if runs_only:
        return attempts.c.job == job, attempts.c.period != STATE_PERIOD
    return (attempts.c.job == job,)


def attempt_counts(conn: Connection, names: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """(job, status, attempts, later attempts that were no rerun, reruns) of the jobs'
    attempts, by job and status (not `once state --set` records: they ran nothing)."""
    later = func.sum(case((and_(attempts.c.attempt > 1, attempts.c.reason.is_(None)), 1),
                          else_=0))
    reruns = func.sum(case((attempts.c.reason.is_not(None), 1), else_=0))
    for chunk in chunks(names, 500):
        query = (select(attempts.c.job, attempts.c.status, func.count(), later, reruns)
                 .where(*_in_attempts(chunk))
                 .group_by(attempts.c.job, attempts.c.status))
        yield from (tuple(row) for row in conn.execute(query))


def _in_attempts(names: Sequence[str]) -> tuple[Any, ...]:
    return attempts.c.job.in_(names), attempts.c.period != STATE_PERIOD

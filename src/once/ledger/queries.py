"""The reports' reads that go through SQLAlchemy, by name: what `once history`, `logs`,
`metrics` and `once serve` send beyond the survey (SQLAlchemy Core over once.ledger.schema's
tables). `once status` and `check`, and the survey everywhere, read through once.ledger.reads.

Callers pass a connection and plain values and get rows or values back; they never build a
statement (as procrastinate's named queries). Rows keep the stored column names; times come
back as the driver hands them (once.ledger.from_db_time reads them).
Never on the hot path: this module imports SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    case,
    func,
    select,
    text,
)

from once.ledger import schema as tables
from once.ledger.reads import chunks
from once.ledger.records import from_db_time, schema_missing
from once.ledger.url import Target

runs, attempts, jobs, meta = tables.runs, tables.attempts, tables.jobs, tables.meta

STATE_PERIOD = "(state)"  # the attempts' rows of `once state --set`: no attempt ran
LAST_LINE_SCAN = 2000  # how much of the end of a stored output is read to find its last line

# once_runs' columns, as once.report's RunRow reads them.
RUN_COLUMNS = (runs.c.job, runs.c.period, runs.c.status, runs.c.attempt, runs.c.fence,
               runs.c.owner, runs.c.period_start, runs.c.period_end, runs.c.started_at,
               runs.c.heartbeat_at, runs.c.finished_at, runs.c.exit_code,
               runs.c.stale_after)


def is_missing_table(target: Target, exc: BaseException) -> bool:
    """A read failed because the ledger's tables do not exist (nothing has run): `exc` is
    SQLAlchemy's error, its driver's error judged by once.ledger.records.schema_missing."""
    orig = getattr(exc, "orig", None)
    return orig is not None and schema_missing(target.dialect, orig, columns=False)


def bind(target: Target, instant: datetime) -> datetime:
    """An instant as the dialect's column type wants it bound: UTC, naive outside PostgreSQL."""
    at = instant.astimezone(UTC)
    return at if target.dialect == "postgresql" else at.replace(tzinfo=None)


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


def run_rows(conn: Connection, job: str, periods: Sequence[str]) -> Iterator[Any]:
    """The job's once_runs rows of these periods (RUN_COLUMNS)."""
    for chunk in chunks(sorted(periods), 500):
        yield from conn.execute(select(*RUN_COLUMNS).where(runs.c.job == job,
                                                           runs.c.period.in_(chunk)))


# -- once.gaps.Rows: one job's rows, for the gap finder -------------------------------------


# -- attempts --------------------------------------------------------------------------------


def _output_end(conn: Connection) -> Any:
    """The last LAST_LINE_SCAN characters of once_attempts.output (up to 1 MiB: the reports
    never fetch it whole)."""
    if conn.dialect.name == "sqlite":
        return func.substr(attempts.c.output, -LAST_LINE_SCAN)
    return func.right(attempts.c.output, LAST_LINE_SCAN)


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

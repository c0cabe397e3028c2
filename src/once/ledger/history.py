"""What the reports read of the attempts, by name: one job's schedule, attempts and the run
rows that hold them (`once history JOB`, `once logs`, once serve's job and log pages), every
job's latest attempts (`once history`), in SQLAlchemy Core over once.ledger.tables.
What the survey reads across jobs is once.ledger.fleet's (`once metrics`' counts too).

Callers pass a connection and plain values and get rows or values back; they never build a
statement (as procrastinate's named queries). Job and run rows are once.ledger.rows' records;
attempt rows keep the stored column names, their times as the driver hands them
(once.ledger.from_db_time reads them). Never on the hot path: this module imports SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import (
    ColumnClause,
    ColumnElement,
    Connection,
    func,
    literal_column,
    select,
)

from once.ledger import tables
from once.ledger.dialects import of_sqlalchemy
from once.ledger.engines import bind
from once.ledger.records import from_db_time
from once.ledger.rows import (
    JOB_COLUMNS,
    LAST_LINE_SCAN,
    RUN_COLUMNS,
    STATE_PERIOD,
    JobRow,
    RunRow,
    chunks,
)
from once.ledger.url import Target

if TYPE_CHECKING:
    from sqlalchemy import Row

runs, attempts, jobs = tables.runs, tables.attempts, tables.jobs
# An attempt as its reads return it: once_attempts' columns by name, and output_end.
AttemptRow: TypeAlias = "Row[*tuple[Any, ...]]"


# -- jobs and their runs ---------------------------------------------------------------------


def job_rows(conn: Connection, names: Sequence[str] | None,
             namespace: str | None) -> list[JobRow]:
    """The once_jobs rows of the named jobs (all of them, or those of a namespace), by name."""
    query = select(*(jobs.c[name] for name in JOB_COLUMNS))
    found: list[Row[*tuple[Any, ...]]] = []  # once_jobs' JOB_COLUMNS
    if names:
        for chunk in chunks(names, 500):
            found += conn.execute(query.where(jobs.c.job.in_(chunk))).all()
    else:
        if namespace:
            query = query.where(jobs.c.job.startswith(namespace + ":", autoescape=True))
        found = list(conn.execute(query).all())
    return sorted((JobRow.read(r, from_db_time) for r in found), key=lambda r: r.job)


def run_rows(conn: Connection, job: str, periods: Sequence[str]) -> Iterator[RunRow]:
    """The job's once_runs rows of these periods."""
    columns = [runs.c[name] for name in RUN_COLUMNS]
    for chunk in chunks(sorted(periods), 500):
        for row in conn.execute(select(*columns).where(runs.c.job == job,
                                                       runs.c.period.in_(chunk))):
            yield RunRow.read(row, from_db_time)


# -- attempts --------------------------------------------------------------------------------


def _output_end(conn: Connection) -> ColumnClause[Any]:
    """The last LAST_LINE_SCAN characters of once_attempts.output (up to 1 MiB: the reports
    never fetch it whole), as the connection's dialect writes it."""
    backend = of_sqlalchemy(conn.dialect.name)
    return literal_column(backend.output_end(attempts.c.output.name, LAST_LINE_SCAN))


def attempt_rows(conn: Connection, job: str, limit: int, period: str | None = None,
                 attempt: int | None = None, output: bool = False,
                 runs_only: bool = False) -> list[AttemptRow]:
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


def latest_attempts(conn: Connection, target: Target, limit: int,
                    namespace: str | None) -> list[AttemptRow]:
    """The `limit` latest attempts of every job (of the namespace), newest first, as
    attempt_rows gives them (not `once state --set` records).

    Without an index on started_at alone: each job's latest start is one seek of
    once_attempts_job_started; the `limit` latest attempts all started at or after the
    `limit`-th latest of those (at least `limit` attempts did), so only the jobs whose latest
    start is that late are read, each from that instant on, through the same index."""
    latest = (select(func.max(attempts.c.started_at))
              .where(attempts.c.job == jobs.c.job, attempts.c.period != STATE_PERIOD)
              .scalar_subquery())
    query = select(jobs.c.job, latest.label("latest"))
    if namespace:
        query = query.where(jobs.c.job.startswith(namespace + ":", autoescape=True))
    starts = [(from_db_time(at), job) for job, at in conn.execute(query) if at is not None]
    if not starts:
        return []
    floor = sorted(starts, reverse=True)[:limit][-1][0]
    names = sorted(job for at, job in starts if at >= floor)
    columns = [*(c for c in attempts.c if c.name != "output"),
               _output_end(conn).label("output_end")]
    found: list[AttemptRow] = []
    for chunk in chunks(names, 500):
        found += conn.execute(
            select(*columns).where(attempts.c.job.in_(chunk), attempts.c.period != STATE_PERIOD,
                                   attempts.c.started_at >= bind(target, floor))
            .order_by(attempts.c.started_at.desc(), attempts.c.attempt.desc())
            .limit(limit)).all()
    found.sort(key=lambda r: (from_db_time(r.started_at), r.attempt), reverse=True)
    return found[:limit]


def latest_attempt_period(conn: Connection, job: str) -> str | None:
    """The period of the job's latest attempt (not a `once state --set` record)."""
    return conn.execute(select(attempts.c.period).where(*_attempts_of(job, True))
                        .order_by(attempts.c.started_at.desc(), attempts.c.attempt.desc())
                        .limit(1)).scalar()


def _attempts_of(job: str, runs_only: bool) -> tuple[ColumnElement[bool], ...]:
    if runs_only:
        return attempts.c.job == job, attempts.c.period != STATE_PERIOD
    return (attempts.c.job == job,)

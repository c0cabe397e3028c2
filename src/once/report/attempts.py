"""The attempts of a job (once_attempts) as the reports read them: `once history`'s entries,
the once_runs rows that tell a live attempt from an abandoned one, and the counts `once
metrics` exposes (SQLAlchemy Core, on a connection of once.report.snapshot).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from sqlalchemy import Connection, and_, case, func, select

from once.ledger import Target
from once.ledger import schema as tables
from once.periods import SpecError, zone
from once.report.model import STATE_PERIOD, AttemptCounts, RunRow, attempt_entry
from once.report.snapshot import db_now
from once.report.survey import RUN_COLUMNS, chunks, output_end, select_jobs

runs, attempts = tables.runs, tables.attempts


def attempt_entries(conn: Connection, target: Target, stored_job: str, limit: int,
                    period: str | None = None) -> tuple[str, list[dict[str, Any]]] | None:
    """The job's zone and its latest attempts, newest first, as `once history --json` shows
    them; None when the job has never run."""
    now = db_now(conn, target)
    job_rows = select_jobs(conn, [stored_job], None)
    if not job_rows:
        return None
    job = job_rows[0]
    query = select(*attempt_columns(conn)).where(attempts.c.job == stored_job)
    if period is not None:
        query = query.where(attempts.c.period == period)
    query = query.order_by(attempts.c.started_at.desc(), attempts.c.attempt.desc())
    rows = conn.execute(query.limit(limit)).all()
    found = holders(conn, stored_job, {r.period for r in rows})
    tz = job_zone(job.tz)
    return job.tz, [attempt_entry(r, found.get(r.period), now, tz) for r in rows]


def job_zone(name: str) -> Any:
    """The zone a job's times are shown in: its own, or UTC when this once cannot load it."""
    try:
        return zone(name)
    except SpecError:
        return UTC


def attempt_columns(conn: Connection) -> list[Any]:
    """once_attempts' columns as the history reads them: of the output, only its end."""
    return [*(c for c in attempts.c if c.name != "output"),
            output_end(conn).label("output_end")]


def holders(conn: Connection, job: str, periods: set[str]) -> dict[str, RunRow]:
    """The once_runs rows of the periods shown, to tell a live attempt from an abandoned one."""
    found: dict[str, RunRow] = {}
    for chunk in chunks(sorted(periods), 500):
        query = select(*RUN_COLUMNS).where(runs.c.job == job, runs.c.period.in_(chunk))
        for row in conn.execute(query):
            found[row.period] = RunRow.of(row)
    return found


def attempt_counts(conn: Connection, names: list[str]) -> dict[str, AttemptCounts]:
    """Per job, from once_attempts: attempts by status, takeovers and reruns."""
    found: dict[str, AttemptCounts] = {n: AttemptCounts() for n in names}
    later = func.sum(case((and_(attempts.c.attempt > 1, attempts.c.reason.is_(None)), 1),
                          else_=0))
    reruns = func.sum(case((attempts.c.reason.is_not(None), 1), else_=0))
    for chunk in chunks(names, 500):
        query = (select(attempts.c.job, attempts.c.status, func.count(), later, reruns)
                 .where(attempts.c.job.in_(chunk),
                        attempts.c.period != STATE_PERIOD)  # `state --set` ran nothing
                 .group_by(attempts.c.job, attempts.c.status))
        for job, status_, n, n_later, n_reruns in conn.execute(query):
            counts = found[job]
            counts.by_status[status_] = counts.by_status.get(status_, 0) + int(n)
            counts.later += int(n_later or 0)
            counts.reruns += int(n_reruns or 0)
    return found

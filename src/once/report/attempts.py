"""The attempts of a job (once_attempts) as the reports read them: `once history`'s entries,
the once_runs rows that tell a live attempt from an abandoned one, and the counts `once
metrics` exposes (through once.ledger.queries, on a connection of once.report.snapshot).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any

from once.ledger import Target
from once.periods import SpecError, zone
from once.report.model import AttemptCounts, RunRow, attempt_entry

if TYPE_CHECKING:
    from sqlalchemy import Connection


def attempt_entries(conn: Connection, target: Target, stored_job: str, limit: int,
                    period: str | None = None) -> tuple[str, list[dict[str, Any]]] | None:
    """The job's zone and its latest attempts, newest first, as `once history --json` shows
    them; None when the job has never run."""
    from once.ledger import queries  # SQLAlchemy: imported by the reports that need it

    now = queries.db_now(conn, target)
    job_rows = queries.job_rows(conn, [stored_job], None)
    if not job_rows:
        return None
    job = job_rows[0]
    rows = queries.attempt_rows(conn, stored_job, limit, period)
    found = holders(conn, stored_job, {r.period for r in rows})
    tz = job_zone(job.tz)
    return job.tz, [attempt_entry(r, found.get(r.period), now, tz) for r in rows]


def job_zone(name: str) -> Any:
    """The zone a job's times are shown in: its own, or UTC when this once cannot load it."""
    try:
        return zone(name)
    except SpecError:
        return UTC


def holders(conn: Connection, job: str, periods: set[str]) -> dict[str, RunRow]:
    """The once_runs rows of the periods shown, to tell a live attempt from an abandoned one."""
    from once.ledger import queries  # SQLAlchemy: imported by the reports that need it

    return {row.period: RunRow.of(row) for row in queries.run_rows(conn, job, list(periods))}


def attempt_counts(conn: Connection, names: Sequence[str]) -> dict[str, AttemptCounts]:
    """Per job, from once_attempts: attempts by status, takeovers and reruns."""
    from once.ledger import queries  # SQLAlchemy: imported by the reports that need it

    found: dict[str, AttemptCounts] = {n: AttemptCounts() for n in names}
    for job, status_, n, n_later, n_reruns in queries.attempt_counts(conn, names):
        counts = found[job]
        counts.by_status[status_] = counts.by_status.get(status_, 0) + int(n)
        counts.later += int(n_later or 0)
        counts.reruns += int(n_reruns or 0)
    return found

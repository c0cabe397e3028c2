"""The attempts of a job (once_attempts) as the reports read them: `once history`'s entries
and the once_runs rows that tell a live attempt from an abandoned one (through
once.ledger.history, on a connection of once.report.snapshot), and the counts `once metrics`
exposes (once.ledger.fleet, on the survey's snapshot).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, tzinfo
from typing import TYPE_CHECKING, Any

from once import stored
from once.ledger import Target
from once.ledger.rows import JobRow, RunRow
from once.periods import SpecError, zone
from once.report.model import AttemptCounts, attempt_entry

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from once.ledger.fleet import Snapshot
    from once.ledger.history import AttemptRow


def attempt_entries(conn: Connection, target: Target, stored_job: str, limit: int,
                    period: str | None = None) -> tuple[str, list[dict[str, Any]]] | None:
    """The job's zone and its latest attempts (of --period: see period_keys), newest first,
    as `once history --json` shows them; None when the job has never run."""
    from once.ledger import engines, history  # SQLAlchemy: imported by the reports that need it

    now = engines.db_now(conn, target)
    job_rows = history.job_rows(conn, [stored_job], None)
    if not job_rows:
        return None
    job = job_rows[0]
    rows: list[AttemptRow] = []
    for key in period_keys(job, period) if period is not None else [None]:
        rows = rows or history.attempt_rows(conn, stored_job, limit, key)
    found = holders(conn, stored_job, {r.period for r in rows})
    tz = job_zone(job.tz)
    return job.tz, [attempt_entry(r, found.get(r.period), now, tz) for r in rows]


def period_keys(job: JobRow, given: str) -> list[str]:
    """The row keys a --period names (once logs, once history), to try in turn: the key of the
    period of the job's schedule that the text names, as `once catchup --since` reads it (a
    key, a date, an instant: `2026-12-01T10:00Z`, with seconds or another offset), `#i` for
    a shard kept; then the text as it is (a key of the job's schedule before a change)."""
    base, sharp, shard = given.partition("#")
    try:
        sched = stored.job_schedule(job.kind, job.schedule, job.tz)
        key = sched.resolve(base).key + sharp + shard
    except (SpecError, ValueError, OverflowError):
        return [given]
    return [key] if key == given else [key, given]


def fleet_entries(conn: Connection, target: Target, limit: int,
                  namespace: str | None) -> list[dict[str, Any]]:
    """The latest attempts of every job (of the namespace), newest first, as `once history
    --json` shows them, each in its own job's zone."""
    from once.ledger import engines, history  # SQLAlchemy: imported by the reports that need it

    now = engines.db_now(conn, target)
    rows = history.latest_attempts(conn, target, limit, namespace)
    names = sorted({r.job for r in rows})
    zones = {j.job: job_zone(j.tz) for j in history.job_rows(conn, names, None)} if names else {}
    found = {job: holders(conn, job, {r.period for r in rows if r.job == job}) for job in names}
    return [attempt_entry(r, found[r.job].get(r.period), now, zones.get(r.job, UTC))
            for r in rows]


def job_zone(name: str) -> tzinfo:
    """The zone a job's times are shown in: its own, or UTC when this once cannot load it."""
    try:
        return zone(name)
    except SpecError:
        return UTC


def holders(conn: Connection, job: str, periods: set[str]) -> dict[str, RunRow]:
    """The once_runs rows of the periods shown, to tell a live attempt from an abandoned one."""
    from once.ledger import history  # SQLAlchemy: imported by the reports that need it

    return {row.period: row for row in history.run_rows(conn, job, list(periods))}


def attempt_counts(snap: Snapshot, names: Sequence[str]) -> dict[str, AttemptCounts]:
    """Per job, from once_attempts: attempts by status, takeovers, reruns, interruptions
    (once.ledger.fleet's attempt_tallies, on the survey's snapshot)."""
    found: dict[str, AttemptCounts] = {n: AttemptCounts() for n in names}
    for job, status_, n, n_later, n_reruns, n_interrupted in snap.attempt_tallies(names):
        counts = found[job]
        counts.by_status[status_] = counts.by_status.get(status_, 0) + int(n)
        counts.later += int(n_later or 0)
        counts.reruns += int(n_reruns or 0)
        counts.interrupted += int(n_interrupted or 0)
    return found

"""`once prune`: forget old history, keep what correctness needs.

Deleted: attempts (once_attempts) that finished before the cut-off, and `done` rows of
once_runs that finished before it. Kept, always: every `running` row, every `failed` row
(a failed-out period still needs a rerun or a look), and the latest done row of each job,
which catch-up resumes from. Each job's expected range (once_jobs.first_period_start) moves
up to the oldest row it still has, so that reports do not call the pruned periods missing.
Jobs that have not fired for longer than the cut-off are listed (renamed or retired jobs);
they are not deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, and_, delete, func, select, update

from once.ledger import Target
from once.schema import attempts, engine, jobs, runs


@dataclass
class Pruned:
    runs: int = 0
    attempts: int = 0
    idle_jobs: list[tuple[str, datetime]] = field(default_factory=list)


def prune(target: Target, older_than: float, dry_run: bool = False,
          now: datetime | None = None) -> Pruned:
    """Delete (or with dry_run, count) what finished more than older_than seconds ago."""
    cut = (now or datetime.now(UTC)) - timedelta(seconds=older_than)
    eng = engine(target)
    try:
        with eng.begin() as conn:
            result = Pruned(idle_jobs=_idle_jobs(conn, cut))
            for job, latest_done in _latest_done(conn).items():
                result.runs += _prune_runs(conn, job, latest_done, cut, dry_run)
            result.attempts = _prune_attempts(conn, cut, dry_run)
            if not dry_run:
                _move_expected_ranges(conn)
            return result
    finally:
        eng.dispose()


def _latest_done(conn: Connection) -> dict[str, datetime]:
    rows = conn.execute(select(runs.c.job, func.max(runs.c.period_start))
                        .where(runs.c.status == "done").group_by(runs.c.job))
    return {job: latest for job, latest in rows}


def _prune_runs(conn: Connection, job: str, latest_done: datetime, cut: datetime,
                dry_run: bool) -> int:
    old = and_(runs.c.job == job, runs.c.status == "done", runs.c.finished_at < cut,
               runs.c.period_start < latest_done)
    if dry_run:
        return int(conn.execute(select(func.count()).select_from(runs).where(old)).scalar_one())
    return int(conn.execute(delete(runs).where(old)).rowcount)


def _prune_attempts(conn: Connection, cut: datetime, dry_run: bool) -> int:
    old = and_(attempts.c.finished_at.is_not(None), attempts.c.finished_at < cut)
    if dry_run:
        return int(conn.execute(select(func.count()).select_from(attempts).where(old))
                   .scalar_one())
    return int(conn.execute(delete(attempts).where(old)).rowcount)


def _move_expected_ranges(conn: Connection) -> None:
    for job, oldest in conn.execute(select(runs.c.job, func.min(runs.c.period_start))
                                    .group_by(runs.c.job)):
        conn.execute(update(jobs).where(jobs.c.job == job,
                                        jobs.c.first_period_start < oldest)
                     .values(first_period_start=oldest))


def _idle_jobs(conn: Connection, cut: datetime) -> list[tuple[str, datetime]]:
    rows = conn.execute(select(jobs.c.job, jobs.c.last_fire_at)
                        .where(jobs.c.last_fire_at < cut).order_by(jobs.c.job))
    return [(job, at if at.tzinfo else at.replace(tzinfo=UTC)) for job, at in rows]

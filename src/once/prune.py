"""`once prune`: forget old history, keep what correctness needs.

Deleted: attempts (once_attempts) that finished before the cut-off, and `done` rows of
once_runs that finished before it. Kept, always: every `running` row, every `failed` row
(a failed-out period still needs a rerun or a look), and the latest done row of each job,
which catch-up resumes from. Each job's expected range (once_jobs.first_period_start) moves
up to the oldest row it still has, so that reports do not call the pruned periods missing.
Jobs that have not fired for longer than the cut-off are listed (renamed or retired jobs);
they are not deleted.

The ledger stays claimable: an attempt goes with the run row it belongs to, finished or not
(an attempt that was taken over never finishes), since the next claim of a pruned period
starts again at attempt 1 and would collide with any attempt row left behind. A ledger
without tables (or a SQLite file that does not exist) has nothing to prune and is not
created; a ledger that cannot be reached is a LedgerError (exit 75).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    delete,
    exists,
    func,
    inspect,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from once.ledger import LedgerError, Target, describe
from once.schema import attempts, engine, jobs, runs

STATE_ROWS = "(state)"  # once_attempts' record of `once state --set`: no run row of its own


@dataclass
class Pruned:
    runs: int = 0
    attempts: int = 0
    idle_jobs: list[tuple[str, datetime]] = field(default_factory=list)
    no_tables: bool = False  # nothing has run in this ledger: nothing to prune


def prune(target: Target, older_than: float, dry_run: bool = False,
          now: datetime | None = None) -> Pruned:
    """Delete (or with dry_run, count) what finished more than older_than seconds ago."""
    cut = (now or datetime.now(UTC)) - timedelta(seconds=older_than)
    if target.dialect == "sqlite" and not os.path.exists(target.path):
        return Pruned(no_tables=True)  # connecting would leave an empty file behind
    try:
        eng = engine(target)
        try:
            with eng.begin() as conn:
                if not inspect(conn).has_table(runs.name):
                    return Pruned(no_tables=True)
                return _prune(conn, cut, dry_run)
        finally:
            eng.dispose()
    except SQLAlchemyError as exc:
        raise LedgerError(f"cannot prune the ledger {target.redacted}: "
                          f"{describe(getattr(exc, 'orig', None) or exc)}") from exc


def _prune(conn: Connection, cut: datetime, dry_run: bool) -> Pruned:
    result = Pruned(idle_jobs=_idle_jobs(conn, cut))
    # Attempts first: which ones go depends on the run rows that are about to go.
    result.attempts = _prune_attempts(conn, cut, dry_run)
    for job, latest_done in _latest_done(conn).items():
        result.runs += _prune_runs(conn, job, latest_done, cut, dry_run)
    if not dry_run:
        _move_expected_ranges(conn)
    return result


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


def _run_row_goes(cut: datetime) -> ColumnElement[bool]:
    """What _prune_runs deletes, as one condition on a once_runs row."""
    other = runs.alias("latest")
    latest_done = (select(func.max(other.c.period_start))
                   .where(other.c.job == runs.c.job, other.c.status == "done")
                   .scalar_subquery())
    return and_(runs.c.status == "done", runs.c.finished_at < cut,
                runs.c.period_start < latest_done)


def _prune_attempts(conn: Connection, cut: datetime, dry_run: bool) -> int:
    """Attempts that finished before the cut, and every attempt whose run row goes (or is
    gone already: an earlier prune left it behind)."""
    kept_row = exists().where(runs.c.job == attempts.c.job, runs.c.period == attempts.c.period,
                              not_(_run_row_goes(cut)))
    old = or_(and_(attempts.c.finished_at.is_not(None), attempts.c.finished_at < cut),
              and_(attempts.c.period != STATE_ROWS, not_(kept_row)))
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

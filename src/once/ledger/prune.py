"""`once prune`: forget old history, keep what correctness needs.

Deleted: attempts (once_attempts) that finished before the cut-off, and `done` rows of
once_runs that finished before it and whose period lies before everything catch-up and the
reports still need. Kept, always: every `running` and `failed` row (a failed-out period still
needs a rerun or a look), every done row from the job's oldest running or failed row, or its
oldest due period without a row, on (the gap finder counts those done rows to know which
periods in between are done), and the latest done row of each job. Each job's expected range
(once_jobs.first_period_start) moves up to the oldest row it still has, or to its oldest gap
when that comes first, so that reports do not call the pruned periods missing and still call
the gaps missing. Jobs that have not fired for longer than the cut-off are listed (renamed or
retired jobs); they are not deleted.

The ledger stays claimable: an attempt goes with the run row it belongs to, finished or not
(an attempt that was taken over never finishes), since the next claim of a pruned period
starts again at attempt 1 and would collide with any attempt row left behind. A ledger
without tables (or a SQLite file that does not exist) has nothing to prune and is not
created; a ledger that cannot be reached is a LedgerError (exit 75).

Imports SQLAlchemy and once.ledger.schema (never on the hot path). Which periods are gaps is
the reports' rule, not the ledger's: the caller hands it in (`oldest_gaps`, in `once prune`
once.report.oldest_gaps), so that the ledger package never imports the reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    delete,
    exists,
    false,
    func,
    inspect,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from once.ledger import LedgerError, Target, describe, from_db_time, queries
from once.ledger.queries import bind
from once.ledger.reads import Snapshot
from once.ledger.schema import attempts, engine, jobs, runs

# once_attempts' record of `once state --set`: no run row of its own
STATE_ROWS = queries.STATE_PERIOD

# (a snapshot, job names) -> per job with a due period without a row, where the oldest such
# period starts
OldestGaps = Callable[[Snapshot, list[str]], dict[str, datetime]]


@dataclass
class Pruned:
    runs: int = 0
    attempts: int = 0
    idle_jobs: list[tuple[str, datetime]] = field(default_factory=list)
    no_tables: bool = False  # nothing has run in this ledger: nothing to prune


def prune(target: Target, older_than: float, oldest_gaps: OldestGaps, dry_run: bool = False,
          now: datetime | None = None) -> Pruned:
    """Delete (or with dry_run, count) what finished more than older_than seconds ago."""
    cut = (now or datetime.now(UTC)) - timedelta(seconds=older_than)
    if target.dialect == "sqlite" and not os.path.exists(target.path):
        return Pruned(no_tables=True)  # connecting would leave an empty file behind
    connected = False
    try:
        eng = engine(target)
        try:
            with eng.begin() as conn:
                connected = True
                if not inspect(conn).has_table(runs.name):
                    return Pruned(no_tables=True)
                return _prune(conn, target, cut, dry_run, oldest_gaps)
        finally:
            eng.dispose()
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if connected:
            raise
        raise LedgerError(f"cannot prune the ledger {target.redacted}: {describe(exc)}") from exc
    except SQLAlchemyError as exc:
        raise LedgerError(f"cannot prune the ledger {target.redacted}: "
                          f"{describe(getattr(exc, 'orig', None) or exc)}") from exc


def _prune(conn: Connection, target: Target, cut: datetime, dry_run: bool,
           oldest_gaps: OldestGaps) -> Pruned:
    result = Pruned(idle_jobs=_idle_jobs(conn, cut))
    keep, gap = _needed(conn, target, oldest_gaps)
    jobs_with_attempts = set(conn.execute(select(attempts.c.job).distinct()).scalars())
    for job in sorted(set(keep) | jobs_with_attempts):
        goes = _run_row_goes(target, job, keep.get(job), cut)
        # Attempts first: which ones go depends on the run rows that are about to go.
        result.attempts += _prune_attempts(conn, job, goes, cut, dry_run)
        result.runs += _prune_runs(conn, job, goes, dry_run)
    if not dry_run:
        _move_expected_ranges(conn, target, gap)
    return result


def _needed(conn: Connection, target: Target,
            oldest_gaps: OldestGaps) -> tuple[dict[str, datetime], dict[str, datetime]]:
    """Per job that has a done row: the period start from which every row stays (its latest
    done row, its oldest running or failed row, its oldest due period without a row: the
    earliest); and per job with such a gap, where the gap starts."""
    keep: dict[str, datetime] = {}
    for job, latest in conn.execute(select(runs.c.job, func.max(runs.c.period_start))
                                    .where(runs.c.status == "done").group_by(runs.c.job)):
        keep[job] = from_db_time(latest)
    for job, oldest in conn.execute(select(runs.c.job, func.min(runs.c.period_start))
                                    .where(runs.c.status.in_(("running", "failed")))
                                    .group_by(runs.c.job)):
        if job in keep:
            keep[job] = min(keep[job], from_db_time(oldest))
    gap = oldest_gaps(Snapshot.over(conn, target), list(keep))
    for job, start in gap.items():
        keep[job] = min(keep[job], start)
    return keep, gap


def _run_row_goes(target: Target, job: str, keep_from: datetime | None,
                  cut: datetime) -> ColumnElement[bool]:
    """What _prune_runs deletes of a job, as one condition on a once_runs row."""
    if keep_from is None:  # no done row: nothing goes
        return false()
    return and_(runs.c.job == job, runs.c.status == "done", runs.c.finished_at < cut,
                runs.c.period_start < bind(target, keep_from))


def _prune_runs(conn: Connection, job: str, goes: ColumnElement[bool], dry_run: bool) -> int:
    if dry_run:
        return int(conn.execute(select(func.count()).select_from(runs).where(goes))
                   .scalar_one())
    return int(conn.execute(delete(runs).where(goes)).rowcount)


def _prune_attempts(conn: Connection, job: str, goes: ColumnElement[bool], cut: datetime,
                    dry_run: bool) -> int:
    """The job's attempts that finished before the cut, and every one whose run row goes (or
    is gone already: an earlier prune left it behind)."""
    kept_row = exists().where(runs.c.job == attempts.c.job, runs.c.period == attempts.c.period,
                              not_(goes))
    old = and_(attempts.c.job == job,
               or_(and_(attempts.c.finished_at.is_not(None), attempts.c.finished_at < cut),
                   and_(attempts.c.period != STATE_ROWS, not_(kept_row))))
    if dry_run:
        return int(conn.execute(select(func.count()).select_from(attempts).where(old))
                   .scalar_one())
    return int(conn.execute(delete(attempts).where(old)).rowcount)


def _move_expected_ranges(conn: Connection, target: Target,
                          gap: dict[str, datetime]) -> None:
    for job, oldest in conn.execute(select(runs.c.job, func.min(runs.c.period_start))
                                    .group_by(runs.c.job)):
        start = bind(target, min(from_db_time(oldest), gap.get(job, from_db_time(oldest))))
        conn.execute(update(jobs).where(jobs.c.job == job, jobs.c.first_period_start < start)
                     .values(first_period_start=start))


def _idle_jobs(conn: Connection, cut: datetime) -> list[tuple[str, datetime]]:
    rows = conn.execute(select(jobs.c.job, jobs.c.last_fire_at)
                        .where(jobs.c.last_fire_at < cut).order_by(jobs.c.job))
    return [(job, from_db_time(at)) for job, at in rows]

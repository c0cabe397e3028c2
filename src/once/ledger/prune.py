"""`once prune`: forget old history, keep what correctness needs.

Deleted: attempts that finished before the cut-off, and done rows before everything catch-up
and the reports still need (every running and failed row stays, every done row from the
job's oldest open row or gap on, and each job's latest done row); each job's expected range
moves up to what it still has, so that the pruned periods are not called missing. An attempt
goes with its run row, so that a pruned period claimed again at attempt 1 collides with
nothing. The terms of `once lead` (once_lead_terms) that ended before the cut-off go too, but
never a lead name's latest term: the next term of a name is seeded from the largest in its
history (once.ledger.leases.SEED), so that a name retired and used again never hands out a
term it has had. docs/concepts/ledger.md and docs/reference/commands.md "once prune" say the
rest.

Imports SQLAlchemy, once.ledger.schema and tables (never on the hot path). Which periods are
gaps is the reports' rule, not the ledger's: the caller hands it in (`oldest_gaps`, in `once
prune` once.report.oldest_gaps), so that the ledger package never imports the reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
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

from once.ledger import LedgerError, Target, describe, engines, from_db_time, newer_schema
from once.ledger.dialects import of
from once.ledger.engines import bind
from once.ledger.fleet import Snapshot
from once.ledger.rows import STATE_PERIOD
from once.ledger.schema import (
    SCHEMA_VERSION,
    bound_lock_waits,
    commit,
    engine,
    ensure,
    failed,
    unconfirmed,
)
from once.ledger.tables import attempts, jobs, lead_terms, runs

# The statement timeout whose limits bound the prune's commit (once.ledger.watchdog.limits):
# the default --stale-after's.
STATEMENT_TIMEOUT = 10.0

# once_attempts' record of `once state --set`: no run row of its own
STATE_ROWS = STATE_PERIOD

# (a snapshot, job names) -> per job with a due period without a row, where the oldest such
# period starts
OldestGaps = Callable[[Snapshot, list[str]], dict[str, datetime]]


@dataclass
class Pruned:
    runs: int = 0
    attempts: int = 0
    lead_terms: int = 0
    idle_jobs: list[tuple[str, datetime]] = field(default_factory=list)
    no_tables: bool = False  # nothing has run in this ledger: nothing to prune


def prune(target: Target, older_than: float, oldest_gaps: OldestGaps, dry_run: bool = False,
          now: datetime | None = None) -> Pruned:
    """Delete (or with dry_run, count) what finished more than older_than seconds ago."""
    cut = (now or datetime.now(UTC)) - timedelta(seconds=older_than)
    if of(target).absent(target):
        return Pruned(no_tables=True)  # connecting would leave an empty file behind
    connected = False
    try:
        eng = engine(target)
        try:
            for tries in (1, 2):
                with eng.connect() as conn, conn.begin():
                    connected = True
                    bound_lock_waits(conn, target)  # a row a claim holds, a table's lock
                    if not inspect(conn).has_table(runs.name):
                        return Pruned(no_tables=True)
                    version = engines.schema_version(conn)
                    if version > SCHEMA_VERSION:
                        raise newer_schema(version)
                    if version == SCHEMA_VERSION or tries == 2:
                        pruned = _prune(conn, target, cut, dry_run, oldest_gaps)
                        _commit(conn, target)
                        return pruned
                ensure(target)  # an older ledger: upgraded first, as the next once run would
            raise AssertionError("unreachable")
        finally:
            eng.dispose()
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if connected:
            raise
        raise LedgerError(f"cannot prune the ledger {target.redacted}: {describe(exc)}") from exc
    except SQLAlchemyError as exc:
        raise LedgerError(f"cannot prune the ledger {target.redacted}: "
                          f"{failed(target, exc)}") from exc


def _commit(conn: Connection, target: Target) -> None:
    """The prune's commit, its wait for a synchronous standby bounded (schema.commit): one
    that none confirmed stands on the primary alone, which is said (exit 75)."""
    limit = commit(conn, target, STATEMENT_TIMEOUT)
    if limit is not None:
        raise LedgerError(f"the prune of the ledger {target.redacted} stands on the primary "
                          f"alone: {unconfirmed('it', limit)}; a failover now would bring "
                          f"the pruned rows back")


def _prune(conn: Connection, target: Target, cut: datetime, dry_run: bool,
           oldest_gaps: OldestGaps) -> Pruned:
    result = Pruned(idle_jobs=_idle_jobs(conn, cut))
    keep, gap = _needed(conn, target, oldest_gaps)
    jobs_with_attempts = set(conn.execute(select(attempts.c.job).distinct()).scalars())
    for job in sorted(set(keep) | jobs_with_attempts):
        goes = _run_row_goes(target, job, keep.get(job), cut)
        # Attempts first: which ones go depends on the run rows that are about to go.
        result.attempts += _prune_attempts(conn, job, goes, cut, dry_run)
        result.runs += _count_or_delete(conn, runs, goes, dry_run)
    if not dry_run:
        _move_expected_ranges(conn, target, gap)
    result.lead_terms = _prune_lead_terms(conn, cut, dry_run)
    return result


def _prune_lead_terms(conn: Connection, cut: datetime, dry_run: bool) -> int:
    """The terms of `once lead` that ended before the cut, but each name's latest (the next
    term is seeded from it) and never one that has not ended. Per name, its latest term read
    first: MySQL deletes from no table that a subquery of the statement reads. A ledger
    without the lease tables (no `once lead` has run there: they are a compatible addition,
    made by its first use) has none."""
    if not inspect(conn).has_table(lead_terms.name):
        return 0
    count = 0
    for name, latest in conn.execute(select(lead_terms.c.name, func.max(lead_terms.c.term))
                                     .group_by(lead_terms.c.name).order_by(lead_terms.c.name)):
        goes = and_(lead_terms.c.name == name, lead_terms.c.term < latest,
                    lead_terms.c.ended_at.is_not(None), lead_terms.c.ended_at < cut)
        count += _count_or_delete(conn, lead_terms, goes, dry_run)
    return count


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
    """What goes of a job's run rows, as one condition on a once_runs row."""
    if keep_from is None:  # no done row: nothing goes
        return false()
    return and_(runs.c.job == job, runs.c.status == "done", runs.c.finished_at < cut,
                runs.c.period_start < bind(target, keep_from))


def _count_or_delete(conn: Connection, table: Table, where: ColumnElement[bool],
                     dry_run: bool) -> int:
    """The rows of `table` that `where` holds for: counted (--dry-run), else deleted."""
    if dry_run:
        return int(conn.execute(select(func.count()).select_from(table).where(where))
                   .scalar_one())
    return int(conn.execute(delete(table).where(where)).rowcount)


def _prune_attempts(conn: Connection, job: str, goes: ColumnElement[bool], cut: datetime,
                    dry_run: bool) -> int:
    """The job's attempts that finished before the cut, and every one whose run row goes (or
    is gone already: an earlier prune left it behind). Never the attempt that holds a running
    row: finished, it is the Python API's done marker (finish_in), which the next claim reads
    to record the period done instead of running it again."""
    kept_row = exists().where(runs.c.job == attempts.c.job, runs.c.period == attempts.c.period,
                              not_(goes))
    holds = exists().where(runs.c.job == attempts.c.job, runs.c.period == attempts.c.period,
                           runs.c.attempt == attempts.c.attempt, runs.c.status == "running")
    old = and_(attempts.c.job == job, not_(holds),
               or_(and_(attempts.c.finished_at.is_not(None), attempts.c.finished_at < cut),
                   and_(attempts.c.period != STATE_ROWS, not_(kept_row))))
    return _count_or_delete(conn, attempts, old, dry_run)


def _move_expected_ranges(conn: Connection, target: Target,
                          gap: dict[str, datetime]) -> None:
    for job, oldest in conn.execute(select(runs.c.job, func.min(runs.c.period_start))
                                    .group_by(runs.c.job)):
        start = bind(target, min(from_db_time(oldest), gap.get(job, from_db_time(oldest))))
        conn.execute(update(jobs).where(jobs.c.job == job, jobs.c.first_period_start < start)
                     .values(first_period_start=start))


def _idle_jobs(conn: Connection, cut: datetime) -> list[tuple[str, datetime]]:
    rows = conn.execute(select(jobs.c.job, jobs.c.last_fired_at)
                        .where(jobs.c.last_fired_at < cut).order_by(jobs.c.job))
    return [(job, from_db_time(at)) for job, at in rows]

"""The rows the reports read, one record each: RunRow (once_runs), JobRow (once_jobs) and
TimelineRow (a timeline cell's part of a once_runs row), with the column lists that the
reads select (once.ledger.fleet in plain SQL, once.ledger.history through SQLAlchemy) and
the reports consume (once.report).

Imports only the standard library: never SQLAlchemy, never a driver, never on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

STATE_PERIOD = "(state)"  # the attempts' rows of `once state --set`: no attempt ran
LAST_LINE_SCAN = 2000  # how much of the end of a stored output is read to find its last line
# An attempt that is not plain: not `once state --set`'s record, and not done at its first
# try, no rerun, not interrupted. The predicate of the partial index once_attempts_unusual
# (SQLite, PostgreSQL: once.ledger.schema) and of the read that goes through it
# (once.ledger.fleet's UNUSUAL_TALLY), the same text in both, as the planners want it.
UNUSUAL_ATTEMPT = (f"period <> '{STATE_PERIOD}' AND (status <> 'done' OR attempt > 1 "
                   f"OR reason IS NOT NULL OR outcome = 'interrupted')")

# A time as a driver hands it back, read as an aware UTC datetime (a dialect's from_db,
# once.ledger.from_db_time).
TimeReader = Callable[[Any], datetime]
T = TypeVar("T")


@dataclass(frozen=True)
class RunRow:
    """A row of once_runs, its times aware UTC datetimes."""

    job: str
    period: str
    status: str
    attempt: int
    fence: int
    owner: str
    period_start: datetime
    period_end: datetime
    started_at: datetime
    heartbeat_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    stale_after: float = 300.0  # the owner's promise: a running row is stale past it
    interrupted: int = 0  # how many of its attempts ended interrupted (a forwarded signal)

    @classmethod
    def read(cls, values: Sequence[Any], when: TimeReader) -> RunRow:
        """A row as a read hands it back, its values in RUN_COLUMNS' order, its times read
        by `when`."""
        (job, period, status, attempt, fence, owner, period_start, period_end, started_at,
         heartbeat_at, finished_at, exit_code, stale_after, interrupted) = values
        return cls(job, period, status, int(attempt), int(fence), owner, when(period_start),
                   when(period_end), when(started_at), when(heartbeat_at),
                   None if finished_at is None else when(finished_at), exit_code,
                   float(stale_after), int(interrupted))

    @property
    def duration(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


# once_runs' columns, in RunRow's order: what every read of a RunRow selects.
RUN_COLUMNS: tuple[str, ...] = tuple(RunRow.__dataclass_fields__)


@dataclass
class JobRow:
    """A once_jobs row: the schedule the job's latest claim left (fires: fire_count); what
    the reports know of a job at a given time extends it (once.report.model.JobState)."""

    job: str
    kind: str
    schedule: str
    tz: str
    lag: int
    max_attempts: int
    stale_after: float
    fires: int
    first_period_start: datetime
    shards: int
    no_overlap: int

    @classmethod
    def read(cls, values: Sequence[Any], when: TimeReader) -> JobRow:
        """A row as a read hands it back, in JOB_COLUMNS' order, its time read by `when`."""
        (job, kind, schedule, tz, lag, max_attempts, stale_after, fires, first_period_start,
         shards, no_overlap) = values
        return cls(job, kind, schedule, tz, lag, max_attempts, stale_after, fires,
                   when(first_period_start), shards, no_overlap)


# once_jobs' columns, in JobRow's order (fire_count is JobRow.fires).
JOB_COLUMNS = ("job", "kind", "schedule", "tz", "lag", "max_attempts", "stale_after",
               "fire_count", "first_period_start", "shards", "no_overlap")


class TimelineRow(NamedTuple):
    """What a timeline cell reads of a once_runs row (once.report.model.period_state)."""

    period: str
    status: str
    heartbeat_at: datetime
    stale_after: float


def chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    """The items in lists of `size` (an IN list's, a statement's share)."""
    items = list(items)
    for i in range(0, len(items), size):
        yield items[i:i + size]

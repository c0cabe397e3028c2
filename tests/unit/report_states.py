"""JobStates and rows built by hand for the unit tests of once.report's pure parts: a daily
job in UTC at a fixed database now, and the once_runs rows a survey would have read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from once.ledger.rows import RunRow
from once.report import JobState
from once.schedules import schedule

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # today's period, 2026-12-01, is not due
SCHED = schedule("day", None, "UTC")


def day_job(name: str = "nightly", first: str = "2026-11-20", max_attempts: int = 3,
            shards: int = 1, fires: int = 12) -> JobState:
    """A daily job (lag 0) first claimed on `first`: due through yesterday at NOW."""
    start = datetime.fromisoformat(first).replace(tzinfo=UTC)
    s = JobState(name, "every", "day", "UTC", 0, max_attempts, 300.0, fires, start, shards,
                 False, NOW)
    s.sched = SCHED
    s.first = SCHED.containing(start)
    s.current = SCHED.containing(NOW)
    s.next = SCHED.next(s.current)
    s.next_at = s.current.end
    s.due_last = SCHED.previous(s.current)
    return s


def row(key: str, status: str, attempt: int = 1, *, job: str = "nightly",
        beat_ago: float = 10.0, stale_after: float = 300.0, took: float | None = None,
        exit_code: int | None = None, owner: str = "vm:42", interrupted: int = 0,
        started_ago: float | None = None) -> RunRow:
    """A once_runs row of the daily job's period `key` (KEY or KEY#i), its attempt started a
    minute after the period's end, or started_ago seconds before NOW."""
    period = SCHED.containing(datetime.fromisoformat(key.partition("#")[0])
                              .replace(tzinfo=UTC))
    started = (period.end + timedelta(minutes=1) if started_ago is None
               else NOW - timedelta(seconds=started_ago))
    finished = None if took is None else started + timedelta(seconds=took)
    return RunRow(job, key, status, attempt, attempt, owner, period.start, period.end,
                  started, NOW - timedelta(seconds=beat_ago), finished, exit_code,
                  stale_after, interrupted)

"""Every job's state in one snapshot: its due range, the counts of its done rows, its open
rows, its latest done row, the last lines of its failures, its missing periods, and the rows
of its timeline, read through once.ledger.reads' Snapshot (plain SQL: no SQLAlchemy).

Scale: the number of due periods is counted arithmetically (once.gaps) and compared with one
COUNT of done rows over an index range per job (index once_runs_job_status_start); only a job
whose count shows a gap has its gaps located, by counting ever smaller stretches
(once.gaps.GapFinder, which catch-up uses too: about log8(periods) round trips per gap; the
stretch after a job's latest row costs none), and only the first few missing keys and the last
one are walked. So `once status` and `once check` read O(jobs) index ranges and walk O(listed)
periods, not every period of every job. A cron schedule has no closed-form count: its gaps are
the stretches between its done rows (a window query over the job's done rows, in index order),
walked up to WALK_LIMIT.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from once import gaps, stored
from once.ledger import from_db_time
from once.ledger.reads import Snapshot
from once.periods import Period, SpecError, utc_instant
from once.report.model import (
    LIST_LIMIT,
    MAX_LAST,
    NEVER,
    JobState,
    RunRow,
    Unit,
    default_last,
    last_line,
    period_state,
)

WALK_LIMIT = 100_000  # missing units walked per job to count the gaps of a cron job


def survey_jobs(snap: Snapshot, names: Sequence[str] | None, namespace: str | None,
                grace: float = 0.0) -> tuple[list[JobState], datetime]:
    """The named jobs (all of them, or those of a namespace) at the database's now."""
    now = snap.db_now()
    return survey(snap, snap.job_rows(names, namespace), now, grace), now


def oldest_gaps(snap: Snapshot, names: list[str]) -> dict[str, datetime]:
    """Per named job with a due period that has no row: where the oldest such period starts
    (`once prune` keeps every done row from there on, for the gap finder). No names: none
    (job_rows reads every job for an empty list)."""
    if not names:
        return {}
    states = survey(snap, snap.job_rows(names, None), snap.db_now())
    return {s.name: s.no_row_listed[0][0] for s in states if s.no_row_listed}


def survey(snap: Snapshot, job_rows: Sequence[Any], now: datetime,
           grace: float = 0.0) -> list[JobState]:
    """Every named job's state at `now`: due range, counts, open rows, missing periods."""
    states = [_plan(row, now, grace) for row in job_rows]
    ready = [s for s in states if s.sched is not None]
    _count_done(snap, ready)
    by_name = {s.name: s for s in ready}
    for row in snap.open_rows(list(by_name)):
        by_name[row.job].open_rows.append(RunRow.of(row))
    for row in snap.last_done_rows(list(by_name)):
        by_name[row.job].last_done = RunRow.of(row)
    _read_failure_lines(snap, ready)
    for state in ready:
        _locate_missing(snap, state)
    return states


def _plan(row: Any, now: datetime, grace: float) -> JobState:
    """The job's periods at `now`, from its stored schedule: no database needed."""
    state = JobState(row.job, row.kind, row.schedule, row.tz, row.lag, row.max_attempts,
                     float(row.stale_after), row.fires, from_db_time(row.first_period_start), now,
                     max(1, int(row.shards or 1)))
    try:
        sched = stored.job_schedule(row.kind, row.schedule, row.tz)
        state.sched = sched
        state.first = sched.containing(state.first_period_start)
        running_now = sched.containing(now)
        state.current = sched.shifted(running_now, -row.lag)
        state.next = sched.next(state.current)
        state.next_at = utc_instant(running_now.end)
        due_last = sched.shifted(sched.containing(now - timedelta(seconds=grace)),
                                 -(row.lag + 1))
        if utc_instant(due_last.start) >= utc_instant(state.first.start):
            state.due_last = due_last
            state.expected = gaps.count(sched, state.first, due_last)
    except (SpecError, ValueError, OverflowError) as exc:
        state.sched = None
        state.error = str(exc)
    return state


def _count_done(snap: Snapshot, states: list[JobState]) -> None:
    """done rows in each job's due range (one COUNT over an index range per job)."""
    due: list[JobState] = []
    ranges: list[tuple[str, datetime, datetime]] = []
    for s in states:
        if s.due_last is not None and s.first is not None:
            due.append(s)
            ranges.append((s.name, s.first.start, s.due_last.end))
    for s, n in zip(due, snap.done_counts(ranges), strict=True):
        s.done_due = n


def _read_failure_lines(snap: Snapshot, states: list[JobState]) -> None:
    """The last line of output of each failed row listed: the end of its attempt's stored
    output (primary-key lookups, only where a job has failed rows)."""
    by_key = {(s.name, r.period, r.attempt): s for s in states for r in s.listed_failures}
    for row in snap.failure_output_ends(list(by_key)):
        job, period, attempt, output_end = row
        by_key[(job, period, attempt)].failure_lines[period] = last_line(output_end)


def _locate_missing(snap: Snapshot, s: JobState) -> None:
    """Count the due periods (with --shards: shards) that have no row; list the first few and
    the last one (once.gaps.GapFinder, as catch-up finds them)."""
    if s.due_last is None or s.first is None or s.sched is None:
        return
    lo, hi = utc_instant(s.first.start), utc_instant(s.due_last.end)
    starts = [r.period_start for r in s.open_rows]
    if s.last_done is not None:
        starts.append(s.last_done.period_start)
    finder = gaps.GapFinder(s.sched, s.shards, _Rows(snap, s.name),
                            [(r.period_start, r.period) for r in s.open_rows],
                            max(starts, default=None))
    if s.expected is None:  # cron: no count; walk the gaps between the done rows
        _walk_missing(s, finder, lo, hi)
        return
    present = s.done_due + sum(1 for r in s.open_rows if lo <= r.period_start < hi)
    missing = s.expected * s.shards - present
    if missing <= 0:
        return  # every due period has its rows: the common, cheap case
    s.no_row = missing
    s.no_row_listed = [(utc_instant(p.start), key) for p, key
                       in islice(finder.units(lo, hi, missing), LIST_LIMIT + 1)]
    s.no_row_last = next(((utc_instant(p.start), key) for p, key
                          in finder.units(lo, hi, missing, backwards=True)), None)


def _walk_missing(s: JobState, finder: gaps.GapFinder, lo: datetime, hi: datetime) -> None:
    """A cron job's missing units, counted by walking them (up to WALK_LIMIT)."""
    listed: list[Unit] = []
    for period, key in finder.units(lo, hi):
        s.no_row += 1
        s.no_row_last = (utc_instant(period.start), key)
        if len(listed) <= LIST_LIMIT:
            listed.append(s.no_row_last)
        if s.no_row >= WALK_LIMIT:
            s.no_row_at_least = True
            break
    s.no_row_listed = listed


class _Rows:
    """once.gaps.Rows for the reports: catch-up's statements (once.ledger.catchup) on the
    report's snapshot, each stretch's done rows counted once (a snapshot does not change: the
    search for the last gap goes down the stretches the search for the first one counted)."""

    def __init__(self, snap: Snapshot, job: str) -> None:
        self.rows = snap.rows(job)
        self.counted: dict[tuple[datetime, datetime], int] = {}

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        new = [x for x in stretches if x not in self.counted]
        if new:
            self.counted.update(zip(new, self.rows.done_counts(new), strict=True))
        return [self.counted[x] for x in stretches]

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        return self.rows.keys_at(starts)

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        return self.rows.done_breaks(lo, hi)

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        return self.rows.short_starts(lo, hi, shards, limit)


def timeline_cells(snap: Snapshot, s: JobState,
                   last: int | None) -> list[tuple[Period, str]]:
    """The job's `last` latest periods (default_last when None), up to the one `once run`
    claims now, and their states, oldest first, as `once status --timeline` draws them:
    done, failed, missing, running, stale, pending (not due yet) or none (before the first)."""
    if s.sched is None or s.current is None:
        return []
    count = min(max(1, last or default_last(s)), MAX_LAST)
    periods = [s.current]
    first = utc_instant(s.first.start) if s.first is not None else NEVER
    while len(periods) < count and utc_instant(periods[-1].start) > first:
        periods.append(s.sched.previous(periods[-1]))  # not before the job's first period
    periods.reverse()
    rows: dict[str, list[Any]] = {}
    for row in snap.timeline_rows(s.name, periods[0].start, periods[-1].end):
        rows.setdefault(stored.period_key(row.period), []).append(row)
    return [(p, period_state(s, p, rows.get(p.key, []))) for p in periods]

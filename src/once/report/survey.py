"""Every job's state in one snapshot: its due range, the counts of its done rows, its open
rows, its latest done row, the last lines of its failures, its missing periods, and the rows
of its timeline, read through once.ledger.fleet's Snapshot (plain SQL: no SQLAlchemy).

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

from bisect import bisect_left
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from once import gaps, stored
from once.ledger import from_db_time
from once.ledger.fleet import Snapshot
from once.ledger.rows import JobRow
from once.periods import Period, Schedule, SpecError, utc_instant
from once.report.model import (
    LIST_LIMIT,
    MAX_LAST,
    NEVER,
    JobState,
    Unit,
    default_last,
    last_line,
    period_state,
)

WALK_LIMIT = 100_000  # missing units walked per job to count the gaps of a cron job
PREFETCH = 1000  # due units of a job with gaps whose done rows complete() reads at once

# A job's done rows read for its gap search: (lo, hi, the starts of those in [lo, hi), sorted)
_Known = tuple[datetime, datetime, list[datetime]]
# A job's missing units as the reports list them: the first LIST_LIMIT + 1, and the last
_Listed = tuple[list[Unit], Unit | None]


def survey_jobs(snap: Snapshot, names: Sequence[str] | None, namespace: str | None,
                grace: float = 0.0, detail: bool = True) -> tuple[list[JobState], datetime]:
    """The named jobs (all of them, or those of a namespace) at the database's now; without
    detail, only what a job's verdict needs (see survey)."""
    now = snap.db_now()
    return survey(snap, snap.job_rows(names, namespace), now, grace, detail=detail), now


def oldest_gaps(snap: Snapshot, names: list[str]) -> dict[str, datetime]:
    """Per named job with a due period that has no row: where the oldest such period starts
    (`once prune` keeps every done row from there on, for the gap finder). No names: none
    (job_rows reads every job for an empty list)."""
    if not names:
        return {}
    # Every gap counts here, also one a --no-overlap job's live attempt holds back: prune
    # must keep the done rows after it for the gap finder.
    states = survey(snap, snap.job_rows(names, None), snap.db_now(), wait_for_live=False)
    return {s.name: s.no_row_listed[0][0] for s in states if s.no_row_listed}


def survey(snap: Snapshot, job_rows: Sequence[JobRow], now: datetime,
           grace: float = 0.0, wait_for_live: bool = True, detail: bool = True) -> list[JobState]:
    """Every named job's state at `now`: due range, counts, open rows, missing periods.

    Without detail, what a verdict (once.report.findings' severities) needs and no more:
    the counts of missing periods but not their keys, no latest done row, no failure's last
    line, no count of the current period's done rows (a cron job, whose gaps are counted by
    walking them, gets its detail anyway); complete() adds the rest for the jobs shown (once
    serve's page of a fleet)."""
    plans: dict[Any, Any] = {}  # jobs that share a schedule share its periods at `now`
    states = [_plan(row, now, grace, plans) for row in job_rows]
    if not wait_for_live:
        for state in states:
            state.no_overlap = False
    ready = [s for s in states if s.sched is not None]
    by_name = {s.name: s for s in ready}
    for row in snap.open_rows(list(by_name)):
        by_name[row.job].open_rows.append(row)
    for state in ready:
        _wait_for_live_attempt(state)
    _count_done(snap, ready)
    for state in ready:
        _count_missing(state)
    complete(snap, ready if detail else [s for s in ready if s.expected is None])
    return states


def complete(snap: Snapshot, states: Sequence[JobState]) -> None:
    """What survey without detail left out, for these jobs: their current periods' done
    rows, their latest done rows, their failures' last lines, their missing periods' keys (a
    job already complete is left)."""
    todo = [s for s in states if s.sched is not None and not s.detailed]
    if not todo:
        return
    read_last_done(snap, todo)
    _count_current(snap, todo)
    _read_failure_lines(snap, todo)
    counted: dict[int, dict[Any, int]] = {}  # count_starts by stretch, per schedule
    finders = {s.name: found for s in todo
               if (found := _finder(snap, s, counted.setdefault(id(s.sched), {}))) is not None}
    read = _read_small_gapped(snap, todo, {name: f for name, (f, _) in finders.items()})
    tails: dict[Any, _Listed] = {}  # the units of the jobs that stopped together
    for state in todo:
        if state.name in finders:
            finder, rows = finders[state.name]
            rows.known = read.get(state.name)
            _locate_missing(state, finder, tails)
        state.detailed = True


def read_last_done(snap: Snapshot, states: Sequence[JobState]) -> None:
    """Each job's latest done row (of a sharded period's, the last in key order), in one
    statement (SQLite, PostgreSQL): what `once metrics` needs beyond survey's counts."""
    by_name = {s.name: s for s in states if s.sched is not None}
    for row in snap.last_done_rows(list(by_name)):
        by_name[row.job].last_done = row


def _plan(row: JobRow, now: datetime, grace: float, plans: dict[Any, Any]) -> JobState:
    """The job's periods at `now`, from its stored schedule: no database needed. What jobs of
    one schedule (and lag, and first period) share is worked out once, in plans."""
    state = JobState(row.job, row.kind, row.schedule, row.tz, row.lag, row.max_attempts,
                     float(row.stale_after), row.fires, from_db_time(row.first_period_start),
                     max(1, int(row.shards or 1)), bool(row.no_overlap), now, grace=grace)
    key = (row.kind, row.schedule, row.tz, row.lag)
    try:
        if key not in plans:
            try:
                plans[key] = _schedule_plan(row, now, grace)
            except (SpecError, ValueError, OverflowError) as exc:
                plans[key] = exc  # the same for every job of the schedule
        plan = plans[key]
        if isinstance(plan, Exception):
            raise plan
        sched, state.current, state.next, state.next_at, due_last = plan
        first_key = (key, state.first_period_start)
        if first_key not in plans:
            first = sched.containing(state.first_period_start)
            counted = utc_instant(due_last.start) >= utc_instant(first.start)
            plans[first_key] = (first, due_last if counted else None,
                                gaps.count(sched, first, due_last) if counted else 0)
        state.first, state.due_last, state.expected = plans[first_key]
        state.sched = sched
    except (SpecError, ValueError, OverflowError) as exc:
        state.sched = None
        state.error = str(exc)
    return state


def _schedule_plan(row: JobRow, now: datetime, grace: float) -> tuple[Any, ...]:
    """(schedule, current period, next, when the next begins, the latest due period)."""
    sched = Remembered(stored.job_schedule(row.kind, row.schedule, row.tz))
    running_now = sched.containing(now)
    current = sched.shifted(running_now, -row.lag)
    due_last = sched.shifted(sched.containing(now - timedelta(seconds=grace)), -(row.lag + 1))
    return sched, current, sched.next(current), utc_instant(running_now.end), due_last


class Remembered(Schedule):
    """A schedule that remembers the periods it was asked for, for one survey: the jobs of a
    schedule share it (_plan), and their gap searches and timelines ask for the same periods
    (a page of 100 jobs with gaps asked for 10,000, each 20-30 us in a zone with summer
    time). The engine's periods are a function of the instant alone."""

    def __init__(self, inner: Schedule) -> None:  # no Schedule.__init__: inner's zone is read
        self.inner = inner
        self.found: dict[datetime, Period] = {}
        self.kind, self.spec, self.tz, self.tz_name = inner.kind, inner.spec, inner.tz, \
            inner.tz_name
        self.unit, self.minutes, self.calendar = inner.unit, inner.minutes, inner.calendar

    def __getattr__(self, name: str) -> Any:  # what the engine's own classes add
        if name == "inner":  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __str__(self) -> str:
        return str(self.inner)

    def containing(self, instant: datetime) -> Period:
        at = utc_instant(instant)
        if (period := self.found.get(at)) is None:
            period = self.found[at] = self.inner.containing(at)
        return period

    def _key_instant(self, key: str) -> datetime | None:
        return self.inner._key_instant(key)


def _wait_for_live_attempt(s: JobState) -> None:
    """--no-overlap: the periods after a live attempt's are not expected yet (counted_end)."""
    end = s.counted_end
    if (s.no_overlap and s.expected is not None and s.sched is not None and s.first is not None
            and s.due_last is not None and end is not None and end < utc_instant(s.due_last.end)):
        s.expected = gaps.count(s.sched, s.first, s.sched.containing(end - timedelta(
            microseconds=1)))


def _count_done(snap: Snapshot, states: list[JobState]) -> None:
    """done rows in each job's due range (one COUNT over an index range each, all in one
    statement where the backend allows: once.ledger.fleet)."""
    due: list[JobState] = []
    ranges: list[tuple[str, datetime, datetime]] = []
    for s in states:
        end = s.counted_end
        if end is not None and s.first is not None:
            due.append(s)
            ranges.append((s.name, s.first.start, end))
    for s, n in zip(due, snap.done_counts(ranges), strict=True):
        s.done_due = n


def _count_current(snap: Snapshot, states: list[JobState]) -> None:
    """done rows in each job's current period (shown, never judged: read for the jobs shown),
    after their latest done rows: a job whose latest done row starts before its current
    period has none there, and is not asked (a fleet's page, 10,000 index ranges less)."""
    now = [s for s in states if s.current is not None and s.last_done is not None
           and s.last_done.period_start >= utc_instant(s.current.start)]
    ranges = [(s.name, s.current.start, s.current.end) for s in now if s.current]
    for s, n in zip(now, snap.done_counts(ranges), strict=True):
        s.current_done = n


def _read_failure_lines(snap: Snapshot, states: list[JobState]) -> None:
    """The last line of output of each failed row listed: the end of its attempt's stored
    output (primary-key lookups, only where a job has failed rows)."""
    by_key = {(s.name, r.period, r.attempt): s for s in states for r in s.listed_failures}
    for row in snap.failure_output_ends(list(by_key)):
        job, period, attempt, output_end = row
        by_key[(job, period, attempt)].failure_lines[period] = last_line(output_end)


def _count_missing(s: JobState) -> None:
    """Count the due periods (with --shards: shards) that have no row, from the counts (a
    cron job's are counted by walking them: _locate_missing)."""
    end = s.counted_end
    if end is None or s.first is None or s.expected is None:
        return
    lo = utc_instant(s.first.start)
    present = s.done_due + sum(1 for r in s.open_rows if lo <= r.period_start < end)
    s.no_row = max(0, s.expected * s.shards - present)


def _finder(snap: Snapshot, s: JobState,
            counted: dict[Any, int]) -> tuple[gaps.GapFinder, _Rows] | None:
    """The gap finder of a job whose missing periods are to be listed (a cron job's to be
    counted too), and the rows it reads; None when there are none: the common, cheap case."""
    if s.counted_end is None or s.first is None or s.sched is None:
        return None
    if s.expected is not None and not s.no_row:
        return None
    starts = [r.period_start for r in s.open_rows]
    if s.last_done is not None:
        starts.append(s.last_done.period_start)
    rows = _Rows(snap, s.name)
    return gaps.GapFinder(s.sched, s.shards, rows,
                          [(r.period_start, r.period) for r in s.open_rows],
                          max(starts, default=None), counted), rows


def _read_small_gapped(snap: Snapshot, states: Sequence[JobState],
                       finders: dict[str, gaps.GapFinder]) -> dict[str, _Known]:
    """The done rows' starts of the jobs with gaps of at most PREFETCH due units that their
    gap searches count (not those whose every gap comes after their latest row: a job that
    stopped), all in one statement: their searches count those instead of asking the ledger
    5-10 times each (a page of 100 such jobs made 600 round trips)."""
    ranges = []
    for s in states:
        end, finder = s.counted_end, finders.get(s.name)
        if (finder is not None and s.expected is not None and s.first is not None
                and end is not None and s.expected * s.shards <= PREFETCH
                and finder.searched(utc_instant(s.first.start), end, s.no_row) > 0):
            ranges.append((s.name, utc_instant(s.first.start), end))
    return {name: (lo, hi, starts) for (name, lo, hi), starts
            in zip(ranges, snap.done_starts(ranges), strict=True)}


def _locate_missing(s: JobState, finder: gaps.GapFinder,
                    tails: dict[Any, _Listed] | None = None) -> None:
    """List the first few due periods (with --shards: shards) that have no row and the last
    one (once.gaps.GapFinder, as catch-up finds them); a cron job's are counted here too.

    A job whose every missing unit comes after its latest row (a job that stopped) lists
    the units of that stretch alone, the same for every job of its schedule and shards that
    stopped with it: tails holds them, listed once (a fleet whose minute jobs all stopped
    walked the same periods for each)."""
    end, first = s.counted_end, s.first
    if end is None or first is None:
        return
    lo, hi = utc_instant(first.start), end
    if s.expected is None:  # cron: no count; walk the gaps between the done rows
        _walk_missing(s, finder, lo, hi)
        return
    missing = s.no_row
    tail = finder.tail(lo, hi)
    if tails is None or tail is None or missing <= 0 or finder.searched(lo, hi, missing) > 0:
        s.no_row_listed, s.no_row_last = _listed(finder, lo, hi, missing)
        return
    key = (id(s.sched), s.shards, tail)
    if (known := tails.get(key)) is None:
        # units() lists the stretch after the latest row whole, and nothing before it
        known = tails[key] = _listed(finder, lo, hi, missing)
    s.no_row_listed, s.no_row_last = list(known[0]), known[1]


def _listed(finder: gaps.GapFinder, lo: datetime, hi: datetime, missing: int) -> _Listed:
    return ([(utc_instant(p.start), key) for p, key
             in islice(finder.units(lo, hi, missing), LIST_LIMIT + 1)],
            next(((utc_instant(p.start), key) for p, key
                  in finder.units(lo, hi, missing, backwards=True)), None))


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
    """once.gaps.Rows for the reports: catch-up's statements (once.ledger.gap_rows) on the
    report's snapshot, each stretch's done rows counted once (a snapshot does not change: the
    search for the last gap goes down the stretches the search for the first one counted)."""

    def __init__(self, snap: Snapshot, job: str, known: _Known | None = None) -> None:
        self.rows = snap.rows(job)
        self.counted: dict[tuple[datetime, datetime], int] = {}
        self.known = known  # (lo, hi, the starts of every done row in [lo, hi)), if read

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        if self.known is not None:
            lo, hi, starts = self.known
            for a, b in stretches:
                if lo <= a and b <= hi:
                    self.counted[a, b] = max(0, bisect_left(starts, b) - bisect_left(starts, a))
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
    return timelines(snap, [s], last)[s.name]


def timelines(snap: Snapshot, states: Sequence[JobState],
              last: int | None) -> dict[str, list[tuple[Period, str]]]:
    """timeline_cells of each job, by name, the rows of all of them read at once."""
    shown = [(s, _timeline_periods(s, last)) for s in states]
    ranges = [(s.name, periods[0].start, periods[-1].end) for s, periods in shown if periods]
    found = iter(snap.timelines_rows(ranges))
    cells: dict[str, list[tuple[Period, str]]] = {}
    for s, periods in shown:
        rows: dict[str, list[Any]] = {}
        for row in next(found) if periods else ():
            rows.setdefault(stored.period_key(row.period), []).append(row)
        cells[s.name] = [(p, period_state(s, p, rows.get(p.key, []))) for p in periods]
    return cells


def _timeline_periods(s: JobState, last: int | None) -> list[Period]:
    if s.sched is None or s.current is None:
        return []
    count = min(max(1, last or default_last(s)), MAX_LAST)
    periods = [s.current]
    first = utc_instant(s.first.start) if s.first is not None else NEVER
    while len(periods) < count and utc_instant(periods[-1].start) > first:
        periods.append(s.sched.previous(periods[-1]))  # not before the job's first period
    periods.reverse()
    return periods

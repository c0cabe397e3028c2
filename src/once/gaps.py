"""How many periods lie between two periods, counted without walking them (for reports), and
where the missing ones are (GapFinder).

`once status` and `once check` compare, per job, the number of periods that are due with the
number of rows the ledger holds for them; walking every period through the period engine would
cost each job's whole history, so `count` counts them arithmetically, following the engine's
rules (docs/concepts/periods.md) exactly. Cron schedules have no such count: `count` returns
None and the caller walks only the gaps.

GapFinder finds the periods themselves, for the reports and for catch-up alike: what `once
check` reports missing is what `once catchup` makes up. It reads a job's rows through `Rows`,
which once.ledger.gap_rows answers in plain SQL (`once run --catchup` is a cron fire: no
SQLAlchemy). Each unit's length, months and anchor are its record's (once.units). Standard
library, once.periods, once.units and once.stored only.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from itertools import pairwise
from typing import Protocol

from once.outcomes import attempts_left
from once.periods import Period, Schedule, utc_instant
from once.stored import shard_keys
from once.units import CLOCK
from once.units import Unit as PeriodUnit

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_DAY = timedelta(days=1)
_US = timedelta(microseconds=1)
_US_PER_S = 1_000_000

_EPOCH_DATE = _EPOCH.date()


def count(sched: Schedule, first: Period, last: Period) -> int | None:
    """How many periods run from first to last, both included (0 if last is before first).

    None for a cron schedule, whose fire times have no closed form. Units counted in months
    (month, quarter, year): from the keys' first dates (2026-10 is month 2026 * 12 + 9). The
    others (minute, Nm, hour, Nh, day, week): period starts are the instants at which the
    local clock reads a multiple of the unit (a week's multiples fall on Mondays, its anchor),
    so between two changes of the zone's UTC offset they are multiples in local time; at each
    change, a spring-forward gap that swallows one or more multiples adds one boundary at the
    gap's end (unless the gap ends on a multiple, which is then counted already), and for
    calendar units (day, week) a fall-back that repeats midnight counts it only once. The
    offset changes are found by probing the zone once a day (UTC midnights) and bisecting to
    the second, cached per zone and year: two changes less than a day apart that cancel each
    other are not seen (tzdata has none since 1970).
    """
    start, end = utc_instant(first.start), utc_instant(last.end)
    if utc_instant(last.start) < start:
        return 0
    unit = sched.unit
    if unit is None:
        return None
    if unit.months:
        return _month_index(unit, last.key) - _month_index(unit, first.key) + 1
    return _boundaries(sched.tz, start, end, *_grid(unit))


def count_starts(sched: Schedule, start: datetime, end: datetime) -> int | None:
    """How many periods start in [start, end), two period boundaries; None for cron."""
    start, end = utc_instant(start), utc_instant(end)
    if end <= start:
        return 0
    unit = sched.unit
    if unit is None:
        return None
    if unit.months:
        first, last = sched.containing(start), sched.containing(end - _US)
        return _month_index(unit, last.key) - _month_index(unit, first.key) + 1
    return _boundaries(sched.tz, start, end, *_grid(unit))


def _grid(unit: PeriodUnit) -> tuple[int, int, bool]:
    """(unit in microseconds, where its multiples fall in local time counted from
    1970-01-01T00:00, whether a repeated multiple counts once: a calendar unit's does)."""
    length = unit.length // _US
    if unit.kind == CLOCK:
        return length, 0, False
    return length, (unit.anchor - _EPOCH_DATE) // _US % length, True


def _month_index(unit: PeriodUnit, key: str) -> int:
    """The index of a key's period among the unit's (months since the year 0, divided)."""
    first = unit.first_date(key)
    if first is None:  # keys come from the engine: never
        raise ValueError(f"not a {unit.name} key: {key!r}")
    return (first.year * 12 + first.month - 1) // unit.months


def _boundaries(tz: tzinfo, start: datetime, end: datetime, unit: int, phase: int,
                calendar: bool) -> int:
    """Period starts in [start, end) for a local-clock grid (start is itself one)."""

    def multiples(lo: int, hi: int) -> int:  # m = phase (mod unit), lo <= m < hi
        return (phase - lo) // unit - (phase - hi) // unit

    total = 0
    at = start
    offset = _offset_us(tz, start)
    for change, before, after in changes(tz, start, end):
        if change > at:
            total += multiples(_us(at) + offset, _us(change) + offset)
        wall_before, wall_after = _us(change) + before, _us(change) + after
        if after > before:  # a gap: its multiples become one boundary at its end
            if multiples(wall_before, wall_after) and multiples(wall_after, wall_after + 1) == 0:
                total += 1
        elif calendar:  # a repeated stretch: its multiples count the first time only
            total -= multiples(wall_after, wall_before)
        at, offset = change, after
    return total + multiples(_us(at) + offset, _us(end) + offset)


def changes(tz: tzinfo, start: datetime, end: datetime) -> list[tuple[datetime, int, int]]:
    """The zone's UTC offset changes in [start, end): (instant, offset before, offset after),
    offsets in microseconds."""
    if _fixed(tz):
        return []
    found: list[tuple[datetime, int, int]] = []
    for year in range(start.year, end.year + 1):
        found.extend(c for c in _changes_in_year(tz, year) if start <= c[0] < end)
    return found


# Zones that tzdata defines with one offset for all time (Etc/..., and UTC and GMT under
# their other names): they have no changes to probe for (a daily job's 27 years did cost
# 10,000 probes per report).
_FIXED = {"UTC", "GMT", "UCT", "Universal", "Zulu", "Greenwich", "GMT0", "GMT+0", "GMT-0"}


def _fixed(tz: tzinfo) -> bool:
    if tz is UTC:  # periods.zone("UTC"): datetime's own
        return True
    key = getattr(tz, "key", None) or ""
    return key in _FIXED or key.startswith("Etc/")


@lru_cache(maxsize=4096)
def _changes_in_year(tz: tzinfo, year: int) -> tuple[tuple[datetime, int, int], ...]:
    """The offset changes in one UTC year, found by probing each UTC midnight."""
    begin = datetime(year, 1, 1, tzinfo=UTC)
    try:
        stop = datetime(year + 1, 1, 1, tzinfo=UTC)
    except ValueError:
        stop = datetime.max.replace(tzinfo=UTC)
    probes = [begin - _SECOND] if year > 1 else [begin]  # nothing before the year 1
    day = begin
    while day < stop:
        probes.append(day)
        day += _DAY
    probes.append(stop - _SECOND)
    found = []
    lo = probes[0]
    lo_offset = _offset_us(tz, lo)
    for hi in probes[1:]:
        hi_offset = _offset_us(tz, hi)
        while hi_offset != lo_offset:
            change = _switch(tz, lo, hi, lo_offset)
            after = _offset_us(tz, change)
            found.append((change, lo_offset, after))
            lo, lo_offset = change, after
        lo, lo_offset = hi, hi_offset
    return tuple(found)


def _switch(tz: tzinfo, lo: datetime, hi: datetime, before: int) -> datetime:
    """The first whole second in (lo, hi] whose offset differs from `before` (lo's)."""
    a, b = (lo - _EPOCH) // _SECOND, (hi - _EPOCH) // _SECOND
    while b - a > 1:
        middle = (a + b) // 2
        if _offset_us(tz, _EPOCH + middle * _SECOND) == before:
            a = middle
        else:
            b = middle
    return _EPOCH + b * _SECOND


def _offset_us(tz: tzinfo, instant: datetime) -> int:
    offset = instant.astimezone(tz).utcoffset()
    return (offset // _US) if offset is not None else 0


def _us(instant: datetime) -> int:
    return (instant - _EPOCH) // _US


# -- which periods need a run -----------------------------------------------------------------


@dataclass(frozen=True)
class OpenRow:
    """A running or failed row, as catch-up and the reports judge it."""

    key: str  # the row's period key (KEY#i with --shards)
    start: datetime  # its period's start, UTC
    status: str  # running or failed
    attempt: int
    stale: bool  # running, with a heartbeat older than its owner's promise (database clock)
    interrupted: int = 0  # how many of its attempts ended interrupted (once_runs.interrupted)


def needs_run(row: OpenRow, max_attempts: int) -> bool:
    """Whether catch-up makes up a period that has this row: a failed attempt with attempts
    left (outcomes.attempts_left), or a running one past its owner's promise. The claim's
    takeover rule (once.ledger), read from outside; a unit with no row at all always needs a
    run."""
    if row.status == "failed":
        return attempts_left(row.attempt, row.interrupted, max_attempts) > 0
    return row.status == "running" and row.stale


class Rows(Protocol):
    """What the gap finder reads about one job's rows (period starts are UTC)."""

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        """The done rows whose period starts in each [a, b) (at most SPLIT stretches)."""

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        """The keys of every row, whatever its status, whose period starts at each start."""

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        """Over the done rows whose period starts in [lo, hi), in order: the first one's start,
        and (end, the next one's start or None) for each one not followed directly by another
        (an index range read once, with a window function)."""

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        """Period starts in [lo, hi) that have rows, but fewer than shards (at most limit)."""


# A missing unit: a period and one of its keys (KEY, or KEY#i with --shards).
Unit = tuple[Period, str]

SPLIT = 8  # a stretch with a gap is split into this many parts, counted in one statement
WALK_LIMIT = 100_000  # periods read at most that lack some shards' rows (cron)


class GapFinder:
    """Finds the units of a job that have no row at all.

    An `every` job's are found by counting: a stretch [a, b) between period boundaries should
    hold count_starts(a, b) x shards rows. Everything after the job's latest row is a gap
    known without a query (a job that stopped); elsewhere a stretch with a deficit is cut into
    SPLIT parts whose done rows are counted in one statement (index
    once_runs_job_status_start), and only the parts with a deficit are searched further: a
    gap is found in about log_SPLIT(periods) round trips, and a stretch with no row at all is
    known whole without being walked. A cron schedule has no count: its gaps are the
    stretches between its done rows, walked (at most WALK_LIMIT units).
    """

    def __init__(self, sched: Schedule, shards: int, rows: Rows,
                 open_rows: Sequence[tuple[datetime, str]], latest: datetime | None,
                 counted: dict[tuple[datetime, datetime], int] | None = None) -> None:
        """open_rows: (start, key) of every running and failed row of the job; latest: the
        start of its latest row of any status (no row starts after it); counted: the periods
        that start in each stretch, as count_starts gave them, kept for the finders of one
        schedule (the reports': thousands of stopped jobs of one schedule share their tail)."""
        self.sched, self.shards, self.rows = sched, shards, rows
        self.open = list(open_rows)
        self.open_starts = sorted(start for start, _ in self.open)
        self.latest = latest
        self.counted = {} if counted is None else counted

    def expected(self, a: datetime, b: datetime) -> int:
        if (n := self.counted.get((a, b))) is None:
            n = self.counted[a, b] = count_starts(self.sched, a, b) or 0
        return n * self.shards

    def deficit(self, lo: datetime, hi: datetime) -> int:
        """How many units in [lo, hi) have no row (an `every` job's): one statement."""
        return self._deficits([lo, hi])[0]

    def units(self, lo: datetime, hi: datetime, missing: int | None = None,
              backwards: bool = False) -> Iterator[Unit]:
        """The units in [lo, hi) without a row, oldest first (newest first when backwards: an
        `every` job's only). missing: how many there are, when the caller has counted."""
        if self.sched.kind != "every":
            if backwards:
                raise ValueError("a cron job's gaps are walked forwards only")
            yield from self._walk(lo, hi)
            return
        deficit = self.deficit(lo, hi) if missing is None else missing
        if deficit <= 0:
            return
        tail = self._tail(lo, hi)
        if tail:
            deficit -= self.expected(*tail)
            hi = tail[0]
        if backwards and tail:
            yield from self._all(*tail, backwards)
        yield from self._search(lo, hi, deficit, backwards)
        if not backwards and tail:
            yield from self._all(*tail, backwards)

    def searched(self, lo: datetime, hi: datetime, missing: int) -> int:
        """How many of the `missing` units in [lo, hi) (an `every` job's) units() looks for
        by counting stretches: those before the stretch after the job's latest row, which
        is missing whole and known without a read (a job that stopped: none)."""
        tail = self._tail(lo, hi)
        return missing - (self.expected(*tail) if tail else 0)

    def tail(self, lo: datetime, hi: datetime) -> tuple[datetime, datetime] | None:
        """The stretch of [lo, hi) after the period of the job's latest row, if any: an
        `every` job's units there are all missing (units() lists it whole)."""
        return self._tail(lo, hi)

    def _tail(self, lo: datetime, hi: datetime) -> tuple[datetime, datetime] | None:
        """The stretch of [lo, hi) after the period of the job's latest row, if any."""
        if self.latest is not None and lo <= self.latest < hi:
            tail_start = utc_instant(self.sched.containing(self.latest).end)
            if tail_start < hi:
                return tail_start, hi
        return None

    # -- every: by counting

    def _deficits(self, cuts: list[datetime]) -> list[int]:
        """expected - present for each stretch between consecutive cuts (at most SPLIT)."""
        pairs = list(pairwise(cuts))
        done = self.rows.done_counts(pairs)
        out = []
        for (a, b), n in zip(pairs, done, strict=True):
            opened = bisect_left(self.open_starts, b) - bisect_left(self.open_starts, a)
            out.append(self.expected(a, b) - n - opened)
        return out

    def _search(self, a: datetime, b: datetime, deficit: int,
                backwards: bool) -> Iterator[Unit]:
        if deficit <= 0 or b <= a:
            return
        first = self.sched.containing(a)
        if deficit >= self.expected(a, b):  # nothing there at all
            yield from self._all(a, b, backwards)
            return
        if utc_instant(first.end) >= b:  # one period, some of its shards missing
            yield from self._shards_missing(first, backwards)
            return
        cuts = [a]
        for k in range(1, SPLIT):
            cut = utc_instant(self.sched.containing(a + (b - a) * k / SPLIT).start)
            if cut > cuts[-1]:
                cuts.append(cut)
        cuts.append(b)
        if len(cuts) == 2:  # too few periods to cut at instants: cut after the first one
            cuts = [a, utc_instant(first.end), b]
        stretches = [(x, y, lack) for (x, y), lack
                     in zip(pairwise(cuts), self._deficits(cuts), strict=True)]
        for x, y, lack in reversed(stretches) if backwards else stretches:
            yield from self._search(x, y, lack, backwards)

    def _all(self, a: datetime, b: datetime, backwards: bool) -> Iterator[Unit]:
        period = self.sched.containing(b - _US if backwards else a)
        while a <= utc_instant(period.start) < b:
            keys = shard_keys(period.key, self.shards)
            for key in reversed(keys) if backwards else keys:
                yield (period, key)
            period = self.sched.previous(period) if backwards else self.sched.next(period)

    def _shards_missing(self, period: Period, backwards: bool) -> Iterator[Unit]:
        start = utc_instant(period.start)
        have = self.rows.keys_at([start]).get(start, set())
        keys = [k for k in shard_keys(period.key, self.shards) if k not in have]
        for key in reversed(keys) if backwards else keys:
            yield (period, key)

    # -- cron: by walking the stretches between done rows

    def _walk(self, lo: datetime, hi: datetime) -> Iterator[Unit]:
        """Walk the stretches between done rows, skipping keys that have a failed or running
        row; with --shards, also the periods that lack some shards' rows."""
        first, breaks = self.rows.done_breaks(lo, hi)
        holes = []
        if first is None or first > lo:
            holes.append((lo, hi if first is None else first))
        for end, following in breaks:
            gap_end = hi if following is None else following
            if end < gap_end:
                holes.append((end, gap_end))
        have: dict[datetime, set[str]] = {}
        for start, key in self.open:
            have.setdefault(start, set()).add(key)
        if self.shards > 1:
            starts = self.rows.short_starts(lo, hi, self.shards, WALK_LIMIT)
            for start, keys in self.rows.keys_at(starts).items():
                have.setdefault(start, set()).update(keys)
            holes += [(at, at + _US) for at in starts]  # containing(at) is that period
            holes.sort()
        latest = datetime.min.replace(tzinfo=UTC)  # a short period may lie in a hole too
        for start, end in holes:
            period = self.sched.containing(start)
            while utc_instant(period.start) < end:
                at = utc_instant(period.start)
                if at > latest:
                    latest = at
                    for key in shard_keys(period.key, self.shards):
                        if key not in have.get(at, ()):
                            yield (period, key)
                period = self.sched.next(period)

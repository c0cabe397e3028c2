"""How many periods lie between two periods, counted without walking them (for reports).

`once status` and `once check` compare, per job, the number of periods that are due with the
number of rows the ledger holds for them; walking 10,000 periods through the period engine
costs about 150 ms a job, so this module counts them arithmetically instead, following the
engine's rules (once.periods' docstring) exactly:

* month, quarter, year: from the keys (2026-10 is month 2026 * 12 + 9);
* minute, Nm, hour, Nh, day, week: period starts are the instants at which the local clock
  reads a multiple of the unit (a week's multiples fall on Mondays), so between two changes of
  the zone's UTC offset they are multiples in local time; at each change, a spring-forward gap
  that swallows one or more multiples adds one boundary at the gap's end (unless the gap ends
  on a multiple, which is then counted already), and for day and week a fall-back that repeats
  midnight counts it only once.

The offset changes are found by probing the zone once a day (UTC midnights) and bisecting to
the second, cached per zone and year: two changes less than a day apart that cancel each other
are not seen (tzdata has none since 1970). Cron schedules have no such count: `count` returns
None and the caller walks only the gaps.

Standard library and once.periods only.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from once.periods import Period, Schedule

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_DAY = timedelta(days=1)
_US = timedelta(microseconds=1)
_US_PER_S = 1_000_000

# Local-clock units in microseconds, and where their multiples fall in local time counted
# from 1970-01-01T00:00 (a Thursday): weeks start on Mondays, four days later.
_CALENDAR_MONTHS = {"month": 1, "quarter": 3, "year": 12}
_WEEK_PHASE = 4 * 86400 * _US_PER_S


def count(sched: Schedule, first: Period, last: Period) -> int | None:
    """How many periods run from first to last, both included (0 if last is before first).

    None for a cron schedule, whose fire times have no closed form.
    """
    start, end = _utc(first.start), _utc(last.end)
    if _utc(last.start) < start:
        return 0
    if sched.kind != "every":
        return None
    months = _CALENDAR_MONTHS.get(sched.spec)
    if months:
        return _month_index(last.key, sched.spec) - _month_index(first.key, sched.spec) + 1
    unit, phase, calendar = _grid(sched.spec)
    return _boundaries(sched.tz, start, end, unit, phase, calendar)


def count_starts(sched: Schedule, start: datetime, end: datetime) -> int | None:
    """How many periods start in [start, end), two period boundaries; None for cron."""
    start, end = _utc(start), _utc(end)
    if end <= start:
        return 0
    if sched.kind != "every":
        return None
    if sched.spec in _CALENDAR_MONTHS:
        first, last = sched.containing(start), sched.containing(end - _US)
        return _month_index(last.key, sched.spec) - _month_index(first.key, sched.spec) + 1
    unit, phase, calendar = _grid(sched.spec)
    return _boundaries(sched.tz, start, end, unit, phase, calendar)


def _grid(spec: str) -> tuple[int, int, bool]:
    """(unit in microseconds, phase, whether a repeated multiple counts once)."""
    if spec == "day":
        return 86400 * _US_PER_S, 0, True
    if spec == "week":
        return 7 * 86400 * _US_PER_S, _WEEK_PHASE, True
    if spec in ("minute", "hour"):
        return (60 if spec == "minute" else 3600) * _US_PER_S, 0, False
    match = re.fullmatch(r"([0-9]+)([mh])", spec)
    if match is None:
        raise ValueError(f"not a clock spec: {spec!r}")
    return int(match[1]) * (60 if match[2] == "m" else 3600) * _US_PER_S, 0, False


def _month_index(key: str, spec: str) -> int:
    year = int(key[:4])
    if spec == "year":
        return year
    if spec == "quarter":
        return year * 4 + int(key[6:]) - 1
    return year * 12 + int(key[5:7]) - 1


def _boundaries(tz: ZoneInfo, start: datetime, end: datetime, unit: int, phase: int,
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


def changes(tz: ZoneInfo, start: datetime, end: datetime) -> list[tuple[datetime, int, int]]:
    """The zone's UTC offset changes in [start, end): (instant, offset before, offset after),
    offsets in microseconds."""
    found: list[tuple[datetime, int, int]] = []
    for year in range(start.year, end.year + 1):
        found.extend(c for c in _changes_in_year(tz, year) if start <= c[0] < end)
    return found


@lru_cache(maxsize=4096)
def _changes_in_year(tz: ZoneInfo, year: int) -> tuple[tuple[datetime, int, int], ...]:
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


def _switch(tz: ZoneInfo, lo: datetime, hi: datetime, before: int) -> datetime:
    """The first whole second in (lo, hi] whose offset differs from `before` (lo's)."""
    a, b = (lo - _EPOCH) // _SECOND, (hi - _EPOCH) // _SECOND
    while b - a > 1:
        middle = (a + b) // 2
        if _offset_us(tz, _EPOCH + middle * _SECOND) == before:
            a = middle
        else:
            b = middle
    return _EPOCH + b * _SECOND


def _offset_us(tz: ZoneInfo, instant: datetime) -> int:
    offset = instant.astimezone(tz).utcoffset()
    return (offset // _US) if offset is not None else 0


def _us(instant: datetime) -> int:
    return (instant - _EPOCH) // _US


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)

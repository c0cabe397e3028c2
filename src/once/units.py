"""The units `--every` takes, one record each, in one registry (UNITS).

Everything once knows of a unit is its record: the engine (once.periods) cuts time by it, the
gap count (once.gaps) counts by it, the reports draw it and pick its window by it, and
completion offers its word. A new unit is one record here plus rows in the tests' tables;
no other module names a unit. The rules a record's fields follow are docs/concepts/periods.md.

Pure and cheap, it runs on every cron fire: Frozen records, key patterns left to re's cache.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from datetime import date, datetime, timedelta
from typing import NoReturn

from once.frozen import Frozen

CLOCK = "clock"  # boundaries where the local clock reads a multiple of the length
CALENDAR = "calendar"  # a period starts at its first date's first instant

# The drawings of `once status --timeline` (once.report.timeline): a column per week and a
# row per weekday; a row per local day, or per local hour, with a cell per period at its
# wall-clock slot; a strip of cells wrapped into lines.
GRID, DAYS, HOURS, STRIP = "grid", "days", "hours", "strip"

_ZERO = timedelta(0)
_MONDAY = date(1970, 1, 5)  # the first Monday after the epoch: where weeks are counted from

# A clock key is its period's local start to the minute with its UTC offset (seconds only
# for the odd pre-1972 offset that has them).
CLOCK_KEY = (r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?"
             r"[+-][0-9]{2}:[0-9]{2}(:[0-9]{2})?")


def clock_key(start: datetime) -> str:
    return start.isoformat(timespec="seconds" if start.second else "minutes")


def _by_start(_: object) -> NoReturn:
    raise TypeError("a clock unit keys a period by its start instant: clock_key")


class Unit(Frozen):
    name: str  # the --every word
    kind: str  # CLOCK or CALENDAR
    length: timedelta  # CLOCK: a period (it divides a day); CALENDAR: its days, 0 for months
    months: int  # CALENDAR counted in months (they divide a year, from January); else 0
    anchor: date  # CALENDAR counted in days: a date a period starts on
    pattern: str  # the regex its keys match; CALENDAR: its groups are read by `first`
    key: Callable[[date], str]  # CALENDAR: the key of the period that starts on a date
    first: Callable[[Sequence[int]], date]  # CALENDAR: the date a key's groups name
    timeline: str  # its drawing: GRID, DAYS, HOURS or STRIP
    strip: int  # STRIP: cells a line
    last: int  # how many periods `once status --timeline` draws without --last
    offered: bool  # completion offers it (not 1m, 60m, 1h, 24h: spellings of another unit)

    def __init__(self, name: str, kind: str, *, length: timedelta = _ZERO, months: int = 0,
                 anchor: date = _MONDAY, pattern: str = CLOCK_KEY,
                 key: Callable[[date], str] = _by_start,
                 first: Callable[[Sequence[int]], date] = _by_start,
                 timeline: str = STRIP, strip: int = 60, last: int = 60,
                 offered: bool = True) -> None:
        self._set(name=name, kind=kind, length=length, months=months, anchor=anchor,
                  pattern=pattern, key=key, first=first, timeline=timeline, strip=strip,
                  last=last, offered=offered)

    def first_date(self, key: str) -> date | None:
        """A CALENDAR key's first date; None if the key has the wrong form. Raises ValueError
        for a key of the right form that names no date (2026-13, 2026-W54)."""
        match = re.fullmatch(self.pattern, key)
        if match is None:
            return None
        return self.first([int(group) for group in match.groups()])


def clock(name: str, minutes: int, offered: bool = True) -> Unit:
    """A clock unit of `minutes`: from an hour up, drawn a row per local day and seven days
    of them by default; below, a row per local hour and six hours (a minute's: three)."""
    last = 180 if minutes == 1 else (7 * 24 * 60 if minutes >= 60 else 6 * 60) // minutes
    return Unit(name, CLOCK, length=timedelta(minutes=minutes), last=last, offered=offered,
                timeline=DAYS if minutes >= 60 else HOURS)


def _week(first: date) -> str:
    year, week, _ = first.isocalendar()
    return f"{year:04d}-W{week:02d}"


_CALENDAR_UNITS = (
    Unit("day", CALENDAR, length=timedelta(days=1), pattern=r"([0-9]{4})-([0-9]{2})-([0-9]{2})",
         key=date.isoformat, first=lambda g: date(g[0], g[1], g[2]), timeline=GRID,
         last=91),
    Unit("week", CALENDAR, length=timedelta(days=7), anchor=_MONDAY,
         pattern=r"([0-9]{4})-W([0-9]{2})", key=_week,
         first=lambda g: date.fromisocalendar(g[0], g[1], 1), strip=52, last=52),
    Unit("month", CALENDAR, months=1, pattern=r"([0-9]{4})-([0-9]{2})",
         key=lambda d: f"{d.year:04d}-{d.month:02d}", first=lambda g: date(g[0], g[1], 1),
         strip=12, last=24),
    Unit("quarter", CALENDAR, months=3, pattern=r"([0-9]{4})-Q([0-9])",
         key=lambda d: f"{d.year:04d}-Q{(d.month - 1) // 3 + 1}",
         first=lambda g: date(g[0], 3 * g[1] - 2, 1), strip=4, last=12),
    Unit("year", CALENDAR, months=12, pattern=r"([0-9]{4})", key=lambda d: f"{d.year:04d}",
         first=lambda g: date(g[0], 1, 1), strip=10, last=10),
)


def _clock_units() -> Iterator[Unit]:
    """minute, every N minutes that divides an hour, hour, every N hours that divides a day;
    then the spellings that say what another says (1m, 60m, 1h) and 24h (a day of clock
    periods, keyed as hours are), which completion does not offer."""
    yield clock("minute", 1)
    yield from (clock(f"{n}m", n) for n in range(2, 60) if 60 % n == 0)
    yield clock("hour", 60)
    yield from (clock(f"{n}h", 60 * n) for n in range(2, 24) if 24 % n == 0)


UNITS: dict[str, Unit] = {unit.name: unit for unit in (
    *_clock_units(), *_CALENDAR_UNITS, clock("1m", 1, offered=False),
    clock("60m", 60, offered=False), clock("1h", 60, offered=False),
    clock("24h", 24 * 60, offered=False))}

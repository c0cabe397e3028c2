"""Periods: which period an instant falls in, and the key the ledger stores it under.

A schedule cuts time into periods, half-open intervals [start, end) that tile the time line
(each period ends where the next starts), following the wall clock of an IANA time zone.
This module is pure, no I/O and no database, and imports only the standard library at
import time: it runs on every cron fire. Cron schedules live in once.cron, imported (with
cronsim) when one is built.

The rules are the README's "Periods"; daylight saving time forces these choices:

* Calendar specs (day, week, month, quarter, year). A period starts at the first instant at
  which the local date is its first date or later: local midnight, or, where the clock skips
  midnight (America/Santiago 2026-09-06, Asia/Beirut every last Sunday of March), the first
  instant after the gap, 01:00. Where midnight occurs twice (America/Havana 2026-11-01) the
  first one counts. A date the zone skips altogether (Pacific/Apia 2011-12-30) has no period
  and no key: 2011-12-29 ends where 2011-12-31 starts.
* Clock specs (minute, Nm, hour, Nh). Boundaries are the instants at which the local clock
  reads a multiple of the unit counted from local midnight (6h: 00:00, 06:00, 12:00, 18:00).
  A wall time that occurs twice is a boundary both times, so the hour repeated at a fall-back
  gives two hourly periods, keyed 2026-11-01T01:00-04:00 then 2026-11-01T01:00-05:00 in
  America/New_York. A boundary that falls in a spring-forward gap moves to the first instant
  after the gap, and all the boundaries in one gap become one: in New York the 01:00 hour ends
  at 03:00 EDT, no period is keyed 02:00 and none is empty.
  A period whose start was moved out of a DST gap is keyed by its actual local start: on
  Australia/Lord_Howe the clock jumps from 02:00 to 02:30, so the hourly periods there are
  [01:00, 02:30) keyed ...T01:00+10:30 and [02:30, 03:00) keyed ...T02:30+11:00.
* Cron. A period runs from a fire time to the next one, and an instant exactly on a fire
  time starts that fire time's period. cronsim parses the expression and matches dates; the
  fire times are computed (in once.cron) from the zone's offsets, as Debian cron fires: a
  fixed time (`30 1 * * *`) fires once, the first time the clock reads it (once in a
  repeated hour) or, if a gap skips it, at the end of the gap; an expression with `*` in its
  minute or hour field (`*/30 * * * *`) follows the clock, firing at every instant the clock
  reads a time it names (in both passes of a repeated hour, not in a gap). cronsim's own
  walk through time hung or skipped fire times where the offset changes by less than an hour.
* Keys: 2026 (year), 2026-Q4, 2026-10 (month), 2026-W44 (ISO year and week), 2026-10-27
  (day); clock and cron specs use the local start to the minute with its UTC offset,
  2026-10-27T10:00+01:00 (seconds show only for the odd pre-1972 offset that has them).
* A local time given without an offset (a date, or --from 2026-03-08T02:30) means the first
  instant at which the zone's clock reads that time or later: the first of two, or the end of
  the gap that skips it.

Period.start and Period.end are aware datetimes in the schedule's zone. Python compares and
subtracts two datetimes that share a tzinfo by their wall times, ignoring fold, so 01:30 EDT
sorts after 01:00 EST: convert to UTC first. This module works in UTC throughout.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, tzinfo

from once import limits
from once.frozen import Frozen

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ZERO = timedelta(0)
_SECOND = timedelta(seconds=1)
_TICK = timedelta(microseconds=1)
# An instant for the example keys in error messages.
_EXAMPLE = datetime(2026, 10, 27, 9, 0, tzinfo=UTC)


class SpecError(ValueError):
    """A bad spec, zone, key, time or duration; the message is one line for the user."""


class Period(Frozen):
    key: str  # the ledger's key
    start: datetime  # aware, in the schedule's zone
    end: datetime  # exclusive: the next period's start

    def __init__(self, key: str, start: datetime, end: datetime) -> None:
        self._set(key=key, start=start, end=end)


def zone(name: str) -> tzinfo:
    """The IANA zone `name`. UTC, the default, is datetime's own: the same offset (zero) at every
    instant, so the same periods and keys, without importing zoneinfo (and the sysconfig it
    loads to find the zone files) on every fire of a job that runs in UTC."""
    if name == "UTC":
        return UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: a malformed name or a file that is not a zone; OSError: a directory.
        raise SpecError(f"unknown time zone {name!r}") from None


def iso(dt: datetime) -> str:
    """ISO 8601 to the second with the UTC offset: 2026-10-27T00:00:00+01:00."""
    return dt.isoformat(timespec="seconds")


def utc_instant(instant: datetime) -> datetime:
    """The same instant in UTC, for comparing instants of any zones; a naive datetime is
    refused (a time as a driver hands it back is once.ledger.from_db_time's)."""
    if instant.tzinfo is None:
        # astimezone() would read it in the machine's zone: never what a schedule means.
        raise ValueError(f"naive datetime {instant}: periods need an aware one")
    return instant.astimezone(UTC)


def _clock_key(start: datetime) -> str:
    return start.isoformat(timespec="seconds" if start.second else "minutes")


# Patterns that only a key given by hand needs are left to re's cache, compiled on first use
# (not at import, which every cron fire pays).
_CLOCK_KEY = (r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?"
              r"[+-][0-9]{2}:[0-9]{2}(:[0-9]{2})?")


def _clock_key_instant(key: str) -> datetime | None:
    if not re.fullmatch(_CLOCK_KEY, key):
        return None
    return utc_instant(datetime.fromisoformat(key))


class Schedule(ABC):
    """Cuts time into periods; see the module docstring for the rules."""

    kind: str  # "every" or "cron"
    spec: str  # "day", "15m", or the cron expression as given
    tz: tzinfo  # zone(tz_name)
    tz_name: str  # the IANA name as given

    def __init__(self, spec: str, tz_name: str) -> None:
        self.spec = spec
        self.tz_name = tz_name
        self.tz = zone(tz_name)

    def __str__(self) -> str:
        spec = self.spec if self.kind == "every" else repr(self.spec)
        return f"{self.kind} {spec}, {self.tz_name}"

    def __repr__(self) -> str:
        return f"<Schedule {self}>"

    @abstractmethod
    def containing(self, instant: datetime) -> Period:
        """The period with start <= instant < end; instant is aware, in any zone."""

    @abstractmethod
    def _key_instant(self, key: str) -> datetime | None:
        """An instant in the period a key names; None if the key has the wrong form.

        Raises ValueError for a key of the right form that names no date (2026-13).
        """

    def next(self, period: Period) -> Period:
        return self.containing(period.end)

    def previous(self, period: Period) -> Period:
        return self.containing(utc_instant(period.start) - _TICK)

    def shifted(self, period: Period, n: int) -> Period:
        """The period n periods later (n < 0: earlier)."""
        step = self.next if n > 0 else self.previous
        for _ in range(abs(n)):
            period = step(period)
        return period

    def from_key(self, key: str) -> Period:
        try:
            instant = self._key_instant(key)
            period = None if instant is None else self.containing(instant)
        except (ValueError, OverflowError):  # the key's form, no such date: 2026-13, 2026-W54
            raise SpecError(f"no period {key!r} in {self}") from None
        if period is None:
            raise SpecError(
                f"bad period key {key!r} for {self}: keys look like {self._example_key()}"
            )
        # The key must name its period exactly, not just an instant in it: this rejects a
        # skipped date, an hour that does not start on the hour, an offset the zone did not use.
        if period.key != key:
            raise SpecError(f"no period {key!r} in {self}")
        return period

    def between(self, first: Period, last: Period) -> Iterator[Period]:
        """first, the periods after it, ..., last (inclusive); nothing if last is before first."""
        stop = utc_instant(last.start)
        period = first
        while utc_instant(period.start) <= stop:
            yield period
            period = self.next(period)

    def overlapping(self, start: datetime, end: datetime) -> Iterator[Period]:
        """The periods that overlap [start, end), in order."""
        stop = utc_instant(end)
        if utc_instant(start) >= stop:
            return
        period = self.containing(start)
        while utc_instant(period.start) < stop:
            yield period
            period = self.next(period)

    def resolve(self, text: str) -> Period:
        """The period a key names, or the one containing a date's first instant or an instant."""
        instant = self.parse_instant(text)
        try:
            return self.containing(instant)
        except OverflowError:
            raise SpecError(f"{text!r} is out of range") from None

    def parse_instant(self, text: str) -> datetime:
        """An ISO 8601 datetime (without an offset: read in the zone), a date (its first
        instant in the zone) or a period key (the period's start), in the schedule's zone."""
        try:
            parsed = datetime.fromisoformat(text)  # also a date: its midnight, naive
        except ValueError:
            pass
        else:
            try:
                if parsed.tzinfo is None:
                    return self._first_instant(parsed).astimezone(self.tz)
                return parsed.astimezone(self.tz)
            except OverflowError:
                raise SpecError(f"{text!r} is out of range") from None
        try:
            is_key = self._key_instant(text) is not None
        except (ValueError, OverflowError):
            is_key = True  # the key's form: from_key explains what is wrong with it
        if not is_key:
            raise SpecError(
                f"bad time {text!r}: use an ISO 8601 date or datetime, "
                f"or a period key like {self._example_key()}"
            )
        return self.from_key(text).start

    def _example_key(self) -> str:
        return self.containing(_EXAMPLE).key

    # -- the zone's clock: everything in UTC, since local wall times repeat and skip -------

    def _offset(self, instant: datetime) -> timedelta:
        return instant.astimezone(self.tz).utcoffset() or _ZERO  # a zone always has one

    def _first_instant(self, wall: datetime) -> datetime:
        """The first instant at which the local clock reads `wall` (naive) or later."""
        first = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        if first <= second:  # wall occurs once, or twice and fold 0 is the first time
            return first
        # wall falls in a gap: fold 0 reads it with the offset before the gap, fold 1 with
        # the one after, and the clock jumps over it at the change between the two.
        return self._switch(second, first)

    def _switch(self, lo: datetime, hi: datetime) -> datetime:
        """The instant in (lo, hi] at which the UTC offset changes from lo's; hi's differs.

        Bisection on whole seconds (zone transitions fall on whole seconds): at most 17
        steps for a one-day window, instead of a scan.
        """
        a, b = (lo - _EPOCH) // _SECOND, (hi - _EPOCH) // _SECOND
        before = self._offset(_EPOCH + a * _SECOND)
        while b - a > 1:
            middle = (a + b) // 2
            if self._offset(_EPOCH + middle * _SECOND) == before:
                a = middle
            else:
                b = middle
        return _EPOCH + b * _SECOND


class _Clock(Schedule):
    """minute, Nm, hour, Nh: boundaries where the local clock reads a multiple of the unit."""

    kind = "every"

    def __init__(self, spec: str, tz_name: str, unit: timedelta) -> None:
        super().__init__(spec, tz_name)
        self.unit = unit

    def containing(self, instant: datetime) -> Period:
        at = utc_instant(instant)
        start = self._boundary_at_or_before(at).astimezone(self.tz)
        end = self._boundary_after(at).astimezone(self.tz)
        return Period(_clock_key(start), start, end)

    def _key_instant(self, key: str) -> datetime | None:
        return _clock_key_instant(key)

    def _floor(self, wall: datetime) -> datetime:
        """The latest multiple of the unit at or before a wall time (the unit divides a day)."""
        midnight = wall.replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight + (wall - midnight) // self.unit * self.unit

    def _boundary_at_or_before(self, at: datetime) -> datetime:
        """The latest boundary <= at: the multiple the clock last read, if the offset has not
        changed since; else the offset change, if it is a boundary; else look before it."""
        while True:
            local = at.astimezone(self.tz)
            offset = local.utcoffset() or _ZERO
            floor = (self._floor(local.replace(tzinfo=None)) - offset).replace(tzinfo=UTC)
            if self._offset(floor) == offset:
                return floor  # (two offset changes within one unit do not happen)
            switch = self._switch(floor, at)
            if self._is_boundary(switch):
                return switch
            at = switch - _SECOND  # boundaries fall on whole seconds: none in between

    def _boundary_after(self, at: datetime) -> datetime:
        """The earliest boundary > at: the next multiple in the current offset, unless the
        offset changes first; then that change, if it is a boundary, else look after it."""
        while True:
            local = at.astimezone(self.tz)
            offset = local.utcoffset() or _ZERO
            wall = local.replace(tzinfo=None)
            ceiling = (self._floor(wall) + self.unit - offset).replace(tzinfo=UTC)
            if self._offset(ceiling) == offset:
                return ceiling
            switch = self._switch(at, ceiling)
            if self._is_boundary(switch):
                return switch
            at = switch

    def _is_boundary(self, switch: datetime) -> bool:
        """Whether the clock, changing offset at `switch`, lands on or jumps over a multiple."""
        before = (switch + self._offset(switch - _SECOND)).replace(tzinfo=None)
        after = (switch + self._offset(switch)).replace(tzinfo=None)
        multiple = self._floor(after)
        # Landing on one: a fall-back to 01:00. Jumping over one (or several, which become
        # this one boundary): a spring-forward from 02:00 to 03:00, a skipped day.
        return multiple == after or multiple >= before


# Calendar units: how many months or days a period spans, and its key's form.
_MONTHS = {"month": 1, "quarter": 3, "year": 12}
_DAYS = {"day": 1, "week": 7}
_CALENDAR_KEYS = {
    "day": r"([0-9]{4})-([0-9]{2})-([0-9]{2})",
    "week": r"([0-9]{4})-W([0-9]{2})",
    "month": r"([0-9]{4})-([0-9]{2})",
    "quarter": r"([0-9]{4})-Q([0-9])",
    "year": r"([0-9]{4})",
}


class _Calendar(Schedule):
    """day, week, month, quarter, year: a period starts at its first date's first instant."""

    kind = "every"

    def __init__(self, spec: str, tz_name: str) -> None:
        super().__init__(spec, tz_name)
        self.months = _MONTHS.get(spec, 0)
        self.days = _DAYS.get(spec, 0)

    def containing(self, instant: datetime) -> Period:
        at = utc_instant(instant)
        first = self._floor(at.astimezone(self.tz).date())
        start = self._start(first)
        # The local date runs backwards only at the odd pre-1990 date-line move, but then the
        # period containing `at` is not the one its local date names: step to it.
        while start > at:
            first = self._step(first, -1)
            start = self._start(first)
        end = self._start(self._step(first, 1))
        while end <= at:
            first = self._step(first, 1)
            start, end = end, self._start(self._step(first, 1))
        return Period(self._key(first), start.astimezone(self.tz), end.astimezone(self.tz))

    def _start(self, first: date) -> datetime:
        return self._first_instant(datetime(first.year, first.month, first.day))

    def _floor(self, day: date) -> date:
        """The first date of the period a date belongs to."""
        if self.months:
            return date(day.year, (day.month - 1) // self.months * self.months + 1, 1)
        if self.days == 7:
            return day - timedelta(days=day.weekday())  # back to Monday
        return day

    def _step(self, first: date, n: int) -> date:
        if self.months:
            index = first.year * 12 + first.month - 1 + n * self.months
            return date(index // 12, index % 12 + 1, 1)
        return first + timedelta(days=n * self.days)

    def _key(self, first: date) -> str:
        if self.spec == "day":
            return first.isoformat()
        if self.spec == "week":
            year, week, _ = first.isocalendar()
            return f"{year:04d}-W{week:02d}"
        if self.spec == "month":
            return f"{first.year:04d}-{first.month:02d}"
        if self.spec == "quarter":
            return f"{first.year:04d}-Q{(first.month - 1) // 3 + 1}"
        return f"{first.year:04d}"

    def _key_instant(self, key: str) -> datetime | None:
        match = re.fullmatch(_CALENDAR_KEYS[self.spec], key)
        if match is None:
            return None
        year, *rest = (int(group) for group in match.groups())
        if self.spec == "day":
            first = date(year, rest[0], rest[1])
        elif self.spec == "week":
            first = date.fromisocalendar(year, rest[0], 1)
        elif self.spec == "month":
            first = date(year, rest[0], 1)
        elif self.spec == "quarter":
            first = date(year, 3 * rest[0] - 2, 1)
        else:
            first = date(year, 1, 1)
        return self._start(first)


def _clock_unit(spec: str) -> timedelta:
    if spec in ("minute", "hour"):
        return timedelta(minutes=1 if spec == "minute" else 60)
    match = re.fullmatch(r"(0|[1-9][0-9]{0,3})([mh])", spec)
    if match is None:
        raise SpecError(
            f"--every {spec!r}: use minute, Nm (N divides 60), hour, "
            "Nh (N divides 24), day, week, month, quarter or year"
        )
    n, minutes = int(match[1]), match[2] == "m"
    if n == 0 or (60 if minutes else 24) % n:
        raise SpecError(
            f"--every {spec}: minutes must divide 60"
            if minutes
            else f"--every {spec}: hours must divide 24"
        )
    return timedelta(minutes=n) if minutes else timedelta(hours=n)


def every(spec: str, tz: str) -> Schedule:
    return _every(spec, tz)


def _every(spec: str, tz: str) -> Schedule:
    if spec in _CALENDAR_KEYS:
        return _Calendar(spec, tz)
    return _Clock(spec, tz, _clock_unit(spec))


def cron(expr: str, tz: str) -> Schedule:
    from once.cron import CronSchedule  # here: `--every` schedules never load it

    return CronSchedule(expr, tz)


def schedule(every: str | None, cron: str | None, tz: str) -> Schedule:
    """The schedule of exactly one of --every and --cron."""
    if every is not None and cron is not None:
        raise SpecError("use --every or --cron, not both")
    if every is not None:
        return _every(every, tz)  # `every` the function is shadowed here
    if cron is not None:
        from once.cron import CronSchedule

        return CronSchedule(cron, tz)
    raise SpecError("use --every SPEC or --cron EXPR")


_DURATION = re.compile(r"([0-9]+)|(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")


# The longest duration: timers past about 292 years overflow the OS's (select, waits), and
# a timestamp that far back or ahead leaves the calendar.
DURATION_MAX = limits.DURATION_MAX


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "5m", "2h", "1d" or "1h30m"; more than zero, at most 36500d."""
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise SpecError(f"bad duration {text!r}: use 90, 90s, 5m, 2h, 1d or 1h30m")
    plain, days, hours, minutes, seconds = (int(group or 0) for group in match.groups())
    total = plain + 86400 * days + 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise SpecError(f"bad duration {text!r}: it must be more than zero")
    if total > DURATION_MAX:
        raise SpecError(f"bad duration {text!r}: at most 36500d (100 years)")
    return float(total)

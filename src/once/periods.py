"""Periods: which period an instant falls in, and the key the ledger stores it under.

A schedule cuts time into half-open periods [start, end) that tile the time line along the
wall clock of an IANA time zone. Pure (no I/O, no database, the standard library at import
time): it runs on every cron fire. It holds the `--every` schedules and what every schedule
shares; cron schedules build on it in once.cron, and once.schedules picks one of the two.

The rules, and the choices daylight saving time forces (a midnight or an hour skipped or
repeated, a date a zone skips, a period keyed by its actual local start, cron fire times as
Debian cron fires), are docs/concepts/periods.md; tests/unit/test_periods_table.py numbers
them. Period.start and Period.end are aware datetimes in the schedule's zone, which Python
compares by wall time, ignoring fold: this module works in UTC throughout.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, tzinfo

from once import limits
from once.frozen import Frozen
from once.units import CALENDAR, CLOCK_KEY, UNITS, Unit, clock_key

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
        raise SpecError(f"unknown time zone {name!r}{_zone_hint(name)}") from None


def _zone_hint(name: str) -> str:
    """`: did you mean 'Europe/Berlin'?` for a name close to a zone's ('' for none); only on
    the error path (listing the zones reads tzdata's index)."""
    from difflib import get_close_matches
    from zoneinfo import available_timezones

    zones = available_timezones() - {"localtime", "posixrules", "Factory"}
    folded = {zone.lower(): zone for zone in zones}
    close = [folded[name.lower()]] if name.lower() in folded else get_close_matches(
        name, zones, n=1, cutoff=0.75)
    return f": did you mean {close[0]!r}?" if close else ""


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


def _clock_key_instant(key: str) -> datetime | None:
    # The pattern is left to re's cache, compiled when a key is given by hand (not at import,
    # which every cron fire pays).
    if not re.fullmatch(CLOCK_KEY, key):
        return None
    return utc_instant(datetime.fromisoformat(key))


class Schedule(ABC):
    """Cuts time into periods; see the module docstring for the rules."""

    kind: str  # "every" or "cron"
    spec: str  # "day", "15m", or the cron expression as given
    tz: tzinfo  # zone(tz_name)
    tz_name: str  # the IANA name as given
    # What one period spans, for what draws or counts periods (the reports, once.gaps), so
    # that none parses a spec again: the unit's record (once.units); a cron schedule has none.
    # minutes: a clock unit's length in minutes; calendar: a calendar unit's name.
    unit: Unit | None = None
    minutes: int = 0
    calendar: str = ""

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
        """first, the periods after it, ..., last (inclusive); nothing if last is before first
        (the tests' and the torture's walk from one key to another)."""
        return self.overlapping(first.start, last.end)

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

    def __init__(self, spec: str, tz_name: str, unit: Unit) -> None:
        super().__init__(spec, tz_name)
        self.unit = unit
        self.length = unit.length
        self.minutes = unit.length // timedelta(minutes=1)

    def containing(self, instant: datetime) -> Period:
        at = utc_instant(instant)
        start = self._boundary_at_or_before(at).astimezone(self.tz)
        end = self._boundary_after(at).astimezone(self.tz)
        return Period(clock_key(start), start, end)

    def _key_instant(self, key: str) -> datetime | None:
        return _clock_key_instant(key)

    def _floor(self, wall: datetime) -> datetime:
        """The latest multiple of the unit at or before a wall time (the unit divides a day)."""
        midnight = wall.replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight + (wall - midnight) // self.length * self.length

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
            ceiling = (self._floor(wall) + self.length - offset).replace(tzinfo=UTC)
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


class _Calendar(Schedule):
    """day, week, month, quarter, year: a period starts at its first date's first instant."""

    kind = "every"

    def __init__(self, spec: str, tz_name: str, unit: Unit) -> None:
        super().__init__(spec, tz_name)
        self.unit = self.record = unit
        self.calendar = spec
        self.months = unit.months
        self.days = unit.length.days

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
        if self.days == 1:
            return day
        return day - timedelta(days=(day - self.record.anchor).days % self.days)  # week: Monday

    def _step(self, first: date, n: int) -> date:
        if self.months:
            index = first.year * 12 + first.month - 1 + n * self.months
            if not 1 <= index // 12 <= 9999:  # as date arithmetic says it for days and weeks
                raise OverflowError("date value out of range")
            return date(index // 12, index % 12 + 1, 1)
        return first + timedelta(days=n * self.days)

    def _key(self, first: date) -> str:
        return self.record.key(first)

    def _key_instant(self, key: str) -> datetime | None:
        first = self.record.first_date(key)
        return None if first is None else self._start(first)


def _unit(spec: str) -> Unit:
    """The unit's record (once.units); for a spec that names none, the error that says why."""
    unit = UNITS.get(spec)
    if unit is not None:
        return unit
    match = re.fullmatch(r"(0|[1-9][0-9]{0,3})([mh])", spec)
    if match is None:
        *others, last = (u.name for u in UNITS.values() if u.kind == CALENDAR)
        raise SpecError(f"--every {spec!r}: use minute, Nm (N divides 60), hour, "
                        f"Nh (N divides 24), {', '.join(others)} or {last}{_every_hint(spec)}")
    raise SpecError(f"--every {spec}: minutes must divide 60" if match[2] == "m"
                    else f"--every {spec}: hours must divide 24")


# How people spell a length that --every spells otherwise: 5min, 2hours, daily.
_SPELLED = re.compile(r"\s*([0-9]+)\s*(m|min|mins|minute|minutes|h|hr|hrs|hour|hours)\s*",
                      re.IGNORECASE)
_ADVERBS = {"minutely": "minute", "hourly": "hour", "daily": "day", "weekly": "week",
            "monthly": "month", "quarterly": "quarter", "yearly": "year", "annually": "year"}


def _every_hint(spec: str) -> str:
    """`; did you mean '5m'?` for a spelling of a length --every takes ('' for none)."""
    from difflib import get_close_matches

    word = spec.strip().lower()
    spelled = _SPELLED.fullmatch(word)
    if spelled:
        guess = f"{int(spelled[1])}{spelled[2][0]}"
    else:
        names = [name for name in UNITS if name.isalpha()]
        close = get_close_matches(word.rstrip("s"), names, n=1, cutoff=0.6) \
            if word.isalpha() and len(word) > 2 else []
        guess = _ADVERBS.get(word) or (close[0] if close else "")
    return f"; did you mean {guess!r}?" if guess and guess != spec else ""


def every_specs(every_spelling: bool = False) -> tuple[str, ...]:
    """The specs --every takes, as once.units lists them: those completion offers, then with
    every_spelling those that say what another says (1m, 60m, 1h, 24h)."""
    offered = tuple(name for name, unit in UNITS.items() if unit.offered)
    if not every_spelling:
        return offered
    return (*offered, *(name for name, unit in UNITS.items() if not unit.offered))


def every(spec: str, tz: str) -> Schedule:
    """The schedule of `--every SPEC`."""
    unit = _unit(spec)
    if unit.kind == CALENDAR:
        return _Calendar(spec, tz, unit)
    return _Clock(spec, tz, unit)


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

"""Cron schedules: a period runs from one fire time of a five-field cron expression to the
next, the fire times computed from the zone's offsets (the rules: once.periods' docstring,
"Cron"). The cron part of the period engine, and as pure (no I/O): it imports the standard
library, once.periods and, when it parses an expression, cronsim. once.schedules imports it
when it builds a cron schedule, so that `--every` schedules load neither it nor cronsim.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta

# periods' own helpers: this module is the cron part of the same engine.
from once.periods import (
    _ZERO,
    Period,
    Schedule,
    SpecError,
    _clock_key_instant,
    iso,
    utc_instant,
)
from once.units import clock_key

_MINUTE = timedelta(minutes=1)

# The nicknames Debian's cron and Kubernetes CronJobs take, as the five fields they stand for:
# the ledger stores the fields (every version of once reads them, and one job fired as
# `@daily` on one host and `0 0 * * *` on another has one schedule).
ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@hourly": "0 * * * *"}


def expand(expr: str) -> str:
    """The five fields of a nickname (`@daily`), else `expr` as given; SpecError for a
    nickname that names no period (`@reboot`) or none at all."""
    word = expr.strip().lower()
    if not word.startswith("@"):
        return expr
    if word == "@reboot":
        raise SpecError("--cron @reboot: a boot is no period; start the command from the "
                        "host's boot (a systemd unit), or under `once lead` if one replica "
                        "of many must run it")
    if word not in ALIASES:
        raise SpecError(f"--cron {expr!r}: unknown nickname; use one of "
                        f"{', '.join(sorted(ALIASES))} or five fields")
    return ALIASES[word]


# Forms of other crons that this one refuses, and what to write instead (docs/concepts/
# periods.md, "The cron dialect").
_FIELDS = {"minute": (0, 59), "hour": (0, 23), "day-of-month": (1, 31), "month": (1, 12),
           "day-of-week": (0, 6)}


def _unsupported(fields: list[str]) -> str:
    """Why an expression cronsim refused uses another cron's form ('' for none known)."""
    for (name, (first, last)), field in zip(_FIELDS.items(), fields, strict=True):
        for part in field.split(","):
            if part == "?":
                return f"? in the {name} field is Quartz's: write *"
            if part.upper().startswith("H"):
                return f"H in the {name} field (a hash, Jenkins') is not cron: give a value"
            if name == "day-of-month" and part.upper().endswith("W") and part.upper() != "LW":
                return "W (the weekday nearest a day) is not taken: LW (the month's last " \
                       "weekday) is, or list the days"
            low, dash, high = part.partition("/")[0].partition("-")
            if dash and low.isdigit() and high.isdigit() and int(low) > int(high):
                return (f"the {name} range {low}-{high} wraps around: write it as two, "
                        f"{low}-{last},{first}-{high}")
    return ""


class CronSchedule(Schedule):
    """A period runs from a fire time of a five-field cron expression to the next one.

    cronsim parses the expression and says which local dates it matches; the fire times are
    computed here, exactly, from the zone's offsets. (cronsim's own walk through time hangs,
    or skips fire times, where a zone's offset changes by less than an hour: Asia/Colombo
    2006-04-15, Australia/Lord_Howe twice a year.) Every evaluation is bounded: one date at a
    time for at most YEARS years, each date's fire times found by bisecting the sorted
    hour:minute list when its offset does not change that day, and by at most two conversions
    per hour:minute when it does. A period is (the latest fire time <= instant, the earliest
    after it), so periods tile time by construction.
    """

    kind = "cron"
    YEARS = 50  # as cronsim: an expression that does not fire within 50 years never fires

    def __init__(self, expr: str, tz_name: str) -> None:
        expr = expand(expr)
        super().__init__(expr, tz_name)
        from cronsim import CronSim, CronSimError  # here, not at the top: importing it costs 12 ms

        fields = expr.split()
        if len(fields) != 5:
            raise SpecError(
                f"--cron {expr!r}: use five fields, minute hour day-of-month month day-of-week"
            )
        try:
            parsed = CronSim(expr, datetime(2000, 1, 1))
        except CronSimError as exc:
            raise SpecError(f"--cron {expr!r}: {_unsupported(fields) or str(exc).lower()}") \
                from None
        self._months = frozenset(parsed.months)
        self._matches: Callable[[date], bool] = parsed.match_day
        # The local times it fires at, in minutes after midnight, sorted.
        self._times = sorted(60 * hour + minute for hour in parsed.hours
                             for minute in parsed.minutes)
        # As Debian cron: `*` in the minute or hour field follows the clock (both passes of a
        # repeated hour, nothing in a gap); a fixed time fires at its first instant (once in a
        # repeated hour, at the end of a gap that skips it).
        self._follows_clock = fields[0].startswith("*") or fields[1].startswith("*")
        self._plans: dict[date, datetime | list[datetime]] = {}  # see _plan

    def containing(self, instant: datetime) -> Period:
        at = utc_instant(instant)
        start = self._fire(at, backwards=True).astimezone(self.tz)
        end = self._fire(at, backwards=False).astimezone(self.tz)
        return Period(clock_key(start), start, end)

    def _key_instant(self, key: str) -> datetime | None:
        return _clock_key_instant(key)

    def _fire(self, at: datetime, backwards: bool) -> datetime:
        """The latest fire time <= at (backwards), else the earliest one > at; in UTC.

        Dates are tried from the one before at's local date (after it, backwards), up to the
        one after the first date that has an answer: a fall-back across midnight can put a
        date's fire times before the previous date's last ones.
        """
        step = timedelta(days=-1 if backwards else 1)
        found: datetime | None = None
        stop: date | None = None
        for day in self._dates(at.astimezone(self.tz).date() - step, backwards):
            if stop is not None and (day < stop if backwards else day > stop):
                break
            fire = self._on(day, at, backwards)
            if fire is not None and (found is None or (fire > found if backwards
                                                       else fire < found)):
                found = fire
                stop = stop or day + step
        if found is None:
            where = "before" if backwards else "after"
            raise SpecError(f"{self} never fires {where} {iso(at)}")
        return found

    def _dates(self, first: date, backwards: bool) -> Iterator[date]:
        """The dates the expression matches, from first on (back from first), over at most
        YEARS years (a bounded count of steps); nothing past the calendar's ends."""
        step = timedelta(days=-1 if backwards else 1)
        day = first
        try:
            for _ in range(self.YEARS * 366):
                if day.month not in self._months:  # to the month's last day, or the next's first
                    day = (day.replace(day=1) + step if backwards
                           else (day.replace(day=28) + 4 * step).replace(day=1))
                    continue
                if self._matches(day):
                    yield day
                day += step
        except OverflowError:
            return

    def _on(self, day: date, at: datetime, backwards: bool) -> datetime | None:
        """The date's latest fire time <= at (backwards), else its earliest one > at."""
        plan = self._plan(day)
        if isinstance(plan, datetime):  # one offset all day: fire times are midnight + times
            i = bisect_right(self._times, (at - plan) // _MINUTE)
            if backwards:
                return plan + self._times[i - 1] * _MINUTE if i else None
            return plan + self._times[i] * _MINUTE if i < len(self._times) else None
        i = bisect_right(plan, at)
        if backwards:
            return plan[i - 1] if i else None
        return plan[i] if i < len(plan) else None

    def _plan(self, day: date) -> datetime | list[datetime]:
        """Local midnight in UTC when the zone's offset holds all day (two changes within
        one day that cancel each other are not seen: tzdata has none since 1970), else the
        date's fire times, sorted. Cached: neighbouring periods ask about the same dates."""
        plan = self._plans.get(day)
        if plan is None:
            if len(self._plans) >= 512:
                self._plans.clear()
            midnight = datetime.combine(day, datetime.min.time())
            offsets = {wall.replace(tzinfo=self.tz, fold=fold).utcoffset()
                       for wall in (midnight, midnight + timedelta(days=1)) for fold in (0, 1)}
            if len(offsets) == 1:
                plan = (midnight - (offsets.pop() or _ZERO)).replace(tzinfo=UTC)
            else:
                plan = self._exact(midnight)
            self._plans[day] = plan
        return plan

    def _exact(self, midnight: datetime) -> list[datetime]:
        """A date's fire times, sorted, one wall time at a time (a date with an offset
        change: at most two conversions per hour:minute)."""
        fires = set()
        for minutes in self._times:
            wall = midnight + minutes * _MINUTE
            if not self._follows_clock:
                fires.add(self._first_instant(wall))
                continue
            for fold in (0, 1):  # each instant at which the clock reads wall: 0, 1 or 2
                fire = wall.replace(tzinfo=self.tz, fold=fold).astimezone(UTC)
                if fire.astimezone(self.tz).replace(tzinfo=None) == wall:
                    fires.add(fire)
        return sorted(fires)

"""Properties of once.periods over every zone, every spec and instants from 1990 to 2037.

Instants are drawn either anywhere in the range or close to one of the zone's UTC offset
changes in a year, where the interesting cases are. Every check compares instants in UTC:
Python compares two datetimes of the same zone by wall time, ignoring fold.
"""

from __future__ import annotations

import functools
import itertools
import zoneinfo
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from once import periods, schedules
from once.periods import Period, Schedule

ZONES = sorted(zoneinfo.available_timezones())
CLOCK = {
    "minute": 1, "2m": 2, "5m": 5, "15m": 15, "30m": 30, "60m": 60,
    "hour": 60, "2h": 120, "3h": 180, "6h": 360, "8h": 480, "12h": 720, "24h": 1440,
}  # fmt: skip
CALENDAR = {"day": 1, "week": 7, "month": 31, "quarter": 92, "year": 366}  # days, at most
CRON = ["0 2 * * *", "30 2 * * *", "*/30 * * * *", "0 0 * * 1", "15 */6 * * *", "0 0 1 * *"]
SECOND = timedelta(seconds=1)
TICK = timedelta(microseconds=1)


@functools.cache
def offset_changes(zone: str, year: int) -> list[datetime]:
    """The instants in a year at which the zone's UTC offset changes (probes every 6 hours)."""
    tz = zoneinfo.ZoneInfo(zone)
    found = []
    probe = datetime(year, 1, 1, tzinfo=UTC)
    before = probe.astimezone(tz).utcoffset()
    while probe.year == year:
        after_probe = probe + timedelta(hours=6)
        if after_probe.astimezone(tz).utcoffset() != before:
            lo, hi = probe, after_probe
            while hi - lo > SECOND:
                middle = lo + (hi - lo) // SECOND // 2 * SECOND  # whole seconds, like changes
                if middle.astimezone(tz).utcoffset() == before:
                    lo = middle
                else:
                    hi = middle
            found.append(hi)
            before = hi.astimezone(tz).utcoffset()
        probe = after_probe
    return found


def unit_of(spec: str) -> timedelta:
    if spec in CLOCK:
        return timedelta(minutes=CLOCK[spec])
    if spec in CALENDAR:
        return timedelta(days=CALENDAR[spec])
    return timedelta(hours=6)


@st.composite
def cases(draw: st.DrawFn, specs: list[str]) -> tuple[Schedule, datetime]:
    zone = draw(st.sampled_from(ZONES))
    spec = draw(st.sampled_from(specs))
    schedule = schedules.cron(spec, zone) if " " in spec else periods.every(spec, zone)
    year = draw(st.integers(1990, 2037))
    changes = offset_changes(zone, year)
    if changes and draw(st.booleans()):
        # Near an offset change: a few units either side, sometimes exactly on it.
        unit = unit_of(spec)
        change = draw(st.sampled_from(changes))
        units = draw(st.integers(-3, 3))
        within = draw(st.sampled_from([0, -1, 1, draw(st.integers(0, 10**6 - 1))]))
        return schedule, change + units * unit + within * unit / 10**6
    start = datetime(year, 1, 1, tzinfo=UTC)
    seconds = draw(st.integers(0, 365 * 86400))
    microseconds = draw(st.sampled_from([0, draw(st.integers(0, 10**6 - 1))]))
    return schedule, start + timedelta(seconds=seconds, microseconds=microseconds)


def utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)


def is_offset_change(schedule: Schedule, instant: datetime) -> bool:
    return (utc(instant) - SECOND).astimezone(schedule.tz).utcoffset() != instant.utcoffset()


def check_run(schedule: Schedule, instant: datetime) -> list[Period]:
    """The common properties, over a run of consecutive periods around the instant."""
    period = schedule.containing(instant)
    assert utc(period.start) <= utc(instant) < utc(period.end)
    run = [schedule.previous(schedule.previous(period)), schedule.previous(period), period]
    for _ in range(4):
        run.append(schedule.next(run[-1]))
    for earlier, later in itertools.pairwise(run):
        assert utc(earlier.start) < utc(earlier.end) == utc(later.start)
        assert schedule.previous(later) == earlier
        assert schedule.previous(later).key == earlier.key
    assert len({p.key for p in run}) == len(run)
    for p in run:
        assert p.start.tzinfo is schedule.tz and p.end.tzinfo is schedule.tz
        assert schedule.containing(p.start) == p
        assert schedule.containing(utc(p.end) - TICK) == p
        assert schedule.from_key(p.key) == p
        assert schedule.resolve(p.key) == p
    return run


@settings(max_examples=200, deadline=None)
@given(cases(list(CLOCK)))
def test_clock_periods(case: tuple[Schedule, datetime]) -> None:
    schedule, instant = case
    unit = timedelta(minutes=CLOCK[schedule.spec])
    for p in check_run(schedule, instant):
        wall = p.start.replace(tzinfo=None)
        since_midnight = wall - wall.replace(hour=0, minute=0, second=0)
        # On a multiple of the unit, or moved out of a gap to the instant the offset changed.
        assert since_midnight % unit == timedelta(0) or is_offset_change(schedule, p.start)
        assert p.key == p.start.isoformat(timespec="minutes" if not wall.second else "seconds")


@settings(max_examples=200, deadline=None)
@given(cases(list(CALENDAR)))
def test_calendar_periods(case: tuple[Schedule, datetime]) -> None:
    schedule, instant = case
    for p in check_run(schedule, instant):
        local = p.start
        # At midnight, or at the end of a gap that skipped it.
        assert local.time() == datetime.min.time() or is_offset_change(schedule, p.start)
        # The key names the start's local date's period.
        assert p.key == schedule.containing(p.start).key
        if schedule.spec == "day":
            assert p.key == local.date().isoformat()
        elif schedule.spec == "week":
            year, week, weekday = local.isocalendar()
            assert (p.key, weekday) == (f"{year:04d}-W{week:02d}", 1)
        elif schedule.spec == "month":
            assert (p.key, local.day) == (f"{local.year:04d}-{local.month:02d}", 1)
        elif schedule.spec == "quarter":
            quarter = (local.month - 1) // 3 + 1
            assert (p.key, local.month % 3, local.day) == (f"{local.year:04d}-Q{quarter}", 1, 1)
        else:
            assert (p.key, local.month, local.day) == (f"{local.year:04d}", 1, 1)


@settings(max_examples=100, deadline=None)
@given(cases(CRON))
def test_cron_periods(case: tuple[Schedule, datetime]) -> None:
    schedule, instant = case
    for p in check_run(schedule, instant):
        assert p.key == p.start.isoformat(timespec="minutes")


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(ZONES),
    st.sampled_from(list(CLOCK) + list(CALENDAR)),
    st.datetimes(datetime(1990, 1, 1), datetime(2037, 12, 1), timezones=st.just(UTC)),
    st.integers(-10, 1000),
)
def test_overlapping_and_between_agree(
    zone: str, spec: str, start: datetime, thousandths: int
) -> None:
    schedule = periods.every(spec, zone)
    end = start + unit_of(spec) * 3 * thousandths / 1000  # up to about three periods
    found = list(schedule.overlapping(start, end))
    if end <= start:
        assert found == []
        return
    assert utc(found[0].start) <= start < utc(found[0].end)
    assert utc(found[-1].start) < end <= utc(found[-1].end)
    assert list(schedule.between(found[0], found[-1])) == found


def test_instants_before_1990_do_not_crash() -> None:
    """Historical offsets (local mean time, seconds in offsets) need not be exact, but every
    spec still tiles around them in every zone."""
    instants = [datetime(year, 6, 15, 12, 34, 56, tzinfo=UTC) for year in (1850, 1901, 1944)]
    instants += [datetime(1900, 1, 1, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC)]
    for zone in ZONES:
        for spec in ("minute", "hour", "6h", "day", "month"):
            schedule = periods.every(spec, zone)
            for instant in instants:
                period = schedule.containing(instant)
                assert utc(period.start) <= instant < utc(period.end)
                assert utc(schedule.next(period).start) == utc(period.end)
                assert schedule.from_key(period.key) == period


@settings(max_examples=300, deadline=None)
@given(instant=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2037, 12, 31),
                            timezones=st.just(UTC)),
       spec=st.sampled_from([*CLOCK, *CALENDAR, *CRON]))
def test_utc_without_zoneinfo_cuts_the_same_periods(instant: datetime, spec: str) -> None:
    # zone("UTC") is datetime.UTC (no zoneinfo import on a UTC fire): the same periods, keys
    # and instants as the zone file's UTC.
    fast = schedules.schedule(None, spec, "UTC") if " " in spec else periods.every(spec, "UTC")
    assert fast.tz is UTC
    slow = schedules.schedule(None, spec, "UTC") if " " in spec else periods.every(spec, "UTC")
    slow.tz = zoneinfo.ZoneInfo("UTC")  # as zone("UTC") was, before anything is computed
    got, want = fast.containing(instant), slow.containing(instant)
    assert got == want and got.key == want.key
    assert (got.start.isoformat(), got.end.isoformat()) == (want.start.isoformat(),
                                                            want.end.isoformat())
    assert fast.from_key(got.key) == slow.from_key(want.key) == got
    assert fast.previous(got) == slow.previous(want)

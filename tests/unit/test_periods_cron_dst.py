"""Cron periods where a zone's offset changes by less than an hour, and cron never hangs.

cronsim's walk through time (which once used until this release) hung forever inside next()
for `* 1 * * *` on Asia/Colombo 2006-04-15 (a 30-minute fall-back at 00:30) and for
`15 */6 * * *` on America/St_Johns 1999-10-31 (a fall-back across midnight), and skipped fire
times after Australia/Lord_Howe's 30-minute changes (`30 * * * *` had no 02:30 on the day the
clock jumps from 02:00 to 02:30). once now computes fire times itself (once.cron), from the
zone's offsets. The cases are period tables (tests/period_table.py). The reference
(`fire_times`) is written independently of the engine: it walks UTC minutes and reads the
local clock, as cron does.
"""

from __future__ import annotations

import functools
import itertools
import zoneinfo
from datetime import UTC, date, datetime, timedelta

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from once import schedules
from once.periods import Schedule, iso
from period_table import LH, check_containing, in_child

C = "Asia/Colombo"  # 2006-04-15 00:30 +06:00 -> 00:00 +05:30: 00:00-00:30 happens twice
# Lord Howe (LH): 02:00 +10:30 -> 02:30 +11:00 in October, back in April.
SJ = "America/St_Johns"
MINUTE = timedelta(minutes=1)
TICK = timedelta(microseconds=1)


# fmt: off
CRON_DST = [
    # n, expression, zone, instant, key, start, end
    # Colombo: cronsim hung on each of 1-3 (an hour walk that re-entered the repeated 00:00).
    (1, "* 1 * * *", C, "2006-04-14T02:00+06:00",
     "2006-04-14T01:59+06:00", "2006-04-14T01:59:00+06:00", "2006-04-15T01:00:00+05:30"),
    (2, "* 23 * * *", C, "2006-04-15T00:00+06:00",
     "2006-04-14T23:59+06:00", "2006-04-14T23:59:00+06:00", "2006-04-15T23:00:00+05:30"),
    (3, "*/15 1,2 * * *", C, "2006-04-14T03:00+06:00",
     "2006-04-14T02:45+06:00", "2006-04-14T02:45:00+06:00", "2006-04-15T01:00:00+05:30"),
    # `*` follows the clock: both passes of the repeated half hour.
    (4, "* 0 * * *", C, "2006-04-15T00:29:59+06:00",
     "2006-04-15T00:29+06:00", "2006-04-15T00:29:00+06:00", "2006-04-15T00:00:00+05:30"),
    (5, "* 0 * * *", C, "2006-04-15T00:00+05:30",
     "2006-04-15T00:00+05:30", "2006-04-15T00:00:00+05:30", "2006-04-15T00:01:00+05:30"),
    (6, "0 * * * *", C, "2006-04-15T00:10+06:00",  # cronsim skipped the second 00:00
     "2006-04-15T00:00+06:00", "2006-04-15T00:00:00+06:00", "2006-04-15T00:00:00+05:30"),
    (7, "0 * * * *", C, "2006-04-15T00:10+05:30",
     "2006-04-15T00:00+05:30", "2006-04-15T00:00:00+05:30", "2006-04-15T01:00:00+05:30"),
    (8, "15 */6 * * *", C, "2006-04-15T00:20+05:30",
     "2006-04-15T00:15+05:30", "2006-04-15T00:15:00+05:30", "2006-04-15T06:15:00+05:30"),
    # A fixed time fires once, the first time the clock reads it.
    (9, "0 0 * * *", C, "2006-04-15T00:10+05:30",
     "2006-04-15T00:00+06:00", "2006-04-15T00:00:00+06:00", "2006-04-16T00:00:00+05:30"),
    (10, "15 0 * * *", C, "2006-04-15T00:20+05:30",
     "2006-04-15T00:15+06:00", "2006-04-15T00:15:00+06:00", "2006-04-16T00:15:00+05:30"),
    # Lord Howe springs forward 2026-10-04 02:00 +10:30 -> 02:30 +11:00.
    (11, "30 * * * *", LH, "2026-10-04T02:40+11:00",  # cronsim skipped 02:30
     "2026-10-04T02:30+11:00", "2026-10-04T02:30:00+11:00", "2026-10-04T03:30:00+11:00"),
    (12, "* 0 * * *", LH, "2026-10-05T00:00:30+11:00",  # cronsim skipped 00:00-00:29
     "2026-10-05T00:00+11:00", "2026-10-05T00:00:00+11:00", "2026-10-05T00:01:00+11:00"),
    (13, "15 */6 * * *", LH, "2026-10-04T06:20+11:00",  # cronsim skipped 06:15
     "2026-10-04T06:15+11:00", "2026-10-04T06:15:00+11:00", "2026-10-04T12:15:00+11:00"),
    (14, "*/30 * * * *", LH, "2026-10-04T01:45+10:30",  # no 02:00 in the gap
     "2026-10-04T01:30+10:30", "2026-10-04T01:30:00+10:30", "2026-10-04T02:30:00+11:00"),
    (15, "0 2 * * *", LH, "2026-10-04T12:00+11:00",  # a fixed time in the gap: at its end
     "2026-10-04T02:30+11:00", "2026-10-04T02:30:00+11:00", "2026-10-05T02:00:00+11:00"),
    (16, "15 2 * * *", LH, "2026-10-04T02:50+11:00",
     "2026-10-04T02:30+11:00", "2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"),
    # Lord Howe falls back 2026-04-05 02:00 +11:00 -> 01:30 +10:30.
    (17, "0 */2 * * *", LH, "2026-04-05T02:10+10:30",  # cronsim skipped 02:00
     "2026-04-05T02:00+10:30", "2026-04-05T02:00:00+10:30", "2026-04-05T04:00:00+10:30"),
    (18, "* 2 * * *", LH, "2026-04-05T02:00+10:30",  # cronsim skipped 02:00-02:29
     "2026-04-05T02:00+10:30", "2026-04-05T02:00:00+10:30", "2026-04-05T02:01:00+10:30"),
    (19, "* 0 * * *", LH, "2026-04-06T00:00+10:30",  # and the next day's 00:00-00:29
     "2026-04-06T00:00+10:30", "2026-04-06T00:00:00+10:30", "2026-04-06T00:01:00+10:30"),
    (20, "*/30 * * * *", LH, "2026-04-05T01:45+11:00",
     "2026-04-05T01:30+11:00", "2026-04-05T01:30:00+11:00", "2026-04-05T01:30:00+10:30"),
    (21, "*/30 * * * *", LH, "2026-04-05T01:45+10:30",
     "2026-04-05T01:30+10:30", "2026-04-05T01:30:00+10:30", "2026-04-05T02:00:00+10:30"),
    (22, "45 1 * * *", LH, "2026-04-05T01:50+10:30",
     "2026-04-05T01:45+11:00", "2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"),
    # Apia skipped 2011-12-30: its 12:00 is in the gap, so it fires at the gap's end.
    (23, "0 12 * * *", "Pacific/Apia", "2011-12-31T06:00+14:00",
     "2011-12-31T00:00+14:00", "2011-12-31T00:00:00+14:00", "2011-12-31T12:00:00+14:00"),
    (24, "0 12 * * *", "Pacific/Apia", "2011-12-31T12:00+14:00",
     "2011-12-31T12:00+14:00", "2011-12-31T12:00:00+14:00", "2012-01-01T12:00:00+14:00"),
    # St. John's changed at 00:01 until 2011: 1999-10-31 00:01 -02:30 -> 1999-10-30 23:01
    # -03:30, a fall-back across midnight (cronsim hung on 25 and 26), and 1999-04-04 00:01
    # -03:30 -> 01:01 -02:30, a gap that swallows 01:00 (cronsim skipped that day's hour 1).
    (25, "15 */6 * * *", SJ, "1999-10-30T23:30-02:30",
     "1999-10-30T18:15-02:30", "1999-10-30T18:15:00-02:30", "1999-10-31T00:15:00-03:30"),
    (26, "15 */6 * * *", SJ, "1999-10-30T23:30-03:30",
     "1999-10-30T18:15-02:30", "1999-10-30T18:15:00-02:30", "1999-10-31T00:15:00-03:30"),
    (27, "* 1 * * *", SJ, "1999-04-03T23:31-03:30",
     "1999-04-03T01:59-03:30", "1999-04-03T01:59:00-03:30", "1999-04-04T01:01:00-02:30"),
]
# fmt: on


@pytest.mark.parametrize(
    ("n", "expr", "tz", "instant", "key", "start", "end"),
    CRON_DST,
    ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CRON_DST],
)
def test_containing(n: int, expr: str, tz: str, instant: str, key: str, start: str,
                    end: str) -> None:
    schedule = schedules.cron(expr, tz)
    period = check_containing(schedule, n, instant, key, start, end)
    assert schedule.previous(schedule.next(period)) == period, f"case {n}"
    assert fire_times(schedule, period.start, utc(period.end) + TICK) == [
        utc(period.start), utc(period.end)], f"case {n}"


def test_the_expressions_cronsim_hangs_on_are_answered_at_once() -> None:
    """In a child with a time limit, so that a hang fails the test instead of the suite."""
    script = (
        "from datetime import datetime\n"
        "from once import schedules\n"
        f"for n, expr, tz, instant, *_ in {[c[:4] for c in CRON_DST]!r}:\n"
        "    schedules.cron(expr, tz).containing(datetime.fromisoformat(instant))\n"
    )
    in_child(script)


# -- the reference, and the property --------------------------------------------------------


def utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)


def fire_times(schedule: Schedule, lo: datetime, hi: datetime) -> list[datetime]:
    """The fire times in [lo, hi), UTC, by walking UTC minutes (zones with whole-minute
    offsets): a wall time W fires at the first minute at which the clock reads W or later,
    with `*` in the minute or hour field at every minute that reads W (as Debian cron)."""
    fields = schedule.spec.split()
    parsed = CronSim(schedule.spec, datetime(2000, 1, 1))
    follows_clock = fields[0].startswith("*") or fields[1].startswith("*")

    def matches(wall: datetime) -> bool:
        return (wall.minute in parsed.minutes and wall.hour in parsed.hours
                and wall.month in parsed.months and parsed.match_day(wall.date()))

    def wall(instant: datetime) -> datetime:
        return instant.astimezone(schedule.tz).replace(tzinfo=None)

    found = []
    start = utc(lo).replace(second=0, microsecond=0)
    highest = wall(start - MINUTE)  # the latest wall time the clock has read
    t = start
    while t < hi:
        now = wall(t)
        if follows_clock:
            fires = matches(now)
        else:  # any wall time passed since the highest one read: once, at the first minute
            fires = any(matches(highest + k * MINUTE)
                        for k in range(1, (now - highest) // MINUTE + 1))
        if fires and t >= lo:
            found.append(t)
        highest = max(highest, now)
        t += MINUTE
    return found


# Every zone whose offset changed by a fraction of an hour since 1970, and a few others.
SUBHOUR = ["America/Caracas", "America/Montevideo", "America/Santo_Domingo", C,
           "Asia/Kathmandu", "Asia/Pyongyang", "Asia/Tehran", LH, "Pacific/Norfolk",
           "Pacific/Rarotonga", "America/St_Johns", "Pacific/Chatham", "America/New_York",
           "Europe/Berlin", "Pacific/Apia", "America/Havana", "America/Santiago"]
EXPRESSIONS = ["* 0 * * *", "* 1 * * *", "* 2 * * *", "* 23 * * *", "0 * * * *",
               "30 * * * *", "*/15 * * * *", "0 */2 * * *", "15 */6 * * *", "*/15 1,2 * * *",
               "0 0 * * *", "30 0 * * *", "0 2 * * *", "45 1 * * *", "0,30 1,2 * * *",
               "0 0 * * 0"]


@functools.cache
def offset_changes(zone: str, first: int, last: int) -> list[datetime]:
    tz = zoneinfo.ZoneInfo(zone)
    probe = datetime(first, 1, 1, tzinfo=UTC)
    found, before = [], probe.astimezone(tz).utcoffset()
    while probe.year <= last:
        after = probe + timedelta(hours=3)
        if after.astimezone(tz).utcoffset() != before:
            found.append(after)
            before = after.astimezone(tz).utcoffset()
        probe = after
    return found


@pytest.mark.slow  # 150 zone and expression pairs against the reference: 15-45 s
@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SUBHOUR), st.sampled_from(EXPRESSIONS), st.data())
def test_cron_periods_tile_and_match_the_reference(zone: str, expr: str,
                                                   data: st.DataObject) -> None:
    changes = offset_changes(zone, 1973, 2037)
    if changes:
        change = data.draw(st.sampled_from(changes))
        hours = data.draw(st.integers(-30, 30))
        instant = change + timedelta(hours=hours, seconds=data.draw(st.integers(0, 3599)))
    else:
        instant = data.draw(st.datetimes(datetime(1973, 1, 1), datetime(2037, 1, 1),
                                         timezones=st.just(UTC)))
    schedule = schedules.cron(expr, zone)
    period = schedule.containing(instant)
    assert utc(period.start) <= instant < utc(period.end)
    run = [period]
    for _ in range(6):  # the next periods tile: each start is the previous end
        run.append(schedule.next(run[-1]))
    for earlier, later in itertools.pairwise(run):
        assert utc(earlier.start) < utc(earlier.end) == utc(later.start)
        assert schedule.previous(later) == earlier
    for p in run:
        assert schedule.containing(utc(p.end) - TICK) == p
        assert schedule.from_key(p.key) == p
    if utc(run[-1].start) - utc(run[0].start) <= timedelta(days=3):  # the walk stays short
        assert fire_times(schedule, run[0].start, utc(run[-1].start) + TICK) == [
            utc(p.start) for p in run]


def test_a_schedule_that_fires_rarely_is_found_within_bounded_work() -> None:
    """February 29th: leap years only; the engine looks at most 50 years either way."""
    schedule = schedules.cron("0 0 29 2 *", "UTC")
    period = schedule.containing(datetime(2097, 3, 1, tzinfo=UTC))
    assert (iso(period.start), iso(period.end)) == (
        "2096-02-29T00:00:00+00:00", "2104-02-29T00:00:00+00:00")
    assert date(2100, 2, 28) < period.end.date()

"""Table tests for once.periods: exact keys and bounds, with offsets, around DST changes.

Each case is numbered so that a failure names it; its form and the harness, shared with
test_periods_cron_dst.py, are in tests/period_table.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import pytest

from once import periods, schedules
from once.periods import Period, Schedule, SpecError, iso
from period_table import LH, at, check_containing, in_child, shown

NY = "America/New_York"


def make(spec: str, tz: str) -> Schedule:
    """A cron schedule when the spec has spaces, else an --every one."""
    return schedules.cron(spec, tz) if " " in spec else periods.every(spec, tz)


# fmt: off
CONTAINING = [
    # n, spec, zone, instant, key, start, end
    # New York falls back 2026-11-01 02:00 EDT -> 01:00 EST: 01:00-02:00 happens twice.
    (1, "hour", NY, "2026-11-01T00:59:59-04:00",
     "2026-11-01T00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-11-01T01:00:00-04:00"),
    (2, "hour", NY, "2026-11-01T01:30-04:00",
     "2026-11-01T01:00-04:00", "2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00"),
    (3, "hour", NY, "2026-11-01T01:00-05:00",
     "2026-11-01T01:00-05:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"),
    (4, "hour", NY, "2026-11-01T01:59:59.999999-05:00",
     "2026-11-01T01:00-05:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"),
    (5, "15m", NY, "2026-11-01T01:50-04:00",
     "2026-11-01T01:45-04:00", "2026-11-01T01:45:00-04:00", "2026-11-01T01:00:00-05:00"),
    (6, "15m", NY, "2026-11-01T01:05-05:00",
     "2026-11-01T01:00-05:00", "2026-11-01T01:00:00-05:00", "2026-11-01T01:15:00-05:00"),
    (7, "day", NY, "2026-11-01T23:00-05:00",
     "2026-11-01", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00"),
    (8, "2h", NY, "2026-11-01T01:10-05:00",  # 00:00-02:00 is three hours long that day
     "2026-11-01T00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-11-01T02:00:00-05:00"),
    # New York springs forward 2026-03-08 02:00 EST -> 03:00 EDT: 02:00-03:00 never happens.
    (9, "hour", NY, "2026-03-08T01:59:59-05:00",
     "2026-03-08T01:00-05:00", "2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"),
    (10, "hour", NY, "2026-03-08T03:00-04:00",
     "2026-03-08T03:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"),
    (11, "15m", NY, "2026-03-08T01:50-05:00",
     "2026-03-08T01:45-05:00", "2026-03-08T01:45:00-05:00", "2026-03-08T03:00:00-04:00"),
    (12, "15m", NY, "2026-03-08T03:05-04:00",
     "2026-03-08T03:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:15:00-04:00"),
    (13, "day", NY, "2026-03-08T12:00-04:00",
     "2026-03-08", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"),
    (14, "2h", NY, "2026-03-08T03:30-04:00",  # 02:00 moved to 03:00 and keyed so
     "2026-03-08T03:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"),
    (15, "minute", NY, "2026-03-08T01:59:30-05:00",
     "2026-03-08T01:59-05:00", "2026-03-08T01:59:00-05:00", "2026-03-08T03:00:00-04:00"),
    (16, "minute", NY, "2026-11-01T01:59:30-04:00",
     "2026-11-01T01:59-04:00", "2026-11-01T01:59:00-04:00", "2026-11-01T01:00:00-05:00"),
    # America/Santiago skips midnight 2026-09-06 (00:00 -04 -> 01:00 -03), repeats 23:00-24:00
    # on 2026-04-04.
    (17, "day", "America/Santiago", "2026-09-06T01:00-03:00",
     "2026-09-06", "2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00"),
    (18, "day", "America/Santiago", "2026-09-05T23:59:59-04:00",
     "2026-09-05", "2026-09-05T00:00:00-04:00", "2026-09-06T01:00:00-03:00"),
    (19, "hour", "America/Santiago", "2026-09-05T23:30-04:00",
     "2026-09-05T23:00-04:00", "2026-09-05T23:00:00-04:00", "2026-09-06T01:00:00-03:00"),
    (20, "day", "America/Santiago", "2026-04-04T23:30-04:00",
     "2026-04-04", "2026-04-04T00:00:00-03:00", "2026-04-05T00:00:00-04:00"),
    (21, "hour", "America/Santiago", "2026-04-04T23:30-04:00",
     "2026-04-04T23:00-04:00", "2026-04-04T23:00:00-04:00", "2026-04-05T00:00:00-04:00"),
    # Asia/Beirut skips midnight every last Sunday of March, repeats 23:00 in October.
    (22, "day", "Asia/Beirut", "2026-03-29T12:00+03:00",
     "2026-03-29", "2026-03-29T01:00:00+03:00", "2026-03-30T00:00:00+03:00"),
    (23, "day", "Asia/Beirut", "2026-03-28T23:59:59+02:00",
     "2026-03-28", "2026-03-28T00:00:00+02:00", "2026-03-29T01:00:00+03:00"),
    (24, "day", "Asia/Beirut", "2026-10-24T23:30+02:00",
     "2026-10-24", "2026-10-24T00:00:00+03:00", "2026-10-25T00:00:00+02:00"),
    (25, "week", "Asia/Beirut", "2026-03-30T12:00+03:00",
     "2026-W14", "2026-03-30T00:00:00+03:00", "2026-04-06T00:00:00+03:00"),
    # America/Havana falls back from 01:00 to 00:00: midnight 2026-11-01 happens twice.
    (26, "day", "America/Havana", "2026-11-01T00:30-05:00",
     "2026-11-01", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00"),
    (27, "hour", "America/Havana", "2026-11-01T00:30-04:00",
     "2026-11-01T00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-11-01T00:00:00-05:00"),
    (28, "hour", "America/Havana", "2026-11-01T00:30-05:00",
     "2026-11-01T00:00-05:00", "2026-11-01T00:00:00-05:00", "2026-11-01T01:00:00-05:00"),
    # Australia/Lord_Howe moves by 30 minutes: 02:00 -> 02:30 on 2026-10-04, 02:00 -> 01:30
    # on 2026-04-05.
    (29, "hour", LH, "2026-10-04T01:59+10:30",
     "2026-10-04T01:00+10:30", "2026-10-04T01:00:00+10:30", "2026-10-04T02:30:00+11:00"),
    (30, "hour", LH, "2026-10-04T02:45+11:00",
     "2026-10-04T02:30+11:00", "2026-10-04T02:30:00+11:00", "2026-10-04T03:00:00+11:00"),
    (31, "30m", LH, "2026-10-04T02:45+11:00",
     "2026-10-04T02:30+11:00", "2026-10-04T02:30:00+11:00", "2026-10-04T03:00:00+11:00"),
    (32, "hour", LH, "2026-04-05T01:45+10:30",
     "2026-04-05T01:00+11:00", "2026-04-05T01:00:00+11:00", "2026-04-05T02:00:00+10:30"),
    (33, "30m", LH, "2026-04-05T01:45+11:00",
     "2026-04-05T01:30+11:00", "2026-04-05T01:30:00+11:00", "2026-04-05T01:30:00+10:30"),
    (34, "30m", LH, "2026-04-05T01:45+10:30",
     "2026-04-05T01:30+10:30", "2026-04-05T01:30:00+10:30", "2026-04-05T02:00:00+10:30"),
    # Pacific/Apia skipped 2011-12-30 altogether: 2011-12-29 24:00 -10 -> 2011-12-31 00:00 +14.
    (35, "day", "Pacific/Apia", "2011-12-29T23:00-10:00",
     "2011-12-29", "2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00"),
    (36, "day", "Pacific/Apia", "2011-12-31T00:00+14:00",
     "2011-12-31", "2011-12-31T00:00:00+14:00", "2012-01-01T00:00:00+14:00"),
    (37, "hour", "Pacific/Apia", "2011-12-29T23:30-10:00",
     "2011-12-29T23:00-10:00", "2011-12-29T23:00:00-10:00", "2011-12-31T00:00:00+14:00"),
    (38, "6h", "Pacific/Apia", "2011-12-29T20:00-10:00",
     "2011-12-29T18:00-10:00", "2011-12-29T18:00:00-10:00", "2011-12-31T00:00:00+14:00"),
    (39, "year", "Pacific/Apia", "2011-06-01T00:00+00:00",
     "2011", "2011-01-01T00:00:00-10:00", "2012-01-01T00:00:00+14:00"),
    # Europe/Dublin: "negative DST" in tzdata (IST is standard time), offsets +00 and +01.
    (40, "day", "Europe/Dublin", "2026-03-29T12:00+01:00",
     "2026-03-29", "2026-03-29T00:00:00+00:00", "2026-03-30T00:00:00+01:00"),
    (41, "hour", "Europe/Dublin", "2026-03-29T00:59+00:00",
     "2026-03-29T00:00+00:00", "2026-03-29T00:00:00+00:00", "2026-03-29T02:00:00+01:00"),
    (42, "hour", "Europe/Dublin", "2026-10-25T01:30+01:00",
     "2026-10-25T01:00+01:00", "2026-10-25T01:00:00+01:00", "2026-10-25T01:00:00+00:00"),
    (43, "day", "Europe/Dublin", "2026-10-25T12:00+00:00",
     "2026-10-25", "2026-10-25T00:00:00+01:00", "2026-10-26T00:00:00+00:00"),
    # Asia/Kathmandu: +05:45 since 1986 (from +05:30: midnight 1986-01-01 was skipped).
    (44, "hour", "Asia/Kathmandu", "2026-10-27T10:44+05:45",
     "2026-10-27T10:00+05:45", "2026-10-27T10:00:00+05:45", "2026-10-27T11:00:00+05:45"),
    (45, "6h", "Asia/Kathmandu", "2026-10-27T05:59+05:45",
     "2026-10-27T00:00+05:45", "2026-10-27T00:00:00+05:45", "2026-10-27T06:00:00+05:45"),
    (46, "day", "Asia/Kathmandu", "2026-10-27T00:00+00:00",
     "2026-10-27", "2026-10-27T00:00:00+05:45", "2026-10-28T00:00:00+05:45"),
    (47, "hour", "Asia/Kathmandu", "1985-12-31T23:30+05:30",
     "1985-12-31T23:00+05:30", "1985-12-31T23:00:00+05:30", "1986-01-01T00:15:00+05:45"),
    (48, "day", "Asia/Kathmandu", "1986-01-01T12:00+05:45",
     "1986-01-01", "1986-01-01T00:15:00+05:45", "1986-01-02T00:00:00+05:45"),
    # Offsets with seconds before 1972 (Africa/Monrovia -00:44:30 until 1972-01-07).
    (49, "hour", "Africa/Monrovia", "1972-01-06T23:30-00:44:30",
     "1972-01-06T23:00-00:44:30", "1972-01-06T23:00:00-00:44:30", "1972-01-07T00:44:30+00:00"),
    (50, "hour", "Africa/Monrovia", "1972-01-07T00:50+00:00",
     "1972-01-07T00:44:30+00:00", "1972-01-07T00:44:30+00:00", "1972-01-07T01:00:00+00:00"),
    # ISO weeks: 2026 has a week 53; 2026-01-01 is in 2026-W01, which starts in 2025.
    (51, "week", "Europe/Berlin", "2026-12-31T12:00+01:00",
     "2026-W53", "2026-12-28T00:00:00+01:00", "2027-01-04T00:00:00+01:00"),
    (52, "week", "Europe/Berlin", "2027-01-04T00:00+01:00",
     "2027-W01", "2027-01-04T00:00:00+01:00", "2027-01-11T00:00:00+01:00"),
    (53, "week", "UTC", "2026-01-01T00:00+00:00",
     "2026-W01", "2025-12-29T00:00:00+00:00", "2026-01-05T00:00:00+00:00"),
    (54, "week", NY, "2026-03-08T12:00-04:00",
     "2026-W10", "2026-03-02T00:00:00-05:00", "2026-03-09T00:00:00-04:00"),
    # Months, quarters, years.
    (55, "month", "Europe/Berlin", "2026-10-31T12:00+01:00",
     "2026-10", "2026-10-01T00:00:00+02:00", "2026-11-01T00:00:00+01:00"),
    (56, "month", "UTC", "2024-02-29T23:59:59+00:00",
     "2024-02", "2024-02-01T00:00:00+00:00", "2024-03-01T00:00:00+00:00"),
    (57, "quarter", "Europe/Berlin", "2026-12-31T23:59:59+01:00",
     "2026-Q4", "2026-10-01T00:00:00+02:00", "2027-01-01T00:00:00+01:00"),
    (58, "quarter", NY, "2026-04-01T03:59:59+00:00",
     "2026-Q1", "2026-01-01T00:00:00-05:00", "2026-04-01T00:00:00-04:00"),
    (59, "year", "Asia/Tokyo", "2026-12-31T15:00+00:00",
     "2027", "2027-01-01T00:00:00+09:00", "2028-01-01T00:00:00+09:00"),
    (60, "24h", "America/Havana", "2026-11-01T00:30-04:00",
     "2026-11-01T00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-11-01T00:00:00-05:00"),
    (61, "60m", "UTC", "2026-10-27T10:00:00+00:00",
     "2026-10-27T10:00+00:00", "2026-10-27T10:00:00+00:00", "2026-10-27T11:00:00+00:00"),
    # cron, in New York. A fixed time fires once in the repeated hour and, in the gap, at 03:00.
    (62, "0 2 * * *", NY, "2026-03-08T03:30-04:00",
     "2026-03-08T03:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"),
    (63, "0 2 * * *", NY, "2026-03-08T01:30-05:00",
     "2026-03-07T02:00-05:00", "2026-03-07T02:00:00-05:00", "2026-03-08T03:00:00-04:00"),
    (64, "0 2 * * *", NY, "2026-11-01T01:30-05:00",
     "2026-10-31T02:00-04:00", "2026-10-31T02:00:00-04:00", "2026-11-01T02:00:00-05:00"),
    (65, "0 2 * * *", NY, "2026-11-01T02:00-05:00",
     "2026-11-01T02:00-05:00", "2026-11-01T02:00:00-05:00", "2026-11-02T02:00:00-05:00"),
    (66, "0 2 * * *", NY, "2026-10-27T01:59:59.999999-04:00",
     "2026-10-26T02:00-04:00", "2026-10-26T02:00:00-04:00", "2026-10-27T02:00:00-04:00"),
    (67, "0 2 * * *", NY, "2026-10-27T02:00:00.000001-04:00",
     "2026-10-27T02:00-04:00", "2026-10-27T02:00:00-04:00", "2026-10-28T02:00:00-04:00"),
    (68, "*/30 * * * *", NY, "2026-11-01T01:45-04:00",
     "2026-11-01T01:30-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T01:00:00-05:00"),
    (69, "*/30 * * * *", NY, "2026-11-01T01:00-05:00",
     "2026-11-01T01:00-05:00", "2026-11-01T01:00:00-05:00", "2026-11-01T01:30:00-05:00"),
    (70, "*/30 * * * *", NY, "2026-03-08T01:45-05:00",
     "2026-03-08T01:30-05:00", "2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00"),
    (71, "*/30 * * * *", NY, "2026-03-08T03:00-04:00",
     "2026-03-08T03:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00"),
    (72, "30 2 * * *", NY, "2026-03-08T12:00-04:00",
     "2026-03-08T03:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"),
    (73, "30 2 * * *", NY, "2026-03-08T01:59:59-05:00",
     "2026-03-07T02:30-05:00", "2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00"),
    (74, "30 1 * * *", NY, "2026-11-01T01:15-05:00",  # after the one 01:30, EDT
     "2026-11-01T01:30-04:00", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"),
    (75, "0 0 * * 1", "UTC", "2026-10-27T12:00+00:00",
     "2026-10-26T00:00+00:00", "2026-10-26T00:00:00+00:00", "2026-11-02T00:00:00+00:00"),
    (76, "15 */6 * * *", "Asia/Kathmandu", "2026-10-27T00:00+00:00",
     "2026-10-27T00:15+05:45", "2026-10-27T00:15:00+05:45", "2026-10-27T06:15:00+05:45"),
]
# fmt: on


@pytest.mark.parametrize(
    ("n", "spec", "tz", "instant", "key", "start", "end"),
    CONTAINING,
    ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CONTAINING],
)
def test_containing(
    n: int, spec: str, tz: str, instant: str, key: str, start: str, end: str
) -> None:
    check_containing(make(spec, tz), n, instant, key, start, end)


def test_instant_in_another_zone_is_the_same_instant() -> None:
    schedule = periods.every("day", "Europe/Berlin")
    assert schedule.containing(at("2026-10-27T23:30-04:00")).key == "2026-10-28"
    assert schedule.containing(at("2026-10-27T22:59:59+00:00")).key == "2026-10-27"


def test_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        periods.every("day", "UTC").containing(datetime(2026, 10, 27))


# -- next, previous, shifted, between, overlapping ------------------------------------------


def keys(found: Iterable[Period]) -> list[str]:
    return [p.key for p in found]


def test_next_and_previous_walk_the_repeated_hour() -> None:
    schedule = periods.every("hour", NY)
    period = schedule.from_key("2026-11-01T00:00-04:00")
    walked = [period.key]
    for _ in range(3):
        period = schedule.next(period)
        walked.append(period.key)
    assert walked == [
        "2026-11-01T00:00-04:00",
        "2026-11-01T01:00-04:00",
        "2026-11-01T01:00-05:00",
        "2026-11-01T02:00-05:00",
    ]
    back = [period.key]
    for _ in range(3):
        period = schedule.previous(period)
        back.append(period.key)
    assert back == walked[::-1]


def test_next_and_previous_skip_the_skipped_day() -> None:
    schedule = periods.every("day", "Pacific/Apia")
    day = schedule.from_key("2011-12-29")
    assert schedule.next(day).key == "2011-12-31"
    assert schedule.previous(schedule.next(day)) == day


# fmt: off
SHIFTED = [
    # n, spec, zone, key, n periods, expected key
    (1, "day", "Europe/Berlin", "2026-10-27", -1, "2026-10-26"),
    (2, "day", "Europe/Berlin", "2026-10-27", 0, "2026-10-27"),
    (3, "day", "Europe/Berlin", "2026-10-27", 7, "2026-11-03"),
    (4, "day", "Pacific/Apia", "2011-12-31", -1, "2011-12-29"),
    (5, "day", "Pacific/Apia", "2011-12-28", 2, "2011-12-31"),
    (6, "hour", NY, "2026-11-01T02:00-05:00", -2, "2026-11-01T01:00-04:00"),
    (7, "hour", NY, "2026-03-08T00:00-05:00", 2, "2026-03-08T03:00-04:00"),
    (8, "month", "UTC", "2026-12", 1, "2027-01"),
    (9, "quarter", "UTC", "2026-Q1", -1, "2025-Q4"),
    (10, "week", "UTC", "2026-W53", 1, "2027-W01"),
    (11, "year", "UTC", "2026", -26, "2000"),
    (12, "0 2 * * *", NY, "2026-03-09T02:00-04:00", -1, "2026-03-08T03:00-04:00"),
    (13, "*/30 * * * *", NY, "2026-11-01T01:30-04:00", 1, "2026-11-01T01:00-05:00"),
]
# fmt: on


@pytest.mark.parametrize(("n", "spec", "tz", "key", "shift", "expected"), SHIFTED)
def test_shifted(n: int, spec: str, tz: str, key: str, shift: int, expected: str) -> None:
    schedule = make(spec, tz)
    assert schedule.shifted(schedule.from_key(key), shift).key == expected, f"case {n}"


def test_between_is_inclusive_and_in_order() -> None:
    schedule = periods.every("hour", NY)
    first = schedule.from_key("2026-11-01T00:00-04:00")
    last = schedule.from_key("2026-11-01T02:00-05:00")
    assert keys(schedule.between(first, last)) == [
        "2026-11-01T00:00-04:00",
        "2026-11-01T01:00-04:00",
        "2026-11-01T01:00-05:00",
        "2026-11-01T02:00-05:00",
    ]
    assert keys(schedule.between(first, first)) == [first.key]
    assert keys(schedule.between(last, first)) == []


def test_between_across_the_skipped_day() -> None:
    schedule = periods.every("day", "Pacific/Apia")
    found = schedule.between(schedule.from_key("2011-12-28"), schedule.from_key("2012-01-01"))
    assert keys(found) == ["2011-12-28", "2011-12-29", "2011-12-31", "2012-01-01"]


# fmt: off
OVERLAPPING = [
    # n, spec, zone, start, end, the keys of the periods that overlap [start, end)
    (1, "day", "Europe/Berlin", "2026-10-24T00:00+02:00", "2026-10-27T00:00+01:00",
     ["2026-10-24", "2026-10-25", "2026-10-26"]),
    (2, "day", "Europe/Berlin", "2026-10-24T12:00+02:00", "2026-10-26T00:00:01+01:00",
     ["2026-10-24", "2026-10-25", "2026-10-26"]),
    (3, "hour", "UTC", "2026-10-27T10:30+00:00", "2026-10-27T10:30+00:00", []),
    (4, "hour", "UTC", "2026-10-27T10:30+00:00", "2026-10-27T10:31+00:00",
     ["2026-10-27T10:00+00:00"]),
    (5, "hour", "UTC", "2026-10-27T11:00+00:00", "2026-10-27T10:00+00:00", []),
    (6, "hour", NY, "2026-03-08T01:30-05:00", "2026-03-08T03:30-04:00",
     ["2026-03-08T01:00-05:00", "2026-03-08T03:00-04:00"]),
    (7, "month", "UTC", "2026-11-15T00:00+00:00", "2027-01-01T00:00+00:00",
     ["2026-11", "2026-12"]),
    (8, "0 2 * * *", NY, "2026-11-01T00:00-04:00", "2026-11-02T02:00-05:00",
     ["2026-10-31T02:00-04:00", "2026-11-01T02:00-05:00"]),
]
# fmt: on


@pytest.mark.parametrize(("n", "spec", "tz", "start", "end", "expected"), OVERLAPPING)
def test_overlapping(n: int, spec: str, tz: str, start: str, end: str, expected: list[str]) -> None:
    schedule = make(spec, tz)
    assert keys(schedule.overlapping(at(start), at(end))) == expected, f"case {n}"


# -- from_key ---------------------------------------------------------------------------------

# fmt: off
FROM_KEY = [
    # n, spec, zone, key, start, end
    (1, "day", "Europe/Berlin", "2026-10-25",
     "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00"),
    (2, "week", "UTC", "2026-W53", "2026-12-28T00:00:00+00:00", "2027-01-04T00:00:00+00:00"),
    (3, "week", "UTC", "2020-W53", "2020-12-28T00:00:00+00:00", "2021-01-04T00:00:00+00:00"),
    (4, "month", "UTC", "2026-02", "2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00"),
    (5, "quarter", "UTC", "2026-Q3", "2026-07-01T00:00:00+00:00", "2026-10-01T00:00:00+00:00"),
    (6, "year", "UTC", "2000", "2000-01-01T00:00:00+00:00", "2001-01-01T00:00:00+00:00"),
    (7, "hour", NY, "2026-11-01T01:00-05:00",
     "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"),
    (8, "hour", LH, "2026-10-04T02:30+11:00",
     "2026-10-04T02:30:00+11:00", "2026-10-04T03:00:00+11:00"),
    (9, "minute", "UTC", "2026-10-27T10:17+00:00",
     "2026-10-27T10:17:00+00:00", "2026-10-27T10:18:00+00:00"),
    (10, "hour", "Africa/Monrovia", "1972-01-07T00:44:30+00:00",
     "1972-01-07T00:44:30+00:00", "1972-01-07T01:00:00+00:00"),
    (11, "0 2 * * *", NY, "2026-03-08T03:00-04:00",
     "2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"),
]

NY_HOUR = "every hour, America/New_York"
NY_HOUR_EXAMPLE = "keys look like 2026-10-27T05:00-04:00"
FROM_KEY_REJECTS = [
    # n, spec, zone, key, message
    (1, "day", "Pacific/Apia", "2011-12-30", "no period '2011-12-30' in every day, Pacific/Apia"),
    (2, "day", "UTC", "2026-13-01", "no period '2026-13-01' in every day, UTC"),
    (3, "day", "UTC", "2026-02-30", "no period '2026-02-30' in every day, UTC"),
    (4, "day", "UTC", "2026-10-27T00:00+00:00",
     "bad period key '2026-10-27T00:00+00:00' for every day, UTC: keys look like 2026-10-27"),
    (5, "day", "UTC", "20261027",
     "bad period key '20261027' for every day, UTC: keys look like 2026-10-27"),
    (6, "week", "UTC", "2027-W53", "no period '2027-W53' in every week, UTC"),
    (7, "week", "UTC", "2026-W00", "no period '2026-W00' in every week, UTC"),
    (8, "week", "UTC", "2026-W1",
     "bad period key '2026-W1' for every week, UTC: keys look like 2026-W44"),
    (9, "month", "UTC", "2026-1",
     "bad period key '2026-1' for every month, UTC: keys look like 2026-10"),
    (10, "quarter", "UTC", "2026-Q5", "no period '2026-Q5' in every quarter, UTC"),
    (11, "quarter", "UTC", "2026-Q0", "no period '2026-Q0' in every quarter, UTC"),
    (12, "year", "UTC", "0000", "no period '0000' in every year, UTC"),
    (13, "year", "UTC", "26", "bad period key '26' for every year, UTC: keys look like 2026"),
    (14, "year", "UTC", "２０２６",
     "bad period key '２０２６' for every year, UTC: keys look like 2026"),
    # In the gap, 02:00 EST is 03:00 EDT and 02:00 EDT is 01:00 EST: neither starts a period.
    (15, "hour", NY, "2026-03-08T02:00-05:00", f"no period '2026-03-08T02:00-05:00' in {NY_HOUR}"),
    (16, "hour", NY, "2026-03-08T02:00-04:00", f"no period '2026-03-08T02:00-04:00' in {NY_HOUR}"),
    (17, "hour", NY, "2026-11-01T01:00-06:00", f"no period '2026-11-01T01:00-06:00' in {NY_HOUR}"),
    (18, "hour", NY, "2026-10-27T10:30-04:00", f"no period '2026-10-27T10:30-04:00' in {NY_HOUR}"),
    (19, "hour", NY, "2026-10-27T10:00:00-04:00",
     f"no period '2026-10-27T10:00:00-04:00' in {NY_HOUR}"),
    (20, "hour", NY, "2026-10-27 10:00-04:00",
     f"bad period key '2026-10-27 10:00-04:00' for {NY_HOUR}: {NY_HOUR_EXAMPLE}"),
    (21, "hour", NY, "2026-10-27T10:00Z",
     f"bad period key '2026-10-27T10:00Z' for {NY_HOUR}: {NY_HOUR_EXAMPLE}"),
    (22, "hour", LH, "2026-10-04T02:00+10:30",
     "no period '2026-10-04T02:00+10:30' in every hour, Australia/Lord_Howe"),
    (23, "0 2 * * *", NY, "2026-10-27T03:00-04:00",
     "no period '2026-10-27T03:00-04:00' in cron '0 2 * * *', America/New_York"),
    (24, "day", "UTC", "", "bad period key '' for every day, UTC: keys look like 2026-10-27"),
]
# fmt: on


@pytest.mark.parametrize(("n", "spec", "tz", "key", "start", "end"), FROM_KEY)
def test_from_key(n: int, spec: str, tz: str, key: str, start: str, end: str) -> None:
    period = make(spec, tz).from_key(key)
    assert shown(period) == (key, start, end), f"case {n}"


@pytest.mark.parametrize(("n", "spec", "tz", "key", "message"), FROM_KEY_REJECTS)
def test_from_key_rejects(n: int, spec: str, tz: str, key: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        make(spec, tz).from_key(key)
    assert str(caught.value) == message, f"case {n}"


# -- resolve and parse_instant ----------------------------------------------------------------

# fmt: off
RESOLVE = [
    # n, spec, zone, text, the key of the period it resolves to
    (1, "day", "Europe/Berlin", "2026-10-27", "2026-10-27"),
    (2, "day", "Europe/Berlin", "2026-10-27T23:30", "2026-10-27"),
    (3, "day", "Europe/Berlin", "2026-10-27T23:30+00:00", "2026-10-28"),
    (4, "day", "Europe/Berlin", "2026-10-27T22:30Z", "2026-10-27"),
    (5, "hour", NY, "2026-11-01T01:30", "2026-11-01T01:00-04:00"),  # the first 01:30
    (6, "hour", NY, "2026-11-01T01:30-05:00", "2026-11-01T01:00-05:00"),
    (7, "hour", NY, "2026-03-08T02:30", "2026-03-08T03:00-04:00"),  # in the gap
    (8, "hour", NY, "2026-11-01T01:00-05:00", "2026-11-01T01:00-05:00"),
    (9, "month", "UTC", "2026-10", "2026-10"),
    (10, "month", "UTC", "2026-10-27", "2026-10"),
    (11, "quarter", "UTC", "2026-Q4", "2026-Q4"),
    (12, "week", "UTC", "2026-W53", "2026-W53"),
    (13, "year", "UTC", "2026", "2026"),
    (14, "day", "Pacific/Apia", "2011-12-30", "2011-12-31"),  # the date's first instant
    (15, "day", "America/Santiago", "2026-09-06", "2026-09-06"),
    (16, "0 2 * * *", NY, "2026-11-01", "2026-10-31T02:00-04:00"),
    (17, "0 2 * * *", NY, "2026-03-08T03:00-04:00", "2026-03-08T03:00-04:00"),
]

PARSE_INSTANT = [
    # n, spec, zone, text, the instant it means
    (1, "day", "Europe/Berlin", "2026-10-24", "2026-10-24T00:00:00+02:00"),
    (2, "day", "Europe/Berlin", "2026-10-25T02:30", "2026-10-25T02:30:00+02:00"),  # the first
    (3, "day", "Europe/Berlin", "2026-10-27T10:00Z", "2026-10-27T11:00:00+01:00"),
    (4, "day", "Europe/Berlin", "2026-10-27T10:00:00.5-04:00", "2026-10-27T15:00:00+01:00"),
    (5, "day", "America/Santiago", "2026-09-06", "2026-09-06T01:00:00-03:00"),
    (6, "hour", NY, "2026-03-08T02:30", "2026-03-08T03:00:00-04:00"),
    (7, "day", "Pacific/Apia", "2011-12-30", "2011-12-31T00:00:00+14:00"),
    (8, "quarter", "Europe/Berlin", "2026-Q4", "2026-10-01T00:00:00+02:00"),
    (9, "week", "UTC", "2026-W53", "2026-12-28T00:00:00+00:00"),
    (10, "month", "America/Havana", "2026-11", "2026-11-01T00:00:00-04:00"),
    (11, "hour", NY, "2026-11-01T01:00-05:00", "2026-11-01T01:00:00-05:00"),
]

BAD_TIME = "use an ISO 8601 date or datetime, or a period key like"
PARSE_INSTANT_REJECTS = [
    # n, spec (in UTC), text, message
    (1, "day", "yesterday", f"bad time 'yesterday': {BAD_TIME} 2026-10-27"),
    (2, "quarter", "2026-Q5", "no period '2026-Q5' in every quarter, UTC"),
    (3, "day", "2026-10", f"bad time '2026-10': {BAD_TIME} 2026-10-27"),
    (4, "hour", "", f"bad time '': {BAD_TIME} 2026-10-27T09:00+00:00"),
    (5, "day", "9999-12-31T23:00-05:00", "'9999-12-31T23:00-05:00' is out of range"),
    (6, "day", "0001-01-01T00:00+05:00", "'0001-01-01T00:00+05:00' is out of range"),
]
# fmt: on


@pytest.mark.parametrize(("n", "spec", "tz", "text", "key"), RESOLVE)
def test_resolve(n: int, spec: str, tz: str, text: str, key: str) -> None:
    assert make(spec, tz).resolve(text).key == key, f"case {n}"


@pytest.mark.parametrize(("n", "spec", "tz", "text", "instant"), PARSE_INSTANT)
def test_parse_instant(n: int, spec: str, tz: str, text: str, instant: str) -> None:
    schedule = make(spec, tz)
    parsed = schedule.parse_instant(text)
    assert iso(parsed) == instant, f"case {n}"
    assert parsed.tzinfo is schedule.tz


@pytest.mark.parametrize(("n", "spec", "text", "message"), PARSE_INSTANT_REJECTS)
def test_parse_instant_rejects(n: int, spec: str, text: str, message: str) -> None:
    schedule = periods.every(spec, "UTC")
    for parse in (schedule.parse_instant, schedule.resolve):
        with pytest.raises(SpecError) as caught:
            parse(text)
        assert str(caught.value) == message, f"case {n}"


# -- bad specs, zones, schedules --------------------------------------------------------------

# fmt: off
UNITS_THAT_DO_NOT_DIVIDE = [
    (1, "7m", "--every 7m: minutes must divide 60"),
    (2, "0m", "--every 0m: minutes must divide 60"),
    (3, "45m", "--every 45m: minutes must divide 60"),
    (4, "120m", "--every 120m: minutes must divide 60"),
    (5, "5h", "--every 5h: hours must divide 24"),
    (6, "25h", "--every 25h: hours must divide 24"),
    (7, "0h", "--every 0h: hours must divide 24"),
]
# With the spelling --every takes where one is near ("" where none is).
UNKNOWN_SPECS = [
    ("fortnight", ""), ("", ""), ("15M", "15m"), ("015m", "15m"), ("1.5h", ""), ("m", ""),
    ("h", ""), ("1d", ""), ("Day", "day"), (" day", "day"), ("15 m", "15m"), ("1w", ""),
    ("5min", "5m"), ("2 hours", "2h"), ("daily", "day"), ("hourly", "hour"), ("dya", "day"),
    ("weeks", "week"),
]
ALLOWED = (
    "use minute, Nm (N divides 60), hour, Nh (N divides 24), day, week, month, quarter or year"
)
DIVIDING_UNITS = [
    ("minute", 1), ("1m", 1), ("5m", 5), ("60m", 60), ("hour", 60), ("1h", 60), ("8h", 480),
    ("24h", 1440),
]
FIVE_FIELDS = "use five fields, minute hour day-of-month month day-of-week"
BAD_CRON = [
    ("61 * * * *", "bad minute"),
    ("0 24 * * *", "bad hour"),
    ("0 0 32 * *", "bad day-of-month"),
    ("0 0 30 2 *", "bad day-of-month"),  # it would never fire
    ("0 0 * 13 *", "bad month"),
    ("0 0 * * 8", "bad day-of-week"),
    ("a b c d e", "bad minute"),
    ("*/0 * * * *", "bad minute"),
    ("5-1 * * * *", "the minute range 5-1 wraps around: write it as two, 5-59,0-1"),
    ("* * * *", FIVE_FIELDS),
    ("0 * * * * *", FIVE_FIELDS),
    ("@fortnightly", "unknown nickname; use one of @annually, @daily, @hourly, @midnight, "
                     "@monthly, @weekly, @yearly or five fields"),
    ("", FIVE_FIELDS),
]
# With the zone named in the hint ("" where none is near).
UNKNOWN_ZONES = [
    ("Mars/Base", ""), ("", ""), ("America", ""), ("../etc/passwd", ""),
    ("/etc/localtime", ""), ("utc", "UTC"), ("zone.tab", ""),
    ("Europe/Berlin/", "Europe/Berlin"), ("a\x00b", ""), ("America/New York", "America/New_York"),
    ("Europe/Berln", "Europe/Berlin"), ("europe/berlin", "Europe/Berlin"),
]
# fmt: on


@pytest.mark.parametrize(("n", "spec", "message"), UNITS_THAT_DO_NOT_DIVIDE)
def test_every_rejects_units_that_do_not_divide(n: int, spec: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        periods.every(spec, "UTC")
    assert str(caught.value) == message, f"case {n}"


@pytest.mark.parametrize(("spec", "meant"), UNKNOWN_SPECS)
def test_every_rejects_unknown_specs(spec: str, meant: str) -> None:
    with pytest.raises(SpecError) as caught:
        periods.every(spec, "UTC")
    hint = f"; did you mean {meant!r}?" if meant else ""
    assert str(caught.value) == f"--every {spec!r}: {ALLOWED}{hint}"


@pytest.mark.parametrize(("spec", "unit_minutes"), DIVIDING_UNITS)
def test_every_accepts_dividing_units(spec: str, unit_minutes: int) -> None:
    schedule = periods.every(spec, "UTC")
    period = schedule.containing(at("2026-10-27T10:17:00+00:00"))
    assert (period.end - period.start).total_seconds() == unit_minutes * 60
    assert (schedule.kind, schedule.spec, schedule.tz_name) == ("every", spec, "UTC")


def test_every_specs_lists_exactly_what_every_takes() -> None:
    # Every spelling of a count of minutes or hours up to 1500, accepted or refused, against
    # the list the completion and the drawing tests iterate over.
    listed = set(periods.every_specs(every_spelling=True))
    for spec in [f"{n}{unit}" for n in range(1500) for unit in "mh"] + [
            spec for spec, _ in UNKNOWN_SPECS]:
        try:
            periods.every(spec, "UTC")
        except SpecError:
            assert spec not in listed, spec
        else:
            assert spec in listed, spec
    for spec in listed:
        periods.every(spec, "UTC")
    assert set(periods.every_specs()) == listed - {"1m", "60m", "1h", "24h"}


def test_a_schedule_says_what_its_periods_span() -> None:
    # What the reports draw and count by, instead of parsing the spec again.
    for spec, minutes in DIVIDING_UNITS:
        schedule = periods.every(spec, "UTC")
        assert (schedule.minutes, schedule.calendar) == (minutes, ""), spec
    for spec in ("day", "week", "month", "quarter", "year"):
        schedule = periods.every(spec, "UTC")
        assert (schedule.minutes, schedule.calendar) == (0, spec), spec
    cron = schedules.cron("0 2 * * *", "UTC")
    assert (cron.minutes, cron.calendar) == (0, "")


@pytest.mark.parametrize(("expr", "message"), BAD_CRON)
def test_cron_rejects(expr: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        schedules.cron(expr, "UTC")
    assert str(caught.value) == f"--cron {expr!r}: {message}"


def test_cron_accepts_names_and_keeps_the_expression() -> None:
    schedule = schedules.cron("0 9 * * mon-fri", NY)
    assert (schedule.kind, schedule.spec, schedule.tz_name) == ("cron", "0 9 * * mon-fri", NY)
    assert schedule.containing(at("2026-10-31T12:00-04:00")).key == "2026-10-30T09:00-04:00"


@pytest.mark.parametrize(("name", "meant"), UNKNOWN_ZONES)
def test_unknown_zones(name: str, meant: str) -> None:
    attempts: list[Callable[[], object]] = [
        lambda: periods.zone(name),
        lambda: periods.every("day", name),
        lambda: schedules.cron("0 2 * * *", name),
    ]
    for attempt in attempts:
        with pytest.raises(SpecError) as caught:
            attempt()
        hint = f": did you mean {meant!r}?" if meant else ""
        assert str(caught.value) == f"unknown time zone {name!r}{hint}"


def test_zone_keeps_the_name_given() -> None:
    schedule = schedules.schedule("day", None, "Asia/Kathmandu")
    assert schedule.tz == periods.zone("Asia/Kathmandu")
    assert schedule.tz_name == "Asia/Kathmandu"


def test_schedule_needs_exactly_one_of_every_and_cron() -> None:
    with pytest.raises(SpecError, match=r"^use --every or --cron, not both$"):
        schedules.schedule("day", "0 2 * * *", "UTC")
    with pytest.raises(SpecError, match=r"^use --every SPEC or --cron EXPR$"):
        schedules.schedule(None, None, "UTC")
    assert schedules.schedule("day", None, "UTC").kind == "every"
    assert schedules.schedule(None, "0 2 * * *", "UTC").kind == "cron"
    with pytest.raises(SpecError, match=r"^--every '': "):
        schedules.schedule("", None, "UTC")


def test_str_names_the_schedule() -> None:
    assert str(periods.every("15m", "Europe/Berlin")) == "every 15m, Europe/Berlin"
    assert str(schedules.cron("0 2 * * *", "UTC")) == "cron '0 2 * * *', UTC"


# -- iso --------------------------------------------------------------------------------------

# fmt: off
ISO = [
    # n, instant, zone, iso() of the instant in the zone
    (1, "2026-10-26T23:00:00+00:00", "Europe/Berlin", "2026-10-27T00:00:00+01:00"),
    (2, "2026-10-27T10:00:00.999999+00:00", "UTC", "2026-10-27T10:00:00+00:00"),
    (3, "2026-11-01T06:30:00+00:00", NY, "2026-11-01T01:30:00-05:00"),
    (4, "1930-06-01T00:00:00+00:00", "Europe/Amsterdam", "1930-06-01T01:19:32+01:19:32"),
    (5, "2026-10-27T00:00:00+00:00", "Asia/Kathmandu", "2026-10-27T05:45:00+05:45"),
]
# fmt: on


@pytest.mark.parametrize(("n", "instant", "tz", "expected"), ISO)
def test_iso(n: int, instant: str, tz: str, expected: str) -> None:
    assert iso(at(instant).astimezone(periods.zone(tz))) == expected, f"case {n}"


def test_iso_of_utc() -> None:
    assert iso(datetime(2026, 10, 27, tzinfo=UTC)) == "2026-10-27T00:00:00+00:00"


# -- the hot path -----------------------------------------------------------------------------


def test_every_schedules_do_not_import_cronsim() -> None:
    """cronsim costs about 12 ms to import: only cron schedules may pay for it."""
    script = (
        "import sys\n"
        "from datetime import UTC, datetime\n"
        "from once import periods\n"
        "periods.every('day', 'Europe/Berlin').containing(datetime.now(UTC))\n"
        "assert 'cronsim' not in sys.modules, 'cronsim was imported'\n"
    )
    in_child(script)


@pytest.mark.parametrize("spec", ["day", "week", "month", "quarter", "year"])
def test_the_last_and_first_calendar_periods_past_the_range_overflow(spec: str) -> None:
    """A period that would end past 9999 or start before year 1 is OverflowError (the CLI's
    `out of range` line, exit 2), for every calendar unit alike: months, quarters and years
    once raised date()'s ValueError, a traceback (make torture: `once periods --every quarter
    --from 9999-12-31`)."""
    schedule = periods.every(spec, "UTC")
    with pytest.raises(OverflowError):
        schedule.containing(datetime(9999, 12, 31, 12, tzinfo=UTC))
    first = schedule.containing(datetime(1, 1, 1, 12, tzinfo=UTC))
    with pytest.raises(OverflowError):
        schedule.previous(first)

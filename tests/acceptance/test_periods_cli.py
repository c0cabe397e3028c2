"""`once periods`, the real command in a subprocess: what scripts and the man page rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def once_periods(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    # The source tree first, so that the test runs the code under test even when once is
    # not installed (or installed from elsewhere).
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "once", "periods", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


RANGE = ["--from", "2026-10-24", "--to", "2026-10-27"]
BERLIN_DAYS = ["--every", "day", "--tz", "Europe/Berlin", *RANGE]
BERLIN_LINES = [
    "2026-10-24 2026-10-24T00:00:00+02:00 2026-10-25T00:00:00+02:00",
    "2026-10-25 2026-10-25T00:00:00+02:00 2026-10-26T00:00:00+01:00",  # 25 hours
    "2026-10-26 2026-10-26T00:00:00+01:00 2026-10-27T00:00:00+01:00",
]


def test_plain_output_is_one_period_a_line() -> None:
    done = once_periods(*BERLIN_DAYS)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == BERLIN_LINES


def test_json_output_is_an_array_of_key_start_end() -> None:
    done = once_periods(*BERLIN_DAYS, "--json")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == [
        {"key": key, "start": start, "end": end}
        for key, start, end in (line.split(" ") for line in BERLIN_LINES)
    ]


def keys_of(*args: str) -> list[str]:
    done = once_periods(*args)
    assert (done.returncode, done.stderr) == (0, "")
    return [line.split(" ")[0] for line in done.stdout.splitlines()]


def test_the_repeated_hour_gives_two_periods() -> None:
    ny = ["--every", "hour", "--tz", "America/New_York"]
    # --to without an offset is read in the zone: 02:00 happens once, in EST.
    assert keys_of(*ny, "--from", "2026-11-01T00:30", "--to", "2026-11-01T02:00") == [
        "2026-11-01T00:00-04:00",
        "2026-11-01T01:00-04:00",
        "2026-11-01T01:00-05:00",
    ]


def test_the_skipped_hour_gives_no_period() -> None:
    ny = ["--every", "hour", "--tz", "America/New_York"]
    assert keys_of(*ny, "--from", "2026-03-08T00:00", "--to", "2026-03-08T04:00") == [
        "2026-03-08T00:00-05:00",
        "2026-03-08T01:00-05:00",
        "2026-03-08T03:00-04:00",
    ]


def test_bounds_may_be_period_keys() -> None:
    week = ["--every", "week", "--tz", "UTC"]
    assert keys_of(*week, "--from", "2026-W52", "--to", "2027-W02") == [
        "2026-W52",
        "2026-W53",
        "2027-W01",
    ]


def test_cron_periods_run_from_fire_time_to_fire_time() -> None:
    done = once_periods(
        *["--cron", "0 2 * * *", "--tz", "America/New_York"],
        *["--from", "2026-03-07T12:00", "--to", "2026-03-09T12:00"],
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "2026-03-07T02:00-05:00 2026-03-07T02:00:00-05:00 2026-03-08T03:00:00-04:00",
        "2026-03-08T03:00-04:00 2026-03-08T03:00:00-04:00 2026-03-09T02:00:00-04:00",
        "2026-03-09T02:00-04:00 2026-03-09T02:00:00-04:00 2026-03-10T02:00:00-04:00",
    ]


def test_the_zone_comes_from_once_tz() -> None:
    done = once_periods(
        "--every", "day", "--from", "2026-10-27", "--to", "2026-10-28",
        env={"ONCE_TZ": "Asia/Kathmandu"},
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "2026-10-27 2026-10-27T00:00:00+05:45 2026-10-28T00:00:00+05:45\n"


def test_an_empty_range_lists_nothing() -> None:
    empty = ["--every", "hour", "--from", "2026-10-27T10:30Z", "--to", "2026-10-27T10:30Z"]
    done = once_periods(*empty)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    done = once_periods(*empty, "--json")
    assert (done.returncode, json.loads(done.stdout), done.stderr) == (0, [], "")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--every", "7m", *RANGE], "--every 7m: minutes must divide 60"),
        (["--every", "5h", *RANGE], "--every 5h: hours must divide 24"),
        (["--every", "fortnight", *RANGE], "--every 'fortnight'"),
        (["--cron", "61 * * * *", *RANGE], "--cron '61 * * * *': bad minute"),
        (["--cron", "0 2 * *", *RANGE], "--cron '0 2 * *': use five fields"),
        (["--every", "day", "--cron", "0 2 * * *", *RANGE], "--every or --cron"),
        ([*RANGE], "--every"),
        (["--every", "day", "--tz", "Mars/Base", *RANGE], "unknown time zone 'Mars/Base'"),
        (["--every", "day", "--from", "yesterday", "--to", "2026-10-27"], "bad time 'yesterday'"),
        (["--every", "day", "--from", "2026-10-24", "--to", "2026-13-45"], "'2026-13-45'"),
        (["--every", "quarter", "--from", "2026-Q5", "--to", "2027"], "no period '2026-Q5'"),
    ],
)
def test_bad_spec_zone_or_bound_is_a_usage_error(args: list[str], says: str) -> None:
    done = once_periods(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("once: ")
    assert says in lines[0]

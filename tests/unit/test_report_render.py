"""once.report.render: durations in words, the status table's cells, plain tables, the
history's status words, `once status --json`'s object and the indented JSON it is printed
as, without a database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_states import NOW, day_job, row

from once.report import indented_json, plain_table, status_cells, status_object, status_word
from once.report.render import age, history_cells, short_key, took


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "0s"), (0, "0s"), (42.4, "42s"), (60, "1m"), (3599, "59m"), (3600, "1h"),
    (3600 + 12 * 60 + 59, "1h 12m"), (86400, "1d"), (2 * 86400 + 4 * 3600 + 59 * 60, "2d 4h"),
])
def test_age_is_the_largest_two_units_rounded_down(seconds: float, text: str) -> None:
    assert age(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.04, "0.0s"), (12.34, "12.3s"), (59.94, "59.9s"), (90, "1m"),
    (7200, "2h"),
])
def test_took_shows_tenths_under_a_minute(seconds: float | None, text: str) -> None:
    assert took(seconds) == text


def test_status_cells_of_a_job_with_every_kind_of_trouble() -> None:
    s = day_job()
    s.last_done = row("2026-11-28", "done", took=12.5)
    s.open_rows = [row("2026-11-29", "failed", attempt=3, exit_code=4),
                   row("2026-11-30", "failed", exit_code=1),
                   row("2026-11-30", "running", attempt=2, beat_ago=600),
                   row("2026-12-01", "running", beat_ago=5)]
    s.no_row, s.no_row_listed = 2, [(row("2026-11-21", "x").period_start, "2026-11-21"),
                                    (row("2026-11-22", "x").period_start, "2026-11-22")]
    cells = status_cells(s, NOW)
    finished = (NOW - s.last_done.finished_at).total_seconds()
    assert cells == [
        ("nightly", "bold"), ("every day", ""), ("UTC", ""), ("2026-11-28", "green"),
        (f"{age(finished)} ago", ""), ("12.5s", ""),
        ("2026-12-01 vm:42 #1, beat 5s ago (+1)", "bold yellow"),  # one of them is stale
        ("2 (1 out)", "bold red"),
        ("3 from 2026-11-21", "bold red"),  # two without a row, one stale due attempt
        ("2026-12-01 running", "cyan"),  # today's period: its attempt is live
        ("2026-12-02 in 12h", ""),
    ]
    assert age(finished) == "2d 11h"
    compact = status_cells(s, NOW, compact=True)
    assert [text for text, _ in compact] == [
        "nightly", "day", "UTC", "11-28", "2d11h ago", "12.5s",
        "12-01 vm:42 #1, beat 5s ago (+1)", "2 (1 out)", "3 from 11-21", "running",
        "12-02 in 12h"]


def test_status_cells_of_a_quiet_job_and_of_an_unreadable_one() -> None:
    quiet = status_cells(day_job(), NOW)
    assert quiet[3:] == [("never", "yellow"), ("-", ""), ("-", ""), ("-", ""), ("0", ""),
                         ("0", ""), ("2026-12-01 not run", ""), ("2026-12-02 in 12h", "")]
    broken = day_job()
    broken.sched, broken.error = None, "unknown time zone 'Mars/Olympus'"
    cells = status_cells(broken, NOW)
    assert cells[3] == ("cannot read the schedule: unknown time zone 'Mars/Olympus'", "red")
    assert len(cells) == 11 and cells[4:] == [("", "")] * 7


def test_a_cron_gap_counted_only_in_part_says_so() -> None:
    s = day_job()
    s.no_row, s.no_row_at_least = 100_000, True
    assert status_cells(s, NOW)[8] == ("100000+", "bold red")


@pytest.mark.parametrize(("key", "text"), [
    ("2026-12-01T22:00+00:00", "22:00"),  # today: the time of day alone
    ("2026-11-29T01:00-05:00", "11-29 01:00"),  # this year
    ("2025-12-31T23:30+10:30", "2025-12-31 23:30"),
    ("2026-11-28", "11-28"), ("2025-11-28", "2025-11-28"), ("2026-12-01", "12-01"),
    ("2026-12-01T06:00+00:00#3", "06:00#3"), ("2026-W49", "2026-W49"), ("2026-Q4", "2026-Q4"),
    ("2026-12", "2026-12"), ("(state)", "(state)"),
])
def test_short_keys_drop_what_the_date_now_says(key: str, text: str) -> None:
    assert short_key(key, NOW.date()) == text


@pytest.mark.parametrize(("rows", "done", "state"), [
    ([], 0, "not-run"), ([], 1, "done"), ([("running", 5)], 0, "running"),
    ([("running", 900)], 0, "stale"), ([("failed", 0)], 0, "failed"),
])
def test_the_current_periods_state(rows: list[tuple[str, float]], done: int,
                                   state: str) -> None:
    s = day_job()
    s.open_rows = [row("2026-11-30", "failed")]  # another period's row changes nothing
    s.open_rows += [row("2026-12-01", status, beat_ago=beat) for status, beat in rows]
    s.current_done = done
    assert s.current_state == state
    assert status_object(s)["current_state"] == state


def test_a_sharded_current_period_is_done_when_every_shard_is() -> None:
    s = day_job(shards=3)
    s.current_done = 2
    assert s.current_state == "not-run"
    assert status_cells(s, NOW)[9] == ("2026-12-01 2/3 done", "")
    s.open_rows = [row("2026-12-01#2", "running")]
    assert s.current_state == "running"
    s.open_rows, s.current_done = [], 3
    assert s.current_state == "done"


def test_plain_table_aligns_columns_and_escapes_controls() -> None:
    text = plain_table(["A", "LONG"], [[("x", ""), ("y", "")],
                                       [("wide\x1b[2Jcell", "red"), ("", "")]])
    assert text.split("\n") == ["A" + " " * 18 + "LONG",  # the escaped cell is 17 wide
                                "x" + " " * 18 + "y",
                                "wide\\u001b[2Jcell"]


@pytest.mark.parametrize(("status", "outcome", "word"), [
    ("done", "exited", "done"), ("done", None, "done"), ("failed", "failed", "failed"),
    ("failed", "timed-out", "failed (timed-out)"), ("running", "stale", "stale"),
    ("running", "taken-over", "taken-over"),
])
def test_status_word(status: str, outcome: str | None, word: str) -> None:
    assert status_word({"status": status, "outcome": outcome}) == word


def test_history_cells_style_by_outcome_and_show_local_times() -> None:
    entry = {"period": "2026-11-30", "attempt": 2, "fence": 7, "owner": "vm:1",
             "started_at": "2026-12-01T00:01:00.5+01:00", "finished_at": None,
             "duration_s": None, "status": "failed", "outcome": "timed-out", "exit_code": 124,
             "reason": None, "last_line": "killed"}
    assert history_cells(entry) == [
        ("2026-11-30", ""), ("2", ""), ("7", ""), ("vm:1", ""), ("2026-12-01 00:01:00", ""),
        ("-", ""), ("-", ""), ("failed (timed-out)", "bold red"), ("124", ""), ("", ""),
        ("killed", "")]


def test_status_object_of_a_troubled_job() -> None:
    s = day_job()
    s.last_done = row("2026-11-30", "done", took=1.23456)
    stale = row("2026-11-29", "running", attempt=2, beat_ago=301)
    s.open_rows = [stale, row("2026-11-30", "failed", attempt=3, exit_code=9)]
    s.failure_lines = {"2026-11-30": "disk full"}
    obj = status_object(s)
    assert obj["last_done"] == "2026-11-30" and obj["last_duration_s"] == 1.235
    assert obj["last_finished_at"] == "2026-12-01T00:01:01+00:00"
    assert obj["running"][0]["stale"] is True and obj["running"][0]["due"] is True
    assert obj["running"][0]["heartbeat_age_s"] == 301.0
    assert obj["failed"] == 1 and obj["failed_out"] == 1
    assert obj["failed_periods"][0]["attempts_left"] == 0
    assert obj["last_failure"]["last_line"] == "disk full"
    assert obj["missing"] == 1 and obj["missing_periods"] == ["2026-11-29"]
    assert obj["missing_last"] == "2026-11-29"
    assert (obj["due_through"], obj["current"], obj["next"]) == (
        "2026-11-30", "2026-12-01", "2026-12-02")
    assert obj["next_at"] == "2026-12-02T00:00:00+00:00"
    assert list(obj)[:3] == ["job", "kind", "schedule"] and obj["error"] is None


_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
_KEYS = st.text() | st.integers() | st.floats() | st.booleans() | st.none()
_DOCUMENTS = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                          | st.tuples(inner, inner) | st.dictionaries(_KEYS, inner, max_size=4),
                          max_leaves=30)


@settings(max_examples=500, deadline=None)
@given(_DOCUMENTS)
def test_indented_json_is_what_json_dumps_writes(document: Any) -> None:
    """Every scalar (non-ASCII text, NaN and the infinities, big integers), key (not only
    strings) and nesting, empty lists and dicts included, as json.dumps(indent=2) has it."""
    assert indented_json(document) == json.dumps(document, indent=2)


def test_indented_json_of_a_status_object_and_of_what_json_refuses() -> None:
    s = day_job()
    s.open_rows = [row("2026-11-29", "failed", attempt=3, exit_code=1),
                   row("2026-12-01", "running", beat_ago=5)]
    s.failure_lines = {"2026-11-29": "boom: \u00e9t\u00e9 \"quoted\"\n"}
    obj = [{**status_object(s), "ledger": "sqlite:///x", "standby": {"replay_lag_s": 0.5}}]
    assert indented_json(obj) == json.dumps(obj, indent=2)
    with pytest.raises(TypeError, match="not JSON serializable"):
        indented_json({"at": NOW})
    with pytest.raises(TypeError, match="keys must be"):
        indented_json({("a",): 1})

"""A hung run is loud: a live attempt that has held a due period longer than the period lasts
(plus --grace) is an overrun finding (once check), a state in status and its JSON, and a
metric (pure: no database). The attempt's own time decides, not the period's age: a rerun or
a catch-up of an old period is no overrun when it starts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from report_states import day_job, row

from once.ledger.rows import RunRow
from once.report import JobState
from once.report.check import CRITICAL, findings
from once.report.metrics import exposition
from once.report.render import status_objects
from once.schedules import schedule

DAY = 24 * 3600.0
RUNNING_S = DAY + 3600  # a day and an hour: longer than its period


def test_a_live_attempt_that_ran_longer_than_its_period_is_an_overrun() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-29", "running", job="billing", started_ago=RUNNING_S)]
    [finding] = findings([s])
    assert (finding.severity, finding.problem) == (CRITICAL, "overrun")
    assert finding.line == ("CRITICAL billing 2026-11-29 overrun (owner vm:42, attempt 1, "
                            "running 1d 1h)")
    assert finding.as_dict()["running_s"] == RUNNING_S


def test_a_fresh_rerun_or_catch_up_of_an_old_period_is_no_overrun() -> None:
    # An operator's rerun 3 s old, a catch-up of a period a week back: the period is long
    # due, but the attempt has run for seconds, not for a period.
    s = day_job("billing")
    s.open_rows = [row("2026-11-22", "running", job="billing", started_ago=3),
                   row("2026-11-30", "running", job="billing", started_ago=3)]
    assert findings([s]) == []
    assert [r["overrun"] for r in status_objects([s])[0]["running"]] == [False, False]
    assert 'once_overrun_attempts{once_job="billing"} 0' in exposition([s], {})


def test_overrun_is_past_the_periods_length_plus_grace() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-29", "running", job="billing", started_ago=DAY)]
    assert findings([s]) == []  # its period's length exactly: not past it
    s.open_rows = [row("2026-11-29", "running", job="billing", started_ago=DAY + 1)]
    assert [f.problem for f in findings([s])] == ["overrun"]
    s.grace = 3600.0  # once check --grace 1h
    assert findings([s]) == []
    s.open_rows = [row("2026-11-29", "running", job="billing", started_ago=DAY + 3601)]
    assert [f.problem for f in findings([s])] == ["overrun"]


def test_the_periods_own_length_counts_a_day_of_25_hours() -> None:
    # Berlin's day of 25 October 2026 has 25 hours (summer time ends): 24.5 h is within it.
    berlin = schedule("day", None, "Europe/Berlin")
    now = datetime(2026, 10, 27, 12, 0, tzinfo=UTC)
    s = JobState("long", "every", "day", "Europe/Berlin", 0, 3, 300.0, 3,
                 datetime(2026, 10, 20, tzinfo=UTC), 1, False, now)
    s.sched, s.first = berlin, berlin.from_key("2026-10-20")
    s.current = berlin.containing(now)
    s.due_last = berlin.previous(s.current)
    period = berlin.from_key("2026-10-25")

    def running_for(hours: float) -> RunRow:
        return RunRow("long", "2026-10-25", "running", 1, 1, "vm:42",
                      period.start.astimezone(UTC), period.end.astimezone(UTC),
                      now - timedelta(hours=hours), now - timedelta(seconds=5), None, None,
                      300.0)

    s.open_rows = [running_for(24.5)]
    assert findings([s]) == []
    s.open_rows = [running_for(25.5)]
    assert [f.problem for f in findings([s])] == ["overrun"]


def test_a_stale_attempt_is_stale_not_overrun() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-29", "running", job="billing", beat_ago=3600,
                       started_ago=RUNNING_S)]
    assert [f.problem for f in findings([s])] == ["stale"]


def test_a_live_attempt_of_a_period_not_yet_due_is_fine() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-12-01", "running", job="billing", started_ago=RUNNING_S)]
    assert findings([s]) == []


def test_status_json_and_metrics_show_the_overrun() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-29", "running", job="billing", started_ago=RUNNING_S)]
    [running] = status_objects([s])[0]["running"]
    assert running["overrun"] is True and running["running_s"] == RUNNING_S
    text = exposition([s], {})
    assert 'once_overrun_attempts{once_job="billing"} 1' in text
    assert f'once_oldest_running_seconds{{once_job="billing"}} {RUNNING_S:g}' in text


"""once.report.model: the pure rules over a job's rows: last lines, timeline cells, the
default timeline length, and `once history`'s entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from report_states import NOW, SCHED, day_job, row

from once.report import attempt_entry, last_line
from once.report.model import default_last, period_state
from once.schedules import schedule


@pytest.mark.parametrize(("output", "line"), [
    (None, None), ("", None), ("\n  \n\r\n", None), ("one", "one"),
    ("first\nlast\n\n", "last"), ("  padded  \n", "padded"),
    ("copying 10%\rcopying 100%\r\n", "copying 100%"), ("done\r\n", "done"),
    ("error: disk full\n\n   \n", "error: disk full"),
])
def test_last_line(output: str | None, line: str | None) -> None:
    assert last_line(output) == line


def _stored(status: str, beat_ago: float = 10.0, stale_after: float = 300.0) -> SimpleNamespace:
    """A once_runs row as the timeline reads it (naive UTC, as SQLite hands it back)."""
    return SimpleNamespace(status=status, stale_after=stale_after,
                           heartbeat_at=(NOW - timedelta(seconds=beat_ago)).replace(tzinfo=None))


def _day(key: str) -> object:
    return SCHED.containing(datetime.fromisoformat(key).replace(tzinfo=UTC))


@pytest.mark.parametrize(("key", "rows", "state"), [
    ("2026-11-19", [], "none"),  # before the job's first period
    ("2026-11-25", [], "missing"),
    ("2026-12-01", [], "pending"),  # today's is not due yet
    ("2026-11-25", [_stored("done")], "done"),
    ("2026-11-25", [_stored("running", beat_ago=301)], "stale"),
    ("2026-11-25", [_stored("running", beat_ago=299)], "running"),
    ("2026-11-25", [_stored("failed"), _stored("running", beat_ago=999)], "stale"),
    ("2026-11-25", [_stored("done"), _stored("failed")], "failed"),
    ("2026-11-19", [_stored("done")], "done"),  # a row before first: shown as it is
])
def test_period_state(key: str, rows: list[SimpleNamespace], state: str) -> None:
    assert period_state(day_job(), _day(key), rows) == state  # type: ignore[arg-type]


def test_a_sharded_period_is_as_bad_as_its_worst_shard() -> None:
    s = day_job(shards=3)
    assert period_state(s, _day("2026-11-25"), [_stored("done")] * 2) == "missing"  # type: ignore[arg-type]
    assert period_state(s, _day("2026-12-01"), [_stored("done")] * 2) == "pending"  # type: ignore[arg-type]
    assert period_state(s, _day("2026-11-25"), [_stored("done")] * 3) == "done"  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "spec", "last"), [
    ("every", "day", 91), ("every", "minute", 180), ("every", "1m", 180), ("every", "year", 10),
    ("every", "month", 24), ("every", "15m", 24), ("every", "2h", 84), ("every", "6h", 28),
    ("every", "60m", 168), ("every", "24h", 7), ("cron", "0 6 * * *", 60),
])
def test_default_last(kind: str, spec: str, last: int) -> None:
    # By the schedule's unit, as the period engine gives it (a spec is not parsed again).
    s = day_job()
    s.kind, s.schedule = kind, spec
    s.sched = schedule(spec if kind == "every" else None, spec if kind == "cron" else None, "UTC")
    assert default_last(s) == last


def _attempt(status: str, attempt: int = 1, outcome: str | None = None,
             output_end: str | None = None) -> SimpleNamespace:
    started = datetime(2026, 11, 30, 23, 30)  # naive UTC, as SQLite and MySQL hand it back
    return SimpleNamespace(job="nightly", period="2026-11-30", attempt=attempt, fence=attempt,
                           owner="vm:42", status=status, outcome=outcome,
                           started_at=started,
                           finished_at=None if status == "running" else
                           started + timedelta(seconds=83.3333),
                           exit_code=None if status == "running" else 3, reason=None,
                           output_end=output_end)


def test_a_finished_attempts_entry_in_the_jobs_zone() -> None:
    e = attempt_entry(_attempt("failed", outcome="failed", output_end="a\nboom\n"), None,
                      NOW, ZoneInfo("Europe/Paris"))
    assert e["started_at"] == "2026-12-01T00:30:00+01:00"
    assert e["finished_at"] == "2026-12-01T00:31:23+01:00"
    assert e["duration_s"] == 83.333 and e["outcome"] == "failed"
    assert e["last_line"] == "boom" and e["exit_code"] == 3
    done = attempt_entry(_attempt("done", outcome="exited", output_end="ok"), None, NOW, UTC)
    assert done["last_line"] is None  # only a failed attempt's is shown


def test_a_running_attempt_is_live_stale_or_taken_over_by_its_row() -> None:
    holder = row("2026-11-30", "running", attempt=2, beat_ago=100)
    mine = _attempt("running", attempt=2, outcome="running")
    assert attempt_entry(mine, holder, NOW, UTC)["outcome"] == "running"
    assert attempt_entry(mine, holder, NOW + timedelta(seconds=201), UTC)["outcome"] == "stale"
    assert attempt_entry(_attempt("running", attempt=1, outcome="running"), holder, NOW,
                         UTC)["outcome"] == "taken-over"
    assert attempt_entry(mine, None, NOW, UTC)["outcome"] == "taken-over"  # row pruned
    done_row = row("2026-11-30", "done", attempt=2, took=5)
    assert attempt_entry(mine, done_row, NOW, UTC)["outcome"] == "taken-over"

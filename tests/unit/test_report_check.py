"""once.report.check: `once check`'s findings from JobStates built by hand (no database)."""

from __future__ import annotations

from report_states import day_job, row

from once.report import CRITICAL, UNKNOWN, WARNING, Finding, findings


def _lines(found: list[Finding]) -> list[str]:
    return [f.line for f in sorted(found, key=lambda f: f.order)]


def _unit(key: str) -> tuple[object, str]:
    return row(key, "x").period_start, key


def test_a_healthy_job_has_no_finding() -> None:
    s = day_job()
    s.last_done = row("2026-11-30", "done", took=3)
    s.open_rows = [row("2026-12-01", "running")]  # today's, live
    assert findings([s]) == []


def test_missing_periods_are_listed_then_summed_up_in_a_range() -> None:
    s = day_job(first="2026-11-01")
    days = [f"2026-11-{d:02}" for d in range(1, 13)]  # twelve days without a row
    s.no_row, s.no_row_listed, s.no_row_last = 12, [_unit(k) for k in days[:11]], _unit(days[-1])
    lines = _lines(findings([s]))
    assert lines[:10] == [f"CRITICAL nightly {k} missing" for k in days[:10]]
    assert lines[10:] == ["CRITICAL nightly 2026-11-11..2026-11-12 missing (2 more periods)"]
    summary = sorted(findings([s]), key=lambda f: f.order)[-1].as_dict()
    assert summary["count"] == 2 and summary["first"] == "2026-11-11"
    assert summary["severity"] == "CRITICAL" and summary["status"] == CRITICAL


def test_a_lower_bound_and_shards_are_said_in_the_range_line() -> None:
    s = day_job(first="2026-11-01", shards=4)
    keys = [f"2026-11-0{d}#{i}" for d in (1, 2, 3) for i in range(4)]
    s.no_row, s.no_row_at_least = 100_000, True
    s.no_row_listed, s.no_row_last = [_unit(k) for k in keys[:11]], _unit("2026-11-30#3")
    assert _lines(findings([s]))[-1] == (
        "CRITICAL nightly 2026-11-03#2..2026-11-30#3 missing (at least 99990 more shards)")


def test_failed_rows_count_when_due_or_out_of_attempts() -> None:
    s = day_job()
    s.open_rows = [row("2026-11-29", "failed", attempt=3, exit_code=4),
                   row("2026-11-30", "failed", attempt=1, exit_code=1),
                   row("2026-12-01", "failed", attempt=1, exit_code=2),  # not due yet
                   row("2026-12-01#x", "failed", attempt=3, exit_code=5)]  # not due, but out
    assert _lines(findings([s])) == [
        "CRITICAL nightly 2026-11-29 failed-out (attempt 3 of 3, exit 4, no attempts left)",
        "CRITICAL nightly 2026-11-30 failed (attempt 1 of 3, exit 1)",
        "CRITICAL nightly 2026-12-01#x failed-out (attempt 3 of 3, exit 5, no attempts left)",
    ]


def test_interrupted_attempts_are_not_counted_against_max_attempts() -> None:
    s = day_job()  # --max-attempts 3: at most 9 attempts in all
    s.open_rows = [row("2026-11-28", "failed", attempt=3, exit_code=1, interrupted=2),
                   row("2026-11-29", "failed", attempt=9, exit_code=143, interrupted=8)]
    assert _lines(findings([s])) == [
        "CRITICAL nightly 2026-11-28 failed (attempt 3 of 3, 2 interrupted, exit 1)",
        "CRITICAL nightly 2026-11-29 failed-out (attempt 9 of 3, 8 interrupted, exit 143, "
        "no attempts left)",
    ]


def test_stale_attempts_warn_before_they_are_due() -> None:
    s = day_job()
    s.open_rows = [row("2026-11-30", "running", attempt=2, beat_ago=600, owner="db1:7"),
                   row("2026-12-01", "running", beat_ago=3 * 3600 + 60, stale_after=3600),
                   row("2026-12-01#1", "running", beat_ago=299)]  # fresh: no finding
    found = sorted(findings([s]), key=lambda f: f.order)
    assert [f.severity for f in found] == [CRITICAL, WARNING]
    assert _lines(found) == [
        "CRITICAL nightly 2026-11-30 stale (owner db1:7, attempt 2, heartbeat 10m ago, "
        "stale after 5m)",
        "WARNING nightly 2026-12-01 stale (owner vm:42, attempt 1, heartbeat 3h 1m ago, "
        "stale after 1h)",
    ]
    assert found[0].as_dict()["heartbeat_age_s"] == 600.0 and found[1].extra["due"] is False


def test_more_than_ten_failures_end_in_one_range_line() -> None:
    s = day_job(first="2026-11-01")
    s.open_rows = [row(f"2026-11-{d:02}", "failed", exit_code=1) for d in range(1, 14)]
    lines = _lines(findings([s]))
    assert len(lines) == 11
    assert lines[-1] == "CRITICAL nightly 2026-11-11..2026-11-13 failed (3 more periods)"


def test_an_unreadable_schedule_is_one_critical_finding() -> None:
    s = day_job()
    s.sched, s.error = None, "unknown time zone 'Mars/Olympus'"
    s.no_row = 5  # never looked at: the schedule cannot say what is due
    assert _lines(findings([s])) == [
        "CRITICAL nightly - unreadable (unknown time zone 'Mars/Olympus')"]


def test_a_finding_is_one_line_of_three_fields_whatever_the_ledger_holds() -> None:
    f = Finding(CRITICAL, "bad job\nname", "2026 11\t30", "missing", "owner x\ry")
    assert f.line == "CRITICAL bad\\u0020job\\nname 2026\\u002011\\t30 missing (owner x\\ry)"
    assert Finding(UNKNOWN, "", "-", "empty").line == "UNKNOWN - - empty"
    assert Finding(UNKNOWN, "", "-", "empty").as_dict()["job"] is None


def test_findings_sort_most_severe_first_then_by_job_and_period() -> None:
    late, early = day_job("b"), day_job("a")
    late.open_rows = [row("2026-11-30", "failed", job="b", exit_code=1)]
    early.open_rows = [row("2026-12-01", "running", job="a", beat_ago=900),
                       row("2026-11-30", "running", job="a", beat_ago=900),
                       row("2026-11-29", "failed", job="a", exit_code=1)]
    assert [(f.job, f.period, f.problem) for f in
            sorted(findings([late, early]), key=lambda f: f.order)] == [
        ("a", "2026-11-29", "failed"), ("a", "2026-11-30", "stale"),
        ("b", "2026-11-30", "failed"), ("a", "2026-12-01", "stale")]


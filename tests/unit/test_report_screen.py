"""once.report's human screens, without a terminal or a database: `once check`'s findings
broken to a terminal's width (between phrases, details indented under their head), a lagging
job's NEXT on a narrow terminal, and the job page's timeline rows (a daily job's month one
row, issue 36)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from report_states import NOW, day_job

from once.report import status_cells
from once.report.check import CRITICAL, UNKNOWN, Finding
from once.report.screen import INDENT, finding_lines
from once.report.timeline import grid
from once.schedules import schedule

FAILED_OUT = Finding(CRITICAL, "weekly-report", "2026-W48", "failed-out",
                     "attempt 2 of 2, exit 1, no attempts left").line
EMPTY = Finding(UNKNOWN, "", "-", "empty",
                "no job has run in the ledger sqlite:////srv/a-rather-long-directory/of-the-"
                "billing-team/ledgers/once-ledger.db; is it the one the jobs use? see --db "
                "and ONCE_DATABASE_URL").line


@pytest.mark.parametrize("width", [40, 60, 80, 120, 300])
@pytest.mark.parametrize("line", [FAILED_OUT, EMPTY, "CRITICAL nightly 2026-12-01 missing"])
def test_a_finding_fits_the_terminal_and_says_all_it_said(line: str, width: int) -> None:
    lines = finding_lines([line], width)
    assert all(len(text) <= width for text in lines), lines
    assert not lines[0].startswith(" ") and all(t.startswith(INDENT) for t in lines[1:])
    # Nothing lost or added: the lines are the finding's words, in order.
    assert " ".join(t.strip() for t in lines).replace("/ ", "/") == line
    head = line.partition(" (")[0]
    if len(line) <= width:
        assert lines == [line]  # as a pipe gets it
    elif len(head) <= width:  # the head (severity, job, period, problem) on a line alone
        assert lines[0] == head


def test_details_break_between_phrases_and_a_url_after_a_slash() -> None:
    assert finding_lines([FAILED_OUT], 50) == [
        "CRITICAL weekly-report 2026-W48 failed-out",
        "    (attempt 2 of 2, exit 1, no attempts left)"]
    assert finding_lines([FAILED_OUT], 40) == [
        "CRITICAL weekly-report 2026-W48",
        "    failed-out",
        "    (attempt 2 of 2, exit 1,",
        "    no attempts left)"]
    lines = finding_lines([EMPTY], 60)
    assert lines == ["UNKNOWN - - empty", "    (no job has run in the ledger",
                     "    sqlite:////srv/a-rather-long-directory/",  # after a /
                     "    of-the-billing-team/ledgers/once-ledger.db;",
                     "    is it the one the jobs use?", "    see --db and ONCE_DATABASE_URL)"]
    assert finding_lines([EMPTY], 80)[-1] == (  # phrases share a line where they fit
        "    once-ledger.db; is it the one the jobs use? see --db and ONCE_DATABASE_URL)")


def test_a_secret_split_by_a_break_is_still_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import once.report.screen as screen

    monkeypatch.setattr(screen, "scrub", lambda text: text.replace("hunter2", "***"))
    line = Finding(UNKNOWN, "", "-", "standby", "the ledger postgresql://app:hunter2@db/ops "
                   "is a standby").line
    assert "hunter2" not in "".join(finding_lines([line], 30))


def test_a_lagging_jobs_next_is_a_period_due_later_not_a_clock_time() -> None:
    s = day_job()
    s.lag = 1
    compact = status_cells(s, NOW, compact=True)[-1][0]
    assert compact == "period 12-02 due in 12h", compact
    assert status_cells(s, NOW)[-1][0] == "2026-12-02 in 12h"  # a pipe's, whole, as ever
    assert status_cells(day_job(), NOW, compact=True)[-1][0] == "12-02 in 12h"


def _cells(spec: str, first: datetime, count: int) -> list[tuple[object, str]]:
    sched = schedule(spec, None, "UTC")
    period = sched.containing(first)
    out = []
    for _ in range(count):
        out.append((period, "done"))
        period = sched.next(period)
    return out


def test_the_pages_timeline_is_a_row_a_month_for_a_daily_job() -> None:
    three = _cells("day", datetime(2026, 12, 4, tzinfo=UTC), 3)
    drawn = grid(schedule("day", None, "UTC"), three)  # type: ignore[arg-type]
    assert drawn.slots == 31 and [label for label, _ in drawn.rows] == ["2026-12"]
    slots = drawn.rows[0][1]
    assert [i for i, slot in enumerate(slots) if slot] == [3, 4, 5]
    forty = _cells("day", datetime(2026, 10, 28, tzinfo=UTC), 40)
    assert [label for label, _ in grid(schedule("day", None, "UTC"),
                                       forty).rows] == ["2026-10", "2026-11", "2026-12"]


def test_the_pages_timeline_rows_of_hours_minutes_and_strips() -> None:
    start = datetime(2026, 12, 4, 22, tzinfo=UTC)
    hourly = grid(schedule("hour", None, "UTC"), _cells("hour", start, 5))
    assert hourly.slots == 24 and [label for label, _ in hourly.rows] == [
        "2026-12-04", "2026-12-05"]
    assert hourly.marks == [(h, f"{h:02d}") for h in range(0, 24, 3)]
    quarter = grid(schedule("15m", None, "UTC"), _cells("15m", start, 6))
    assert quarter.slots == 4 and quarter.marks == [(0, "00"), (1, "15"), (2, "30"),
                                                    (3, "45")]
    weekly = grid(schedule("week", None, "UTC"), _cells("week", start, 60))
    assert [len(slots) for _, slots in weekly.rows] == [52, 52] and weekly.marks == []
    assert [sum(1 for slot in slots if slot) for _, slots in weekly.rows] == [52, 8]
    assert grid(schedule("week", None, "UTC"), []).rows == []


@pytest.mark.parametrize(("zoned", "header"), [(False, "SINCE"), (True, "FROM (UTC)")])
def test_a_short_header_keeps_its_zone_only_where_its_short_cells_are_in_it(
        zoned: bool, header: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A history's short times are still in its zone (STARTED (Europe/Berlin)); a lead's
    SINCE, short, is an age, and loses its (UTC)."""
    from once.report.screen import print_fitted

    monkeypatch.setenv("COLUMNS", "40")
    name = header.split(" (")[0]
    whole = [[("celery-beat-of-the-billing-team", ""), ("2026-12-06 02:06:00", "")]]
    short = [[("celery-beat-of-the-billing-team", ""), ("5m ago" if not zoned else "02:06", "")]]
    fit = print_fitted(["LEAD", f"{name} (UTC)"], whole, short, (), zoned=zoned)
    lines = capsys.readouterr().out.splitlines()
    assert fit.hidden == [] and lines[0].split(None, 1)[1].strip() == header, lines

"""What a catch-up says of each period and in its summary (once.run.backfill.Progress)."""

from __future__ import annotations

from once.periods import every
from once.run.backfill import Progress
from once.run.flow import Result


def _progress(*results: Result) -> Progress:
    progress = Progress(quiet=True)
    progress.start("nightly", 3)
    for result in results:
        progress.count(result, 0.5)
    return progress


def test_each_result_has_its_words() -> None:
    period = every("day", "UTC").from_key("2026-11-05")
    progress = _progress()
    assert progress.line(period, Result("done", 0), 0.5) == (
        "nightly 2026-11-05: done (exit 0, 0.5s)")
    assert progress.line(period, Result("skipped-held", 0), 0) == (
        "nightly 2026-11-05: held by a live owner")
    # A refused claim is no outage: the `once:` line before it names the cause.
    assert progress.line(period, Result("unreachable", 75), 0) == (
        "nightly 2026-11-05: ledger error (exit 75, 0.0s)")


def test_the_summary_counts_each_verb() -> None:
    assert _progress(Result("done", 0), Result("unreachable", 75)).summary().startswith(
        "catch-up of nightly: 2 of 3 periods in ")
    assert _progress(Result("done", 0), Result("unreachable", 75)).summary().endswith(
        ": 1 done, 1 ledger error; 1 not tried")
    assert _progress(*[Result("done", 0)] * 3).summary().startswith(
        "caught up 3 periods of nightly in ")


def test_the_summary_names_the_periods_a_live_owner_held() -> None:
    """Never "caught up" past a period left to its owner: it is named (issue 34, row 14)."""
    day = every("day", "UTC")
    progress = Progress(quiet=True)
    progress.start("nightly", 5)
    for key in ("2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"):
        progress.count(Result("done", 0), 0.5, day.from_key(key))
    progress.count(Result("skipped-held", 0), 0.0, day.from_key("2026-11-05"))
    summary = progress.summary()
    assert summary.startswith("catch-up of nightly: 5 of 5 periods in "), summary
    assert summary.endswith(": 4 done; 1 held by a live owner: 2026-11-05"), summary
    for n in range(6, 13):
        progress.count(Result("skipped-held", 0), 0.0, day.from_key(f"2026-11-{n:02d}"))
    assert progress.summary().endswith(
        "; 8 held by a live owner: 2026-11-05, 2026-11-06, 2026-11-07, 2026-11-08, "
        "2026-11-09, ..."), progress.summary()


def test_a_stopped_catchup_says_so_and_what_it_left() -> None:
    """Issue 34, row 9: after a stop signal no period starts; the rest is the next fire's."""
    progress = _progress(Result("done", 0), Result("failed", 143, interrupted=True))
    progress.stopped_by = "SIGTERM"
    summary = progress.summary()
    assert summary.startswith("catch-up of nightly: stopped by SIGTERM: 2 of 3 periods in ")
    assert summary.endswith(": 1 done, 1 failed; 1 left for the next fire"), summary
    every_one = _progress(*[Result("done", 0)] * 3)
    every_one.stopped_by = "SIGINT"  # during the last one's final write: never "caught up"
    assert every_one.summary().startswith("catch-up of nightly: stopped by SIGINT: 3 of 3 ")

"""once.report.metrics: the text exposition format, from JobStates and counts built by hand."""

from __future__ import annotations

from report_states import day_job, row

from once.report import AttemptCounts, exposition
from once.report.metrics import METRICS


def _samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_no_job_gives_help_and_type_of_every_metric_and_nothing_else() -> None:
    text = exposition([], {})
    assert text.endswith("\n") and _samples(text) == []
    assert text.splitlines()[:2] == [
        "# HELP once_job_info The schedule each job last ran with (always 1).",
        "# TYPE once_job_info gauge"]
    assert len(text.splitlines()) == 2 * len(METRICS)


def test_a_jobs_samples() -> None:
    s = day_job(fires=9)
    s.last_done = row("2026-11-30", "done", took=12.25)
    s.open_rows = [row("2026-11-27", "failed", attempt=3, exit_code=143, interrupted=2),
                   row("2026-11-29", "failed", attempt=3, exit_code=1),
                   row("2026-11-28", "running", beat_ago=900),
                   row("2026-12-01", "running")]
    s.no_row = 2
    counts = {"nightly": AttemptCounts({"done": 4, "failed": 2, "running": 1}, later=2,
                                       reruns=1, interrupted=2)}
    job = 'once_job="nightly"'
    assert _samples(exposition([s], counts)) == [
        f'once_job_info{{{job},kind="every",schedule="day",tz="UTC"}} 1',
        f"once_last_success_timestamp_seconds{{{job}}} "
        f"{s.last_done.finished_at.timestamp():.2f}",
        f"once_last_duration_seconds{{{job}}} 12.25",
        f'once_runs_total{{{job},status="done"}} 4',
        f'once_runs_total{{{job},status="failed"}} 2',
        f'once_runs_total{{{job},status="running"}} 1',
        f"once_fires_total{{{job}}} 9",
        f"once_skips_total{{{job}}} 2",  # 9 claims, 7 attempts
        f"once_takeovers_total{{{job}}} 2",
        f"once_reruns_total{{{job}}} 1",
        f"once_interrupted_total{{{job}}} 2",
        f"once_missing_periods{{{job}}} 3",  # two without a row, one stale and due
        f"once_failed_periods{{{job}}} 2",
        f"once_failed_out_periods{{{job}}} 1",  # two of 11-27's three attempts interrupted
        f"once_running_attempts{{{job}}} 1",
        f"once_stale_attempts{{{job}}} 1",
        f"once_overrun_attempts{{{job}}} 0",  # the live one's period is not due
        f"once_oldest_running_seconds{{{job}}} 215940",  # the stale one, since 11-29 00:01
    ]


def test_samples_are_grouped_by_metric_and_skips_never_go_below_zero() -> None:
    a, b = day_job("a", fires=1), day_job("b", fires=0)
    text = exposition([a, b], {"a": AttemptCounts({"done": 3})})
    fires = [line for line in _samples(text) if line.startswith("once_fires_total")]
    assert fires == ['once_fires_total{once_job="a"} 1', 'once_fires_total{once_job="b"} 0']
    assert 'once_skips_total{once_job="a"} 0' in text  # 1 claim, 3 attempts: not -2
    assert "once_last_success_timestamp_seconds{" not in text  # neither has a done row
    assert text.index("# HELP once_fires_total") < text.index(fires[0]) < text.index(
        "# HELP once_skips_total")


def test_label_values_are_escaped() -> None:
    s = day_job('we"ird\\job\nname')
    line = _samples(exposition([s], {}))[0]
    assert line.startswith('once_job_info{once_job="we\\"ird\\\\job\\nname",')

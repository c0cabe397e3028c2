"""A hung run is loud: a live attempt that still holds a due period is an overrun finding
(once check), a state in status and its JSON, and a metric (pure: no database)."""

from __future__ import annotations

from report_states import day_job, row

from once.report.check import CRITICAL, findings
from once.report.metrics import exposition
from once.report.render import status_objects

RUNNING_S = 11 * 3600 + 59 * 60  # row() starts a run a minute after its period's end


def test_a_live_attempt_past_its_period_is_an_overrun() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-30", "running", job="billing")]
    [finding] = findings([s])
    assert (finding.severity, finding.problem) == (CRITICAL, "overrun")
    assert finding.line == ("CRITICAL billing 2026-11-30 overrun (owner vm:42, attempt 1, "
                            "running 11h 59m)")
    assert finding.as_dict()["running_s"] == RUNNING_S


def test_a_stale_attempt_is_stale_not_overrun() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-30", "running", job="billing", beat_ago=3600)]
    assert [f.problem for f in findings([s])] == ["stale"]


def test_a_live_attempt_of_a_period_not_yet_due_is_fine() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-12-01", "running", job="billing")]
    assert findings([s]) == []


def test_status_json_and_metrics_show_the_overrun() -> None:
    s = day_job("billing")
    s.open_rows = [row("2026-11-30", "running", job="billing")]
    [running] = status_objects([s])[0]["running"]
    assert running["overrun"] is True and running["running_s"] == RUNNING_S
    text = exposition([s], {})
    assert 'once_overrun_attempts{once_job="billing"} 1' in text
    assert f'once_oldest_running_seconds{{once_job="billing"}} {RUNNING_S}' in text

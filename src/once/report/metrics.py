"""`once metrics`' text: the Prometheus text exposition format of the jobs' states and
attempt counts, and of the lead names (`once lead`: once.report.leads) (pure: no database, no
output).
"""

from __future__ import annotations

from collections.abc import Sequence

from once.report.leads import LeadFigures
from once.report.model import AttemptCounts, JobState

METRICS = [
    ("once_job_info", "gauge", "The schedule each job last ran with (always 1)."),
    ("once_last_success_timestamp_seconds", "gauge",
     "When the run of the job's latest done period finished, in Unix time."),
    ("once_last_duration_seconds", "gauge",
     "How long the run of the job's latest done period took."),
    ("once_runs_total", "counter",
     "Attempts by status: done, failed, or running (still running, or never finished: "
     "taken over or abandoned)."),
    ("once_fires_total", "counter", "Claims made: every once run, catch-up and rerun call."),
    ("once_skips_total", "counter",
     "Claims that ran nothing: the period was done, held or failed out (fires - attempts)."),
    ("once_takeovers_total", "counter",
     "Attempts after the first that were not reruns: retries of a failed attempt and "
     "takeovers of a stale one."),
    ("once_reruns_total", "counter", "Attempts started by once rerun."),
    ("once_interrupted_total", "counter",
     "Attempts ended by a SIGTERM, SIGINT or SIGHUP that once forwarded (counted in "
     "once_runs_total as failed, not against --max-attempts)."),
    ("once_missing_periods", "gauge",
     "Due periods with no done row, no failed row and no live attempt."),
    ("once_failed_periods", "gauge", "Periods whose row is failed."),
    ("once_failed_out_periods", "gauge", "Failed periods with no attempts left."),
    ("once_running_attempts", "gauge", "Running attempts with a fresh heartbeat."),
    ("once_stale_attempts", "gauge", "Running attempts whose heartbeat is stale."),
    ("once_overrun_attempts", "gauge",
     "Live attempts of a due period that have run longer than the period lasts: hung runs."),
    ("once_oldest_running_seconds", "gauge",
     "How long the job's oldest running attempt has run (0 when none runs)."),
    ("once_lead_term", "gauge",
     "The lead name's latest term (its fencing token): held now, or the last one held."),
    ("once_lead_changes_total", "counter",
     "Terms begun: each time a candidate took the lease, the first time included (the terms "
     "in the ledger: a once prune that forgets old ones lowers it, as a counter's reset)."),
    ("once_lead_leaderless_seconds", "gauge",
     "How long the name has been without a leader now, since the last holder's lease ran "
     "out or was released (0 while one holds it)."),
    ("once_lead_leaderless_time_seconds_total", "counter",
     "Seconds the name has been without a leader since its first term began, by its terms "
     "in the ledger (and now; a once prune that forgets old ones lowers it, as a counter's "
     "reset)."),
    ("once_lead_lease_seconds", "gauge", "The --lease of its latest term."),
    ("once_lead_candidates", "gauge",
     "Candidates waiting for the lease (seen within three of their intervals)."),
]

# Each metric's labels, as _job_samples gives them: `once_job` (not `job`, which Prometheus
# keeps for the scrape job), and more where named here (docs/reference/metrics.md; the test
# suite reads a real exposition against it). A lead name's (once_lead_...) are labelled `lead`.
LABELS: dict[str, tuple[str, ...]] = {
    "once_job_info": ("once_job", "kind", "schedule", "tz"),
    "once_runs_total": ("once_job", "status"),
    **{name: ("lead",) for name, _, _ in METRICS if name.startswith("once_lead_")}}
JOB_LABEL = ("once_job",)

Sample = tuple[str, float]  # (labels as the exposition writes them, between braces; value)


def exposition(states: Sequence[JobState], counts: dict[str, AttemptCounts],
               leads: Sequence[LeadFigures] = ()) -> str:
    """The text exposition format: HELP and TYPE once per metric, then its samples."""
    samples: dict[str, list[str]] = {m[0]: [] for m in METRICS}
    for s in states:
        for name, (labels, value) in _job_samples(s, counts.get(s.name, AttemptCounts())):
            samples[name].append(f"{name}{{{labels}}} {_number(value)}")
    for figures in leads:
        for name, (labels, value) in _lead_samples(figures):
            samples[name].append(f"{name}{{{labels}}} {_number(value)}")
    lines = []
    for name, kind, help_text in METRICS:
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        lines += samples[name]
    return "\n".join(lines) + "\n"


def _job_samples(s: JobState, c: AttemptCounts) -> list[tuple[str, Sample]]:
    """A job's samples, by metric name, in the order the exposition lists them (the job's
    label written once: 10,000 jobs have 180,000 samples)."""
    job = _labels(once_job=s.name)
    out: list[tuple[str, Sample]] = [
        ("once_job_info", (_labels(once_job=s.name, kind=s.kind, schedule=s.spec, tz=s.tz), 1))]
    last = s.last_done
    if last is not None and last.finished_at is not None:
        out.append(("once_last_success_timestamp_seconds",
                    (job, last.finished_at.timestamp())))
        out.append(("once_last_duration_seconds", (job, last.duration or 0.0)))
    for state in ("done", "failed", "running"):
        out.append(("once_runs_total", (f'{job},status="{state}"', c.by_status.get(state, 0))))
    running = s.running
    stale = sum(1 for r in running if s.is_stale(r))
    out += [("once_fires_total", (job, s.fires)),
            ("once_skips_total", (job, max(0, s.fires - c.total))),
            ("once_takeovers_total", (job, c.later)),
            ("once_reruns_total", (job, c.reruns)),
            ("once_interrupted_total", (job, c.interrupted)),
            ("once_missing_periods", (job, s.missing)),
            ("once_failed_periods", (job, len(s.failed))),
            ("once_failed_out_periods", (job, sum(1 for r in s.failed if s.failed_out(r)))),
            ("once_running_attempts", (job, len(running) - stale)),
            ("once_stale_attempts", (job, stale)),
            ("once_overrun_attempts", (job, len(s.overrunning))),
            ("once_oldest_running_seconds",
             (job, round(max((s.running_for(r) for r in running), default=0.0), 3)))]
    return out


def _lead_samples(f: LeadFigures) -> list[tuple[str, Sample]]:
    """A lead name's samples, by metric name."""
    lead = _labels(lead=f.lead.name)
    return [("once_lead_term", (lead, f.lead.term)),
            ("once_lead_changes_total", (lead, f.changes)),
            ("once_lead_leaderless_seconds", (lead, round(f.lead.leaderless_for, 3))),
            ("once_lead_leaderless_time_seconds_total", (lead, round(f.leaderless_total, 3))),
            ("once_lead_lease_seconds", (lead, f.lead.lease_seconds)),
            ("once_lead_candidates", (lead, f.lead.candidates))]


def _labels(**labels: str) -> str:
    """Labels as a sample writes them between its braces, their values escaped."""
    return ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))

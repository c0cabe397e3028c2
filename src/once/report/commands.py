"""The report commands: `once status`, `once check`, `once history` and `once metrics`, each
one snapshot of the ledger (once.report.snapshot) read, judged and printed."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from once.escape import shown
from once.ledger import Target
from once.ledger.reads import Snapshot
from once.periods import Period
from once.report.attempts import attempt_counts, attempt_entries
from once.report.check import CRITICAL, OK, UNKNOWN, Finding, findings
from once.report.metrics import exposition
from once.report.model import JobState
from once.report.render import (
    render_history,
    render_status,
    say,
    status_objects,
    tty,
    write_line,
)
from once.report.snapshot import NoLedger, reading, surveying
from once.report.survey import survey_jobs, timeline_cells

if TYPE_CHECKING:
    from sqlalchemy import Connection

Drawings = dict[str, list[tuple[Period, str]]]  # each job's timeline: (period, state)


def _stored(jobs_named: Sequence[str], namespace: str | None) -> list[str]:
    return [f"{namespace}:{j}" if namespace else j for j in jobs_named]


def _load(target: Target, names: Sequence[str] | None, namespace: str | None,
          grace: float = 0.0, timeline: bool = False,
          last: int | None = None) -> tuple[list[JobState], datetime, Drawings]:
    """The jobs at the database's now and, with timeline, their timelines: one snapshot."""
    try:
        with surveying(target) as snap:
            states, now = survey_jobs(snap, names, namespace, grace)
            drawings = ({s.name: timeline_cells(snap, s, last) for s in states}
                        if timeline else {})
            return states, now, drawings
    except NoLedger:
        return [], datetime.now(UTC), {}


def status(target: Target, jobs_named: Sequence[str], namespace: str | None,
           as_json: bool, timeline: bool = False, last: int | None = None) -> int:
    """`once status`: one row per job; --timeline draws each job's recent periods."""
    names = _stored(jobs_named, namespace)
    states, now, drawings = _load(target, names or None, namespace, timeline=timeline,
                                  last=last)
    unknown = sorted(set(names) - {s.name for s in states})
    if as_json:
        write_line(json.dumps(status_objects(states, drawings if timeline else None,
                                             target.redacted), indent=2))
    elif timeline:
        from once.report import timeline as draw

        draw.render([(s, drawings.get(s.name, [])) for s in states], tty())
    elif states:
        render_status(states, now, target)
    elif not unknown:
        say(f"no jobs in the ledger {target.redacted}"
            + (f" under namespace {namespace}" if namespace else ""))
    for name in unknown:
        say(f"unknown job {name!r}: no run of it in the ledger {target.redacted}")
    return 2 if unknown else 0


def check(target: Target, jobs_named: Sequence[str], namespace: str | None, grace: float,
          as_json: bool) -> int:
    """`once check`: the findings, one a line; exit 0, 1 (WARNING), 2 (CRITICAL) or 3
    (UNKNOWN: no job in the ledger, which is more often the wrong ledger than a quiet one)."""
    names = _stored(jobs_named, namespace)
    states, _, _ = _load(target, names or None, namespace, grace)
    found = findings(states)
    for name in sorted(set(names) - {s.name for s in states}):
        found.append(Finding(CRITICAL, name, "-", "unknown", "no run of this job in the ledger"))
    if not states and not names:
        where = f"namespace {namespace} in " if namespace else ""
        found.append(Finding(UNKNOWN, "", "-", "empty",
                             f"no job has run in {where}the ledger {target.redacted}; is it "
                             f"the one the jobs use? see --db and ONCE_DATABASE_URL"))
    found.sort(key=lambda f: f.order)
    worst = max((f.severity for f in found), default=OK)
    if as_json:
        write_line(json.dumps([{**f.as_dict(), "ledger": target.redacted} for f in found],
                              indent=2))
    elif found:
        for f in found:
            write_line(f.line)
    else:
        count = len(states)
        write_line(f"OK {count} job{'' if count == 1 else 's'}: every due period done "
                   f"(ledger {shown(target.redacted)})")
    return worst


def history(target: Target, stored_job: str, limit: int, as_json: bool,
            period: str | None = None) -> int:
    """`once history JOB`: every attempt, newest first."""
    try:
        with reading(target) as conn:
            found = attempt_entries(conn, target, stored_job, limit, period)
            if found is None:
                raise NoLedger
            tz, entries = found
    except NoLedger:
        say(f"unknown job {stored_job!r}: no run of it in the ledger {target.redacted}")
        return 2
    if as_json:
        write_line(json.dumps(entries, indent=2))
    else:
        render_history(stored_job, tz, entries)
    return 0


def metrics(target: Target, namespace: str | None) -> int:
    """`once metrics`: Prometheus text exposition format, for the textfile collector."""
    try:
        with reading(target) as conn:
            states, _ = survey_jobs(Snapshot.over(conn, target), None, namespace)
            text = metrics_text(conn, states)
    except NoLedger:
        text = exposition([], {})
    sys.stdout.write(text)
    return 0


def metrics_text(conn: Connection, states: Sequence[JobState]) -> str:
    """What `once metrics` prints for these jobs (their attempts are counted on conn)."""
    return exposition(states, attempt_counts(conn, [s.name for s in states]))

"""The report commands: `once status`, `once check`, `once history` (of a job or of the
fleet) and `once metrics`, each
one snapshot of the ledger (once.report.snapshot) read, judged and printed."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from once.escape import shown
from once.ledger import LedgerError, Target, describe, errors
from once.ledger.fleet import Snapshot, Standby
from once.ledger.leases import Lead, TermRow
from once.messages import say
from once.periods import Period
from once.report.attempts import attempt_counts, attempt_entries, fleet_entries
from once.report.check import CRITICAL, OK, UNKNOWN, Finding, findings, not_ready
from once.report.leads import (
    lead_findings,
    lead_objects,
    lead_table,
    read_figures,
    read_leads,
    read_terms,
    render_terms,
    term_entries,
)
from once.report.metrics import exposition
from once.report.model import JobState
from once.report.render import (
    indented_json,
    render_fleet_history,
    render_history,
    render_status,
    status_objects,
    tty,
    write_line,
)
from once.report.snapshot import NoLedger, reading, surveying
from once.report.survey import read_last_done, survey_jobs, timelines
from once.secrets import scrub

Drawings = dict[str, list[tuple[Period, str]]]  # each job's timeline: (period, state)


def _stored(jobs_named: Sequence[str], namespace: str | None) -> list[str]:
    return [f"{namespace}:{j}" if namespace else j for j in jobs_named]


class Loaded(NamedTuple):
    states: list[JobState]
    now: datetime
    drawings: Drawings
    standby: Standby | None  # the ledger read is a standby's copy


def _load(target: Target, names: Sequence[str] | None, namespace: str | None,
          grace: float = 0.0, timeline: bool = False, last: int | None = None,
          leads: list[Lead] | None = None) -> Loaded:
    """The jobs at the database's now and, with timeline, their timelines: one snapshot;
    given a list, the lead names (those named, else of the namespace) added to it."""
    try:
        with surveying(target) as snap:
            standby = snap.standby()
            states, now = survey_jobs(snap, names, namespace, grace)
            drawings = timelines(snap, states, last) if timeline else {}
            if leads is not None:  # last: it may end the snapshot (once.report.leads)
                leads += read_leads(snap, names, namespace)
            return Loaded(states, now, drawings, standby)
    except NoLedger:
        return Loaded([], datetime.now(UTC), {}, None)


# A standby of a busy primary is always some milliseconds behind (the lag is timed by the
# commits it replayed): `once check` calls it lagging past --grace, and never under a second.
LAG_FLOOR = 1.0


def standby_words(standby: Standby | None) -> str:
    """How a report names a standby's copy: ' (a standby, 2.5s behind its primary)'."""
    if standby is None:
        return ""
    behind = "how far behind" if standby.lag is None else f"{standby.lag:.1f}s behind"
    return f" (a standby, {behind} its primary)"


def _lagging(standby: Standby | None, grace: float, target: Target) -> Finding | None:
    """check's UNKNOWN for a standby too far behind to judge by
    (docs/how-to/high-availability.md)."""
    bound = max(grace, LAG_FLOOR)
    if standby is None or (standby.lag is not None and standby.lag <= bound):
        return None
    lag = "an unknown time" if standby.lag is None else f"{standby.lag:.1f}s"
    return Finding(UNKNOWN, "", "-", "standby",
                   f"the ledger {target.redacted} is a standby {lag} behind its primary, more "
                   f"than --grace allows ({bound:g}s): what the primary holds since is not "
                   f"seen; read the primary",
                   {"replay_lag_s": standby.lag})


def status(target: Target, jobs_named: Sequence[str], namespace: str | None,
           as_json: bool, timeline: bool = False, last: int | None = None,
           wide: bool = False, leads_only: bool = False) -> int:
    """`once status`: one row per job, and the lead names' table under it; --timeline draws
    each job's recent periods; leads_only: the lead names alone (their array with
    as_json). A name given is known as a job or as a lead name."""
    names = _stored(jobs_named, namespace)
    if leads_only:
        return _status_leads(target, names, namespace, as_json, wide)
    leads: list[Lead] = []
    states, now, drawings, standby = _load(target, names or None, namespace,
                                           timeline=timeline, last=last, leads=leads)
    unknown = sorted(set(names) - {s.name for s in states} - {x.name for x in leads})
    if as_json:
        write_line(indented_json(status_objects(states, drawings if timeline else None,
                                                target.redacted, standby)), as_json=True)
    elif timeline:
        from once.report import timeline as draw

        draw.render([(s, drawings.get(s.name, [])) for s in states], tty())
    elif states or leads:
        render_status(states, now, target, standby_words(standby), wide,
                      [lead_table(leads)] if leads else [])
    elif not unknown:
        say(f"no jobs in the ledger {target.redacted}{standby_words(standby)}"
            + (f" under namespace {namespace}" if namespace else ""))
    for name in unknown:
        say(f"unknown job {name!r}: no run of it in the ledger {target.redacted}")
    return 2 if unknown else 0


def _status_leads(target: Target, names: Sequence[str], namespace: str | None,
                  as_json: bool, wide: bool) -> int:
    """`once status --leads`: the lead names alone."""
    leads: list[Lead] = []
    try:
        with surveying(target) as snap:
            standby = snap.standby()
            leads = read_leads(snap, names or None, namespace)
    except NoLedger:
        standby = None
    unknown = sorted(set(names) - {x.name for x in leads})
    if as_json:
        write_line(json.dumps(lead_objects(leads, target.redacted, standby), indent=2),
                   as_json=True)
    elif leads:
        render_status([], leads[0].now, target, standby_words(standby), wide,
                      [lead_table(leads)])
    elif not unknown:
        say(f"no lead names in the ledger {target.redacted}{standby_words(standby)}"
            + (f" under namespace {namespace}" if namespace else ""))
    for name in unknown:
        say(f"unknown lead name {name!r}: no once lead of it in the ledger {target.redacted}")
    return 2 if unknown else 0


def _leads_well(leads: Sequence[Lead]) -> str:
    """What check's OK line says of the lead names ('' without any)."""
    if not leads:
        return ""
    return f"; {len(leads)} lead name{'' if len(leads) == 1 else 's'}: none leaderless past " \
           f"its lease"


def check(target: Target, jobs_named: Sequence[str], namespace: str | None, grace: float,
          as_json: bool) -> int:
    """`once check`: the findings, one a line; exit 0, 1 (WARNING), 2 (CRITICAL) or 3
    (UNKNOWN: no job in the ledger, which is more often the wrong ledger than a quiet one)."""
    names = _stored(jobs_named, namespace)
    leads: list[Lead] = []
    try:
        states, _, _, standby = _load(target, names or None, namespace, grace, leads=leads)
    except LedgerError as exc:
        if not errors.not_ready(exc):
            raise
        found = [not_ready(target.redacted, exc.cause or describe(exc.__cause__ or exc))]
        return _print_findings(found, target, as_json)
    found = findings(states) + lead_findings(leads, grace)
    lagging = _lagging(standby, grace, target)
    if lagging is not None:
        found.append(lagging)
    for name in sorted(set(names) - {s.name for s in states} - {x.name for x in leads}):
        found.append(Finding(CRITICAL, name, "-", "unknown",
                             "never ran: no run of this job in the ledger"))
    if not states and not names and not leads:
        where = f"namespace {namespace} in " if namespace else ""
        found.append(Finding(UNKNOWN, "", "-", "empty",
                             f"no job has run in {where}the ledger {target.redacted}; is it "
                             f"the one the jobs use? see --db and ONCE_DATABASE_URL"))
    count = len(states)
    return _print_findings(found, target, as_json,
                           f"OK {count} job{'' if count == 1 else 's'}: every due period done"
                           f"{_leads_well(leads)} "
                           f"(ledger {shown(target.redacted)}{standby_words(standby)})")


def _print_findings(found: list[Finding], target: Target, as_json: bool,
                    all_well: str = "") -> int:
    """check's findings, most severe first (all_well when there is none); its exit status."""
    found.sort(key=lambda f: f.order)
    if as_json:
        write_line(json.dumps([{**f.as_dict(), "ledger": target.redacted} for f in found],
                              indent=2), as_json=True)
    else:
        lines = [f.line for f in found] or [all_well]
        if tty():  # a finding wider than the terminal: its details under it, never wrapped
            from once.report.screen import finding_lines

            lines = finding_lines(lines)
        for line in lines:
            write_line(line)
    return max((f.severity for f in found), default=OK)


def history(target: Target, stored_job: str, limit: int, as_json: bool,
            period: str | None = None, lead: bool = False, wide: bool = False) -> int:
    """`once history JOB`: every attempt, newest first; of a lead name (lead, or a name no
    job has), its terms, newest first. wide: on a terminal, every column whole."""
    found: tuple[str, list[dict[str, object]]] | None = None
    terms: tuple[list[TermRow], Lead | None] = ([], None)
    try:
        with reading(target) as conn:
            if not lead:
                found = attempt_entries(conn, target, stored_job, limit, period)
            if found is None and period is None:
                terms = read_terms(Snapshot.over(conn, target), stored_job, limit)
    except NoLedger:
        pass
    if found is None and terms[0]:
        found = ("", term_entries(*terms))
    if found is None:
        say(f"unknown lead name {stored_job!r}: no term of it in the ledger {target.redacted}"
            if lead else
            f"unknown job {stored_job!r}: no run of it in the ledger {target.redacted}")
        return 2
    tz, entries = found
    if as_json:
        write_line(json.dumps(entries, indent=2), as_json=True)
    elif terms[0]:
        render_terms(stored_job, entries, wide)
    else:
        render_history(stored_job, tz, entries, wide)
    return 0


def fleet_history(target: Target, namespace: str | None, limit: int, as_json: bool,
                  wide: bool = False) -> int:
    """`once history` without JOB: the latest attempts of every job, newest first."""
    try:
        with reading(target) as conn:
            entries = fleet_entries(conn, target, limit, namespace)
    except NoLedger:
        entries = []
    if as_json:
        write_line(json.dumps(entries, indent=2), as_json=True)
    elif entries:
        render_fleet_history(entries, wide)
    else:
        say(f"no attempts in the ledger {target.redacted}"
            + (f" under namespace {namespace}" if namespace else ""))
    return 0


def metrics(target: Target, namespace: str | None) -> int:
    """`once metrics`: Prometheus text exposition format, for the textfile collector."""
    try:
        with surveying(target) as snap:
            text = metrics_text(snap, namespace)
    except NoLedger:
        text = exposition([], {})
    sys.stdout.write(scrub(text))
    return 0


def metrics_text(snap: Snapshot, namespace: str | None) -> str:
    """What `once metrics` prints (and once serve's /metrics): every job (of the namespace)
    from its counts (survey_jobs without detail, and its latest done row), its attempts
    counted, and the lead names (read last: it may end the snapshot)."""
    states, _ = survey_jobs(snap, None, namespace, detail=False)
    read_last_done(snap, [s for s in states if not s.detailed])
    counts = attempt_counts(snap, [s.name for s in states])
    return exposition(states, counts, read_figures(snap, namespace))

"""`once check`'s findings: what is wrong with each job, as one line each (pure: no database,
no output).

The lines, one per finding on stdout, most severe first, are a stable format that scripts
parse (the first three fields never contain spaces): docs/how-to/monitoring.md, "`once
check`: the gap audit", lists them. Text from the ledger is shown through once.escape.shown,
so that a finding is always one line; a range line follows the first ten listed findings of
one kind for one job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from once.escape import shown, shown_word
from once.ledger.rows import RunRow
from once.report.model import LIST_LIMIT, NEVER, JobState, rounded
from once.report.render import age

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
SEVERITY = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}


@dataclass
class Finding:
    severity: int
    job: str
    period: str  # a key, FIRST..LAST for a range, or - for the job as a whole
    problem: str  # missing, failed, failed-out, stale, overrun, unknown, unreadable, empty,
    # standby, not-ready
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    at: datetime = NEVER  # for ordering

    @property
    def line(self) -> str:
        """One line, whatever the job, period or owner hold (their controls escaped)."""
        job = shown_word(self.job) or "-"  # "": the ledger as a whole
        text = f"{SEVERITY[self.severity]} {job} {shown_word(self.period)} {self.problem}"
        return f"{text} ({shown(self.detail)})" if self.detail else text

    @property
    def order(self) -> tuple[Any, ...]:
        return (-self.severity, self.job, self.at, self.problem)

    def as_dict(self) -> dict[str, Any]:
        return {"severity": SEVERITY[self.severity], "status": self.severity,
                "job": self.job or None,
                "period": None if self.period == "-" else self.period,
                "problem": self.problem, "detail": self.detail or None, **self.extra,
                "line": self.line}


def not_ready(ledger: str, cause: str) -> Finding:
    """check's UNKNOWN for a server that is up but answers nothing on the ledger (a Galera
    node outside the Primary component, or refusing queries): what the ledger holds cannot be
    told from it, so no job is judged (docs/how-to/high-availability.md)."""
    return Finding(UNKNOWN, "", "-", "not-ready",
                   f"the ledger {ledger} cannot be read on this server: {cause} (a Galera node "
                   f"outside the Primary component, or refusing queries): what the ledger "
                   f"holds is not seen; read a node of the Primary component")


def findings(states: Sequence[JobState]) -> list[Finding]:
    """What `once check` reports for each job (unsorted)."""
    found: list[Finding] = []
    for s in states:
        if s.sched is None:
            found.append(Finding(CRITICAL, s.name, "-", "unreadable", s.error))
            continue
        found += _missing_findings(s)
        failed = [r for r in s.failed if s.failed_out(r) or s.due(r)]
        found += _capped(s, [_failed_finding(s, r) for r in failed])
        found += _capped(s, [_stale_finding(s, r) for r in s.running if s.is_stale(r)])
        found += _capped(s, [_overrun_finding(s, r) for r in s.overrunning])
    return found


def _missing_findings(s: JobState) -> list[Finding]:
    listed = s.no_row_listed
    out = [Finding(CRITICAL, s.name, key, "missing", at=start)
           for start, key in listed[:LIST_LIMIT]]
    if s.no_row > LIST_LIMIT and len(listed) > LIST_LIMIT and s.no_row_last is not None:
        more = s.no_row - LIST_LIMIT
        (start, first), (_, last) = listed[LIST_LIMIT], s.no_row_last
        word = "at least " if s.no_row_at_least else ""
        noun = "period" if s.shards == 1 else "shard"
        out.append(Finding(CRITICAL, s.name, f"{first}..{last}", "missing",
                           f"{word}{more} more {noun}{'' if more == 1 else 's'}",
                           {"count": more, "first": first, "last": last}, at=start))
    return out


def _failed_finding(s: JobState, r: RunRow) -> Finding:
    out = s.failed_out(r)
    detail = f"attempt {r.attempt} of {s.max_attempts}"
    if r.interrupted:  # not counted against --max-attempts
        detail += f", {r.interrupted} interrupted"
    detail += f", exit {r.exit_code}"
    if out:
        detail += ", no attempts left"
    return Finding(CRITICAL, s.name, r.period, "failed-out" if out else "failed", detail,
                   {"attempt": r.attempt, "interrupted": r.interrupted,
                    "max_attempts": s.max_attempts,
                    "exit_code": r.exit_code, "due": s.due(r)}, at=r.period_start)


def _stale_finding(s: JobState, r: RunRow) -> Finding:
    heartbeat_age = s.heartbeat_age(r)
    due = s.due(r)
    detail = (f"owner {r.owner}, attempt {r.attempt}, heartbeat {age(heartbeat_age)} ago, "
              f"stale after {age(r.stale_after)}")
    return Finding(CRITICAL if due else WARNING, s.name, r.period, "stale", detail,
                   {"owner": r.owner, "attempt": r.attempt,
                    "heartbeat_age_s": rounded(heartbeat_age), "due": due},
                   at=r.period_start)


def _overrun_finding(s: JobState, r: RunRow) -> Finding:
    running = s.running_for(r)
    detail = f"owner {r.owner}, attempt {r.attempt}, running {age(running)}"
    return Finding(CRITICAL, s.name, r.period, "overrun", detail,
                   {"owner": r.owner, "attempt": r.attempt, "running_s": rounded(running)},
                   at=r.period_start)


def _capped(s: JobState, found: list[Finding]) -> list[Finding]:
    """At most LIST_LIMIT findings of one kind, then one range line for the rest."""
    if len(found) <= LIST_LIMIT:
        return found
    rest = found[LIST_LIMIT:]
    first, last = rest[0], rest[-1]
    more = len(rest)
    summary = Finding(max(f.severity for f in rest), s.name, f"{first.period}..{last.period}",
                      first.problem, f"{more} more period{'' if more == 1 else 's'}",
                      {"count": more, "first": first.period, "last": last.period},
                      at=first.at)
    return [*found[:LIST_LIMIT], summary]

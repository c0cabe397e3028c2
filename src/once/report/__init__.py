"""Reports on the ledger: `once status`, `once history` (of a job or of the fleet), `once
check` and `once metrics`.

Only the reports import SQLAlchemy and rich (`once run` never pays for them), and `once
status`, `once check` and `once metrics` not SQLAlchemy: they read the ledger through
once.ledger.fleet's plain statements on the driver, the other reports through the named
statements of once.ledger.history (they build none); each in one snapshot, and change nothing
(except that a ledger whose schema is older than this once's is upgraded first, as the next
`once run` would do; an absent ledger is reported empty, never created).

What the reports call a job's periods, for a job with lag L and a check with --grace G:

* its first period: the one containing `once_jobs.first_period_start` (its earliest claim);
* a period P is due once the end of P+L plus G has passed (docs/how-to/monitoring.md), so the
  latest due period is the one L+1 periods before the period containing now - G;
* missing: a due period, from the first one on, with no done row, no failed row and no live
  attempt: no row at all, or a running row whose heartbeat is older than the job's
  --stale-after (by the database's clock);
* overrun: a running row of a due period, its heartbeat fresh, whose attempt has run longer
  than the period lasts, plus G (by the attempt's own start: a rerun or a catch-up of an old
  period is none as it starts);
* failed: a failed row; failed-out: a failed row with no attempts left (its attempt has reached
  the --max-attempts of the job's latest run).

With --shards N, every period should have N rows (KEY#0 ... KEY#N-1) and each shard without
one is a missing unit of its own.

Known limit: the counts assume the job's rows follow its current schedule. After a change of
--every/--cron/--tz/--shards, rows of the old schedule inside the due range can hide or invent
missing periods.

The parts, each importing only those above it:

* model: RunRow, JobState, AttemptCounts and the pure rules over them (no database);
* snapshot: one read-only, consistent snapshot: the survey's (once.ledger.fleet, no
  SQLAlchemy) and the other reads' (SQLAlchemy);
* survey, attempts: the reads (jobs' states and gaps, timelines; attempts, holders, counts);
* render: durations in words, table cells (whole and compact), plain tables, `status --json`
  objects; screen: the tables of a terminal, fitted to its width (rich);
* check: `once check`'s findings; metrics: `once metrics`' exposition (both pure);
* leads: the lead names of `once lead` in each of them (their reads, last in a snapshot);
* commands: the four commands, each one snapshot read, judged and printed.

once.gaps (the gap finder) stays outside: `once run --catchup` imports it, never this package.
"""

from once.ledger.rows import RunRow
from once.messages import say
from once.report.attempts import (
    attempt_counts,
    attempt_entries,
    fleet_entries,
    holders,
    job_zone,
    period_keys,
)
from once.report.check import CRITICAL, OK, SEVERITY, UNKNOWN, WARNING, Finding, findings
from once.report.commands import (
    check,
    fleet_history,
    history,
    metrics,
    metrics_text,
    status,
)
from once.report.leads import (
    LeadFigures,
    lead_findings,
    lead_objects,
    overdue,
    read_figures,
    read_leads,
)
from once.report.metrics import exposition
from once.report.model import (
    LIST_LIMIT,
    AttemptCounts,
    JobState,
    attempt_entry,
    last_line,
)
from once.report.render import (
    age,
    indented_json,
    plain_table,
    status_cells,
    status_object,
    status_objects,
    status_word,
    took,
    write_line,
)
from once.report.snapshot import NoLedger, reading, surveying
from once.report.survey import (
    complete,
    oldest_gaps,
    survey,
    survey_jobs,
    timeline_cells,
    timelines,
)

__all__ = [
    "CRITICAL",
    "LIST_LIMIT",
    "OK",
    "SEVERITY",
    "UNKNOWN",
    "WARNING",
    "AttemptCounts",
    "Finding",
    "JobState",
    "LeadFigures",
    "NoLedger",
    "RunRow",
    "age",
    "attempt_counts",
    "attempt_entries",
    "attempt_entry",
    "check",
    "complete",
    "exposition",
    "findings",
    "fleet_entries",
    "fleet_history",
    "history",
    "holders",
    "indented_json",
    "job_zone",
    "last_line",
    "lead_findings",
    "lead_objects",
    "metrics",
    "metrics_text",
    "oldest_gaps",
    "overdue",
    "period_keys",
    "plain_table",
    "read_figures",
    "read_leads",
    "reading",
    "say",
    "status",
    "status_cells",
    "status_object",
    "status_objects",
    "status_word",
    "survey",
    "survey_jobs",
    "surveying",
    "timeline_cells",
    "timelines",
    "took",
    "write_line",
]

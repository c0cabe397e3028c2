"""`once logs JOB [--period KEY] [--attempt N] [--json]`: what an attempt said, from any host.

The tail of each attempt's output is stored with its finish (once_attempts.output, see
once.run.relay). This prints one attempt's: the latest of the job (or of --period), or the one
--attempt names, after a one-line header in the manner of tail(1):

    ==> nightly 2026-11-29 attempt 2: failed (exit 3), owner vm:8804, finished
        2026-11-29T02:00:13+01:00 after 12.3s <==      (one line)

and then the output as stored, its control characters escaped (once.escape.shown_lines)
but for line breaks and tabs. A report: once.ledger.history's reads, one snapshot, nothing
written.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sqlalchemy import Connection

from once import report
from once.escape import shown, shown_lines
from once.ledger import Target, engines, history
from once.secrets import scrub


def logs(target: Target, stored_job: str, period: str | None = None,
         attempt: int | None = None, as_json: bool = False) -> int:
    """Print one attempt's stored output; 2 when the job, period or attempt is unknown."""
    try:
        with report.reading(target) as conn:
            found = attempt_output(conn, target, stored_job, period, attempt)
    except report.NoLedger:
        found = None
    if found is None:
        report.say(f"unknown job {stored_job!r}: no run of it in the ledger "
                    f"{target.redacted}")
        return 2
    entry, output = found
    if entry is None:  # output: the period key looked for
        which = f"attempt {attempt}" if attempt is not None else "attempt"
        where = f" at period {output}" if period is not None else ""
        if period is not None and output != period:
            where += f" (--period {period})"
        report.say(f"job {stored_job} has no {which}{where}")
        return 2
    if as_json:
        report.write_line(json.dumps({**entry, "output": output}, indent=2), as_json=True)
        return 0
    report.write_line(header(entry))
    sys.stdout.flush()
    if output is None:
        report.say(_nothing(entry))
    elif output:
        body = shown_lines(output)
        sys.stdout.write(scrub(body if body.endswith("\n") else body + "\n"))
    return 0


def header(entry: dict[str, Any]) -> str:
    """==> JOB PERIOD attempt N: OUTCOME (exit E), owner O, finished T after D <=="""
    what = report.status_word(entry)
    if entry["exit_code"] is not None:
        what += f" (exit {entry['exit_code']})"
    if entry["finished_at"]:
        when = (f"finished {entry['finished_at']} after "
                f"{report.took(entry['duration_s'])}")
    else:
        when = f"started {entry['started_at']}"
    return shown(f"==> {entry['job']} {entry['period']} attempt {entry['attempt']}: {what}, "
                 f"owner {entry['owner']}, {when} <==")


def _nothing(entry: dict[str, Any]) -> str:
    if entry["outcome"] in ("running", "stale"):
        return "nothing stored yet: the output is stored when the attempt finishes"
    if entry["outcome"] == "taken-over":
        return "nothing stored: the attempt never finished (another took the period over)"
    return ("no output was captured for this attempt (--output-tail 0, the command's output "
            "was a terminal, or it ran under an older once)")


def attempt_output(conn: Connection, target: Target, job: str, period: str | None,
           attempt: int | None) -> tuple[dict[str, Any] | None, str | None] | None:
    """(the attempt as `once history --json` shows it, its output); None for an unknown job,
    (None, the period key looked for) when no attempt matches. --period as once history
    reads it (report.period_keys: a key, a date or an instant)."""
    job_rows = history.job_rows(conn, [job], None)
    if not job_rows:
        return None
    if period is None and attempt is not None:  # that attempt of the latest attempt's period
        period = history.latest_attempt_period(conn, job)
        if period is None:
            return None, None
    keys = report.period_keys(job_rows[0], period) if period is not None else [None]
    found: list[history.AttemptRow] = []
    for key in keys:
        found = found or history.attempt_rows(conn, job, 1, key, attempt, output=True,
                                              runs_only=True)
    if not found:
        return None, keys[0]
    row = found[0]
    holder = report.holders(conn, job, {row.period}).get(row.period)
    tz = report.job_zone(job_rows[0].tz)
    entry = report.attempt_entry(row, holder, engines.db_now(conn, target), tz)
    return entry, row.output

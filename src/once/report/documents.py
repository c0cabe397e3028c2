"""The JSON documents the reports print, as one typed definition: `once status --json` (and
`once serve`'s `/api/status`, the same array), `once status --leads --json` (and
`/api/leads`), `once check --json`, `once history --json` (and `--lead`'s) and `once logs
--json`. Each key carries its meaning (Annotated), from which docs/reference/json.md
is generated (`make man`); tests/unit/test_docs_site.py runs the real commands and fails when a
key they print is not here, or a key here is never printed. NotRequired: printed only where it
applies.

Times are ISO 8601 in the job's zone, with their offset (a lead name's: in UTC); durations
(`_s`) are seconds.

Imports only typing: nothing on the hot path reads it. No `from __future__ import annotations`:
TypedDict tells NotRequired keys only from evaluated annotations.
"""


from typing import Annotated, NotRequired, TypedDict


class Attempt(TypedDict):
    """What every document of one attempt says first: which attempt of which period."""

    period: Annotated[str, "the period's key"]
    attempt: Annotated[int, "the attempt's number, from 1"]
    fence: Annotated[int, "its fencing token (`ONCE_FENCE`)"]
    owner: Annotated[str, "who runs or ran it (`ONCE_OWNER`, or the host name and process "
                     "id)"]
    started_at: Annotated[str, "when it started"]


class RunningAttempt(Attempt):
    """An entry of a job's `running`: an attempt whose row is running."""

    heartbeat_at: Annotated[str, "its latest heartbeat, by the database's clock"]
    heartbeat_age_s: Annotated[float, "how old that heartbeat is"]
    stale: Annotated[bool, "the heartbeat is older than the owner's `--stale-after`, so the "
                     "owner counts as dead and the period's next claim may take it over"]
    stale_after_s: Annotated[int, "the owner's `--stale-after`, as kept in the row"]
    due: Annotated[bool, "its period is due (past its end, the lag and `--grace`)"]
    overrun: Annotated[bool, "a live attempt of a due period that has run longer than the "
                       "period lasts: a hung or slow run"]
    running_s: Annotated[float, "how long it has run"]


class LastFailure(TypedDict):
    """A job's `last_failure`: the failed period that finished last."""

    period: Annotated[str, "the period's key"]
    attempt: Annotated[int, "the attempt that failed"]
    exit_code: Annotated[int | None, "its exit status"]
    finished_at: Annotated[str | None, "when it finished"]
    last_line: Annotated[str | None, "the last line of its stored output that is not blank"]


class FailedPeriod(LastFailure):
    """An entry of a job's `failed_periods` (the first ten failed periods): what
    `last_failure` says of one, and what is left of it."""

    interrupted: Annotated[int, "how many of the period's attempts were interrupted (a "
                           "forwarded signal: not counted against `--max-attempts`)"]
    attempts_left: Annotated[int, "attempts left under the job's `--max-attempts` (and the "
                             "cap of 3 x `--max-attempts` in all)"]
    due: Annotated[bool, "the period is due"]


class Standby(TypedDict):
    """A job's `standby` when the ledger read is a PostgreSQL standby's copy."""

    replay_lag_s: Annotated[float | None, "how far the standby is behind its primary; null "
                            "when it cannot tell"]


class TimelineCell(TypedDict):
    """An entry of a job's `timeline` (with `--timeline`)."""

    period: Annotated[str, "the period's key"]
    start: Annotated[str, "its start"]
    state: Annotated[str, "`done`, `failed`, `missing`, `running`, `stale`, `pending` (not "
                     "due yet) or `none` (before the first run)"]


class StatusJob(TypedDict):
    """`once status --json` prints an array of these, one a job; `/api/status` too (every
    job, or with `?state=&name=&limit=&offset=` a page of those that match)."""

    job: Annotated[str, "the stored name (with its namespace)"]
    kind: Annotated[str, "`every` or `cron`"]
    schedule: Annotated[str, "the `--every` spec or the `--cron` expression"]
    tz: Annotated[str, "the job's zone"]
    lag: Annotated[int, "its `--lag`"]
    max_attempts: Annotated[int, "its `--max-attempts`"]
    stale_after_s: Annotated[int, "its latest run's `--stale-after`"]
    first_period: Annotated[str | None, "the first period it claimed"]
    last_done: Annotated[str | None, "the latest done period's key"]
    last_finished_at: Annotated[str | None, "when that period's run finished"]
    last_duration_s: Annotated[float | None, "how long that run took"]
    running: Annotated[list[RunningAttempt], "the attempts whose row is running"]
    failed: Annotated[int, "how many periods are failed"]
    failed_out: Annotated[int, "how many of them have no attempts left"]
    failed_periods: Annotated[list[FailedPeriod], "the first ten failed periods"]
    last_failure: Annotated[LastFailure | None, "the failed period that finished last; null "
                            "when none is failed"]
    missing: Annotated[int, "how many due periods are missing"]
    missing_at_least: Annotated[bool, "`missing` is a lower bound (a cron job's gap too large "
                                "to count)"]
    missing_periods: Annotated[list[str], "the first ten missing periods' keys"]
    missing_last: Annotated[str | None, "the last missing period's key"]
    due_through: Annotated[str | None, "the latest due period's key"]
    current: Annotated[str | None, "the period that contains now"]
    current_state: Annotated[str | None, "that period's state: `done`, `running`, `stale`, "
                             "`failed` or `not-run` (with `--shards`, the worst of its "
                             "shards'); null without a schedule"]
    next: Annotated[str | None, "the next period `once run` will claim"]
    next_at: Annotated[str | None, "when it starts"]
    fires: Annotated[int, "claims made: every `once run`, catch-up and rerun call"]
    error: Annotated[str | None, "why the stored schedule cannot be rebuilt here (an unknown "
                     "zone, say); null when it can"]
    ledger: NotRequired[Annotated[str, "the ledger read, its password replaced by `***`"]]
    standby: NotRequired[Annotated[Standby | None, "null, or the standby the ledger read is"]]
    timeline: NotRequired[Annotated[list[TimelineCell], "with `--timeline`: the periods drawn"]]


class CheckFinding(TypedDict):
    """`once check --json` prints an array of these, most severe first; `[]` when all is
    well."""

    severity: Annotated[str, "`CRITICAL`, `WARNING` or `UNKNOWN`"]
    status: Annotated[int, "the exit status it stands for, 0 to 3"]
    job: Annotated[str | None, "the job; null for a lead name's finding (`lead`) and for the "
                   "ledger as a whole"]
    period: Annotated[str | None, "the period's key; null for the job as a whole"]
    problem: Annotated[str, "`missing`, `failed`, `failed-out`, `stale`, `overrun`, "
                       "`unreadable` (a stored schedule that cannot be rebuilt), `unknown`, "
                       "`empty`, `standby`, `not-ready` (a server that cannot answer for the "
                       "ledger: a Galera node outside the Primary component) or "
                       "`leaderless` (a lead name without a leader "
                       "past its lease plus `--grace`)"]
    detail: Annotated[str | None, "what the line says in parentheses"]
    line: Annotated[str, "the finding as `once check` prints it"]
    ledger: Annotated[str, "the ledger read, its password replaced by `***`"]
    attempt: NotRequired[Annotated[int, "the attempt (failed, stale, overrun)"]]
    interrupted: NotRequired[Annotated[int, "how many of the period's attempts were "
                                       "interrupted (failed)"]]
    max_attempts: NotRequired[Annotated[int, "the job's `--max-attempts` (failed)"]]
    exit_code: NotRequired[Annotated[int | None, "the attempt's exit status (failed)"]]
    owner: NotRequired[Annotated[str, "the attempt's owner (stale, overrun)"]]
    heartbeat_age_s: NotRequired[Annotated[float, "its heartbeat's age (stale)"]]
    due: NotRequired[Annotated[bool, "the period is due (failed, stale)"]]
    running_s: NotRequired[Annotated[float, "how long it has run (overrun)"]]
    replay_lag_s: NotRequired[Annotated[float | None, "a standby's lag; null when unknown "
                                        "(standby)"]]
    lead: NotRequired[Annotated[str, "the lead name (leaderless)"]]
    term: NotRequired[Annotated[int, "its last term (leaderless)"]]
    leaderless_s: NotRequired[Annotated[float, "how long it has had no leader, since the "
                                        "last holder's lease ran out or was released "
                                        "(leaderless)"]]
    lease_s: NotRequired[Annotated[float, "the `--lease` of its last term (leaderless)"]]
    candidates: NotRequired[Annotated[int, "candidates waiting (leaderless)"]]
    count: NotRequired[Annotated[int, "on a range line: how many more periods"]]
    first: NotRequired[Annotated[str, "on a range line: the first of them"]]
    last: NotRequired[Annotated[str, "on a range line: the last of them"]]


class StatusLead(TypedDict):
    """`once status --leads --json` prints an array of these, one a lead name of `once lead`
    (by name); `/api/leads` too. A name retired with `once lead --retire` is in none."""

    lead: Annotated[str, "the stored name (with its namespace)"]
    held: Annotated[bool, "a leader holds it now: its lease has not run out, by the "
                    "database's clock"]
    owner: Annotated[str | None, "the leader's name (its `--owner`, `ONCE_OWNER`, or host "
                     "name and process id); null when none holds it"]
    term: Annotated[int, "the latest term (the leader's, or the last one's): larger than "
                    "every term of the name before it"]
    lease_s: Annotated[float, "that term's `--lease`"]
    leading_since: Annotated[str | None, "when the leader took the lease; null when none "
                             "holds it"]
    renewed_at: Annotated[str | None, "its last renewal, by the database's clock; null when "
                          "none holds it"]
    expires_at: Annotated[str, "when the lease runs out unless renewed; when none holds it, "
                          "when it ran out or was released"]
    leaderless_s: Annotated[float, "how long it has had no leader since then; 0 while one "
                            "holds it (`once check` reports it past `lease_s` plus "
                            "`--grace`)"]
    candidates: Annotated[int, "candidates waiting for the lease"]
    ledger: Annotated[str, "the ledger read, its password replaced by `***`"]
    standby: Annotated[Standby | None, "null, or the standby the ledger read is"]


class LeadTerm(TypedDict):
    """`once history --lead NAME --json` (and `once history NAME --json` of a name no job
    has) prints an array of these, one a term, newest first."""

    lead: Annotated[str, "the stored name"]
    term: Annotated[int, "the term (`ONCE_TERM` of its command)"]
    owner: Annotated[str, "who held it"]
    lease_s: Annotated[float, "its `--lease`"]
    started_at: Annotated[str, "when its holder took the lease"]
    ended_at: Annotated[str | None, "when it ended; null while it lasts, or when its end was "
                        "not seen (a name retired after its lease ran out)"]
    ended: Annotated[str | None, "how it ended: `released` (its command ended, or `once lead` "
                     "was stopped), `lost` (its holder could not renew and stepped down) or "
                     "`expired` (its lease ran out unrenewed: the holder died, hung or was "
                     "cut off); null while it lasts"]
    held_s: Annotated[float | None, "how long it was held (so far, while it lasts); null when "
                      "its end was not seen"]


class HistoryEntry(Attempt):
    """`once history --json` prints an array of these, one an attempt, newest first."""

    job: Annotated[str, "the stored name"]
    status: Annotated[str, "`running`, `done` or `failed`, as the attempt's row says"]
    outcome: Annotated[str | None, "how it ended (`done`, `failed`, `timed-out`, "
                       "`exec-failed`, `guard-died`, `bad-state`, `interrupted`: a forwarded "
                       "signal, not counted against `--max-attempts`) or, not finished, "
                       "`running`, `stale` or `taken-over`"]
    finished_at: Annotated[str | None, "when it finished"]
    duration_s: Annotated[float | None, "how long it took"]
    exit_code: Annotated[int | None, "its exit status"]
    reason: Annotated[str | None, "the `once rerun --reason`"]
    last_line: Annotated[str | None, "a failed attempt's last line of output that is not "
                         "blank; null otherwise"]


class LogsEntry(HistoryEntry):
    """`once logs --json` prints one: the attempt as `once history --json` has it, and its
    output."""

    output: Annotated[str | None, "the output as stored (its last `--output-tail` bytes), or "
                      "null when none was"]


# The documents, in the order the reference shows them: (title, the type).
DOCUMENTS: tuple[tuple[str, type], ...] = (
    ("once status --json", StatusJob),
    ("once status --leads --json", StatusLead),
    ("once check --json", CheckFinding),
    ("once history --json", HistoryEntry),
    ("once history --lead NAME --json", LeadTerm),
    ("once logs --json", LogsEntry),
)

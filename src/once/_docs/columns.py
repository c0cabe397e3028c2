"""What each column of the ledger's tables means, as data: docs/reference/tables.md lists the
tables of once.ledger.schema (names, types, keys and indexes come from there) with these
words. tests/unit/test_docs_site.py fails when a column has no words here, or words here
name a column that is gone. `once_runs` is public, for your own monitoring queries; the
others are once's own and may change with the schema version (CHANGELOG.md says when).

The text uses the prose markup: `code`, <PLACEHOLDER>. Imports only the standard library.
"""

from __future__ import annotations

TABLES = {
    "once_runs": "One row per (job, period): the attempt that owns the period. Public.",
    "once_attempts": "Every attempt, not only the one that owns its period; also the Python "
    "API's done marker.",
    "once_jobs": "Each job's fence counter and the schedule, zone, lag and `--max-attempts` of "
    "its latest run, so that the reports know which periods were expected; its `--state` "
    "watermark.",
    "once_meta": "The schema version.",
    "once_leases": "One row per lead name (`once lead`, `once.lead`): who holds its lease, in "
    "which term, until when. A lease is free when it has no holder or its `expires_at` has "
    "passed; the one `UPDATE` that takes it tests exactly that, so one candidate of any number "
    "wins. Added in schema 5 without a change of its version (Upgrading).",
    "once_lead_terms": "Every term of every lead name: who led, from when to when, and how it "
    "ended. `once lead --retire` leaves them; `once prune` deletes those that ended before its "
    "cut-off, but each name's latest term, from which its next term is numbered.",
    "once_lead_candidates": "The candidates waiting for a lead name, for the reports: each "
    "writes its row when it starts to wait and again every `--lease` (every 5 s for a "
    "shorter lease), and deletes it when it wins the lease or stops; a row seen within three "
    "of those intervals counts as a candidate.",
}

COLUMNS = {
    "once_runs": {
        "job": "The stored job name (<NS>`:`<JOB> with `--namespace`).",
        "period": "The period's key (with `--shards`, <KEY>`#`<I>).",
        "status": "`running`, `done` or `failed`.",
        "attempt": "The attempt that owns the row, from 1.",
        "fence": "The fencing token of that attempt (`ONCE_FENCE`).",
        "owner": "Host name and process id, or `ONCE_OWNER`.",
        "period_start": "The period's start (UTC).",
        "period_end": "The period's end, exclusive (UTC).",
        "started_at": "When the owning attempt started, by the database's clock.",
        "heartbeat_at": "Its latest heartbeat, by the database's clock.",
        "finished_at": "When it finished; NULL while running.",
        "exit_code": "The command's status; NULL while running.",
        "stale_after": "Seconds: the promise of the attempt that owns the row (its "
        "`--stale-after`); the row is stale once its heartbeat is older.",
        "claim_id": "A random identity of the claim that owns the row (64 bits, hex): renewals "
        "and the final write match on it as well as on `attempt`; NULL for a row claimed by a "
        "`once` before schema 5.",
        "interrupted": "How many of the row's attempts ended interrupted (a SIGTERM, SIGINT or "
        "SIGHUP that `once` forwarded): a failed row is retried while `attempt - interrupted` "
        "is below `--max-attempts` and `attempt` below 3 x `--max-attempts`; 0 for rows of a "
        "ledger before schema 5.",
    },
    "once_attempts": {
        "job": "The stored job name.",
        "period": "The period's key.",
        "attempt": "The attempt's number, from 1.",
        "fence": "Its fencing token.",
        "owner": "Who ran it.",
        "status": "`running`, `done` or `failed`.",
        "started_at": "When it started (UTC, the database's clock).",
        "finished_at": "When it finished; NULL while running or never finished.",
        "exit_code": "The command's status.",
        "outcome": "How it ended: `done`, `failed`, `timed-out`, `fenced-out`, or `taken-over` "
        "once another attempt took its period over.",
        "reason": "The `once rerun --reason`.",
        "command_hash": "A hash of the command line and `--version-tag`, which "
        "`--require-same-command` compares.",
        "output": "The last `--output-tail` bytes of its standard output and error (UTF-8), "
        "for `once logs`; NULL when not captured.",
        "claim_id": "The identity of the claim that made the attempt, as in "
        "`once_runs.claim_id`; required, no default, on MySQL/MariaDB not '' either (CHECK "
        "`once_attempts_claim_id`), so that a `once` before schema 5 cannot record a `once "
        "state --set`: `before-5` for an attempt recorded before schema 5, one of its own for a "
        "`once state --set`.",
    },
    "once_jobs": {
        "job": "The stored job name.",
        "fence": "The job's fence counter: every claim takes the next value.",
        "fire_count": "Claims made (`once_fires_total`): the claim adds one in the statement "
        "it sends anyway.",
        "kind": "`every` or `cron`, as the latest run gave it.",
        "schedule": "The `--every` spec or the `--cron` expression.",
        "tz": "The zone (`--tz`).",
        "lag": "`--lag`.",
        "max_attempts": "`--max-attempts`.",
        "stale_after": "The latest run's `--stale-after`, in seconds.",
        "first_period_start": "The start of the first period claimed: the reports count from "
        "it.",
        "created_at": "When the job's first claim was made.",
        "last_fired_at": "When it was last fired (`last_fire_at` before schema 5: the rename "
        "refuses an older `once prune`).",
        "shards": "`--shards`.",
        "no_overlap": "The latest claim's `--no-overlap` (1: on).",
        "state": "The `--state` watermark (at most 64 KiB of UTF-8).",
        "state_version": "The watermark's version, which a done finish compares and sets.",
    },
    "once_meta": {
        "name": "A setting's name (`schema_version`).",
        "value": "Its value.",
    },
    "once_leases": {
        "name": "The stored lead name (<NS>`:`<NAME> with `--namespace`).",
        "holder": "The holding process's own random id (32 hex digits; two processes of one "
        "pod are two holders), which its renewals and its release match on; NULL once released. A "
        "holder whose lease ran out stays until the next holder takes the lease.",
        "owner": "The holder's name for the reports (`--owner`, `ONCE_OWNER`, else host name and "
        "process id); NULL once released.",
        "term": "The latest term, `ONCE_TERM`: the term before it plus one, on PostgreSQL at "
        "least (timeline - 1) * 2^32 (as `once_runs.fence`).",
        "lease_seconds": "The latest holder's `--lease`, in seconds.",
        "acquired_at": "When the latest term began (the database's clock).",
        "renewed_at": "The latest renewal (or the acquire), by the database's clock.",
        "expires_at": "When the lease runs out unless renewed: the latest renewal or acquire "
        "plus `lease_seconds`, by the database's clock; a release sets it to the release's "
        "time. Free from then on.",
    },
    "once_lead_terms": {
        "name": "The stored lead name.",
        "term": "The term (`ONCE_TERM`).",
        "owner": "Who led it.",
        "lease_seconds": "Its `--lease`, in seconds.",
        "started_at": "When it began (the database's clock).",
        "ended_at": "When it ended: its release, or for a term that ran out its last "
        "`expires_at`, written when the next term begins; NULL until then.",
        "ended": "`released` (its command ended or was stopped, and the lease given up), `lost` "
        "(its holder found the lease lost and stopped its command), `expired` (the next term "
        "began after it ran out unreleased: its holder died, or was cut off or stopped; a holder "
        "that comes back writes `lost` or `released` over it); NULL while it lasts.",
    },
    "once_lead_candidates": {
        "name": "The stored lead name.",
        "holder": "The candidate process's own id (as `once_leases.holder`).",
        "owner": "Its name for the reports.",
        "seen_at": "When it last said it waits (the database's clock).",
    },
}

# What a partial index holds, and where it is made (an index without words here is made
# everywhere, of every row).
PARTIAL_INDEXES = {
    "once_runs_done_start": "PostgreSQL only, of the done rows",
    "once_attempts_unusual": "SQLite and PostgreSQL only, of the attempts that are not plain "
    "(failed, running, a retry, a rerun, interrupted, or `once state --set`'s): `once "
    "metrics` counts the others in indexes",
}

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
}

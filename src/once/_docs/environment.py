"""The environment, as data: what the variables `once` reads mean, how every option reads
one of its own, and what `once run` sets for its command. The man page's ENVIRONMENT section
and docs/reference/environment.md are laid out from it (once._docs.man, markdown); the words
use the roff engine's markup, as once._docs.prose's do. Imports nothing.
"""

from __future__ import annotations

# What the variables read by `once` mean; options with an explicit envvar that are missing
# here are described by their help text.
ENV_NOTES = {
    "ONCE_DATABASE_URL": "The ledger's URL, as `--db`: `sqlite:///`<PATH> (a relative path; "
    "`sqlite:////`<PATH> for an absolute one), `postgresql://`... (driven "
    "by psycopg 3, with or without `+psycopg`), `mysql://`... or "
    "`mariadb://`... (driven by PyMySQL). A server URL may name several hosts, "
    "`postgresql://`<USER>`@`<H1>`:5432,`<H2>`:5432/`<DB> or "
    "`mysql://`<USER>`@`<H1>`,`<H2>`/`<DB>, "
    "tried in order: the first that accepts the connection is used, and when none does the "
    "error names each. Default: the SQLite file under `XDG_STATE_HOME`, see FILES; none in a "
    "container or a Kubernetes pod.",
    "ONCE_DB_PASSWORD_FILE": "A file holding the ledger's password, as `--db-password-file`; "
    "it keeps the password out of crontabs and process lists.",
    "ONCE_TZ": "The IANA time zone the periods follow, as `--tz`. Default: `UTC`.",
    "ONCE_NAMESPACE": "As `--namespace`: the ledger stores job names as <NS>`:`<JOB>, so that "
    "teams or environments sharing one ledger cannot collide.",
}

ENV_FIXED = (
    (
        "ONCE_DATABASE_URL_FILE",
        "A file holding the ledger's URL, read when neither `--db` nor `ONCE_DATABASE_URL` "
        "is given: the URL, with its password, stays out of crontabs and process lists.",
    ),
    (
        "ONCE_OWNER",
        "Who runs the attempt or holds the lease, as recorded in the ledger's `owner` "
        "columns and shown by `once status` (a Kubernetes pod's name, say); `once lead "
        "--owner` wins over it: 1 to 255 printable UTF-8 characters, else a usage error. "
        "Default: the host name and process id.",
    ),
    (
        "KUBERNETES_SERVICE_HOST",
        "Set by Kubernetes in every pod. There, as in a container (`/.dockerenv`, "
        "`/run/.containerenv`), `once` has no default ledger: FILES.",
    ),
    (
        "XDG_STATE_HOME",
        "Where the default SQLite ledger lives: "
        "`$XDG_STATE_HOME/once/ledger.db`. Default: `~/.local/state`, which is what "
        "applies under cron (cron sets no `XDG_STATE_HOME`).",
    ),
)

ENV_AUTO = """\
Every other option can also be set from the environment, in a variable named `ONCE_`, the
command's name, `_` and the option's parameter name, in upper case with `-` as `_`: each
option's entry above names its variable, for example `ONCE_RUN_STALE_AFTER` for `once run
--stale-after` and `ONCE_CHECK_GRACE` for `once check --grace`. A flag is set by `1`,
`true`, `yes` or `on` and cleared by `0`, `false`, `no` or `off`. The command line wins over
the environment.
"""

CHILD_ENV = (
    ("ONCE_JOB", "The job's name as stored, with its namespace (<NS>`:`<JOB>)."),
    ("ONCE_PERIOD", "The period's key."),
    ("ONCE_PERIOD_START", "The period's start: ISO 8601 with UTC offset, in the job's time zone."),
    ("ONCE_PERIOD_END", "The period's end, in the same form; exclusive."),
    ("ONCE_ATTEMPT", "1 for the first attempt at this period, then 2, 3, ..."),
    (
        "ONCE_FENCE",
        "The fencing token: an integer that grows with every claim or takeover of "
        "any period of this job (on PostgreSQL, across a failover too: at least "
        "(timeline - 1) * 2^32). Store it with the job's writes (a 64-bit integer) and "
        "refuse a write that carries a smaller one.",
    ),
    ("ONCE_PERIOD_TZ", "The job's time zone (named so that a `once` the command starts does "
                       "not take it for its own `ONCE_TZ`)."),
    ("ONCE_STATE", "With `--state`: the job's watermark as the last successful run left it "
                   "(empty at first)."),
    ("ONCE_STATE_OUT", "With `--state`: a file path where the command may write the next "
                       "watermark (at most 64 KiB of UTF-8; one trailing newline is dropped; "
                       "no file means no change)."),
    ("ONCE_SHARD", "With `--shards` <N>: this run's shard, 0 to <N>-1."),
    ("ONCE_SHARDS", "With `--shards` <N>: <N>."),
    ("ONCE_OUTCOME", "In `--on-success`, `--on-failure` and `--on-skip` hooks: done, failed, "
                     "timed-out, fenced-out, skipped-done, skipped-held or skipped-failed."),
    ("ONCE_STATUS", "In hooks: the exit status of `once run`."),
    ("ONCE_OUTPUT_FILE", "In hooks, when the command's output was captured: a file (mode "
                         "0600, removed after the hook) holding its last `--output-tail` "
                         "bytes as the command wrote them (unset where it cannot be "
                         "written: a full or read-only temporary directory)."),
    ("ONCE_LEAD", "`once lead`'s command: the lead name as stored "
                  "(<NS>`:`<NAME> with `--namespace`)."),
    (
        "ONCE_TERM",
        "`once lead`'s command: the term, the leader's fencing token, an integer larger "
        "than every term of the name before it (on PostgreSQL, across a failover too: at "
        "least (timeline - 1) * 2^32). Store it with the leader's writes (a 64-bit integer) "
        "and refuse a write that carries a smaller one: only that stops a leader that was "
        "paused past its lease.",
    ),
)

CHILD_ENV_INTRO = """\
`once run`, `once catchup` and `once rerun` run the command directly, without a shell, with
standard input passed through, standard output and error passed through or relayed unchanged
(where they are not a terminal; their last `--output-tail` bytes are kept in the ledger) and
these variables added to its environment. A `once` that the command or a hook starts is not
changed by any of them: none is a variable `once` reads, and an outer run's are replaced or
removed, never passed on; but `ONCE_LEAD` and `ONCE_TERM`, which a `once run` started by a
leader's command passes on to its own command, so that a leader's job fences its writes by
the term. `once lead` runs its command the same way, its output passed through and not kept,
with `ONCE_LEAD` and `ONCE_TERM` alone:
"""

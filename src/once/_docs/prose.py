"""The prose of the man page, as data: the description, the options' introduction, the limits,
the files, the output, cron's traps, completion, the examples and the references (the exit
statuses are once._docs.exits', the environment once._docs.environment's). Edit the words
here; once._docs.man lays them out, and what a command or option says comes from its click
definition instead.

The text uses the roff engine's markup (once._docs.roff): `code` in bold, <PLACEHOLDER> in
italics, click's paragraphs. The one function here reads the examples' command lines back for
the tests. Imports only the standard library.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator

DESCRIPTION = """\
Cron, Kubernetes CronJobs, systemd timers and in-process schedulers promise a start time,
never a number of runs: a job fires twice when two machines carry the same crontab, and not at
all while its one machine is down. `once` fixes the job, not the schedule. Put `once run` in
front of any command, fire it from as many machines and as often as you like, and every period
of the job (a day, an hour, a cron slot) is claimed in a shared ledger table by exactly one
caller. The others skip it.

A period is given by `--every` <SPEC> (`minute`, <N>`m` where <N> divides 60, `hour`,
<N>`h` where <N> divides 24, `day`, `week` (ISO, starting on Monday), `month`, `quarter` or
`year`) or by `--cron` <EXPR> (a standard five-field cron expression; a period runs from one
fire time to the next). Periods follow the wall clock of the job's time zone (`--tz`):
`day` starts at local midnight, or at the first instant of the day where midnight does not
exist, and `6h` at 00:00, 06:00, 12:00 and 18:00. A period is the half-open interval
[start, next start); periods tile time with no gap and no overlap, whatever daylight saving
time does. `--lag` <N> claims the period <N> periods before the current one: a 02:00 report
about yesterday is `--every day --lag 1`.

Each period has a key, stored in the ledger and given to the command as `ONCE_PERIOD`:
`2026` (year), `2026-Q4` (quarter), `2026-10` (month), `2026-W44` (ISO week), `2026-10-27`
(day), and for hours, minutes and cron slots the local start with its UTC offset, such as
`2026-11-01T01:00-04:00` and, an hour later as the clocks fall back, `2026-11-01T01:00-05:00`.

The ledger is a SQLite file by default (not in a container: see FILES); machines that share
a job share a PostgreSQL, MySQL or MariaDB database (`--db`). Its tables are created on first
use. A claim inserts the row (job, period) into `once_runs`, or takes over a row that has
failed while attempts remain (`--max-attempts`, which does not count an attempt ended by a
SIGTERM, SIGINT or SIGHUP that `once` forwarded), or one that is running with a heartbeat
older than `--stale-after` by the database's clock; a period gets at most 3 times
`--max-attempts` attempts of any cause, interruptions included, after which a failed row is
not retried and a stale one is recorded failed instead. While the command runs, `once` renews the
heartbeat at least every third of `--stale-after`; if `once` dies, the command and everything
it started are killed at once.
Every claim gets a fencing token (`ONCE_FENCE`) that grows with each claim of the job, which
the command may use to guard its own writes against an owner that lost its claim.

A failed period is tried again by the next `once run` that fires within it, so a crontab that
fires every few minutes retries failures and costs one short transaction once the period is
done. `once catchup` and `once run --catchup` make up every period that needs a run (nobody
ran it, its owner died, or it failed with attempts left), also behind the latest done one,
oldest first, each claimed exactly as `once run` claims it; `once rerun` runs a done or
failed period again. `once status`, `once history`, `once check`, `once metrics` and
`once serve` (a read-only dashboard, `/metrics` for Prometheus and `/healthz`) make absence
loud; `once logs` prints what an attempt said, the tail of its output kept in the ledger.

Work that is not a period's, an application's own scheduler (Celery beat, APScheduler,
node-cron) that every replica of the application starts, runs under `once lead --name`
<NAME>: every replica runs the same line, one of them holds a lease on <NAME> in the ledger
and runs the command, and the others wait as candidates and take over when it stops (within
about a second) or dies (within `--lease`). The command gets SIGTERM `--kill-after` before
the lease's deadline and SIGKILL at it when renewals fail, even if `once` itself is stopped
or killed, and `ONCE_TERM`, a fencing token that grows with every new leader.

The table `once_runs` is public, for monitoring to read: `job` and `period` (the primary key),
`status` (`running`, `done` or `failed`), `attempt` (from 1), `fence`, `owner` (host name and
process id, or `ONCE_OWNER`), `period_start` and `period_end`, `started_at`, `heartbeat_at` and
`finished_at` (UTC, by the database's clock), `exit_code`, `stale_after` (the owner's promise,
in seconds) and `claim_id` (the owning claim's identity, which its renewals and final write
match on).

The ledger holds a schema version. A newer `once` upgrades an older ledger in place on first
use; a `once` older than the ledger is refused at every claim, every report, `once prune`
and `once state --set` (exit 75), while an attempt it claimed before the upgrade keeps its
claim to the end.
"""

OPTIONS_INTRO = """\
Every command takes `-h`, `--help`. The ledger and time zone options below are taken by every
command whose section names them; each also reads the environment variable shown. An option
given on the command line wins over its variable.
"""

# What the ledger cannot hold is refused (exit 2) before anything is sent: once.limits.
LIMITS = """\
Values the ledger's columns cannot hold are refused with status 2 before anything is sent,
the same on every backend; the Python API raises `once.InputError` (a `ValueError`) for the
same values. A job name and a namespace are 1 to 200 printable characters without
whitespace each, and the stored name <NS>`:`<JOB> at most 255. `ONCE_OWNER` is 1 to 255
printable UTF-8 characters without control characters (refused, never cut short). A `--cron`
expression is at most 255 characters; a `once rerun --reason` UTF-8 text of at most 1000
characters; a `once state --set` value UTF-8 text of at most 64 KiB. A
`--db-password-file` or `ONCE_DATABASE_URL_FILE` is UTF-8 text, not empty, at most 64 KiB,
without NUL (trailing line breaks are dropped). A `--db` URL is printable UTF-8 with a host
that can be read; a MySQL or MariaDB URL's `?charset=` may only be `utf8mb4`.
"""

FILES = (
    (
        "~/.local/state/once/ledger.db",
        "The default ledger, a SQLite file "
        "(`$XDG_STATE_HOME/once/ledger.db` when `XDG_STATE_HOME` "
        "is set), created with its directory on first use, private to the user (0600, "
        "the directory 0700), and said in one line on standard error (not with `-q`). "
        "`--db` or `ONCE_DATABASE_URL` names another. In a Kubernetes pod "
        "(`KUBERNETES_SERVICE_HOST` set) or a container (`/.dockerenv` or "
        "`/run/.containerenv` exists, or PID 1's cgroup names a container runtime) this file "
        "would be the container's own, and every pod of a CronJob would run the job: there "
        "every command that opens a ledger (reports and `once serve` too) exits 2 with one "
        "line naming `ONCE_DATABASE_URL`, running and creating nothing, until `--db`, "
        "`ONCE_DATABASE_URL` or `ONCE_DATABASE_URL_FILE` names a ledger (a SQLite file on "
        "a volume, if that is what is meant).",
    ),
)

UNDER_CRON = """\
Cron starts a line with little of a login shell, and says what went wrong only by mail.

`PATH`: Debian's cron sets `/usr/bin:/bin`, and `pip` installs `once` in `/usr/local/bin`
(`~/.local/bin` with `pipx` or `pip install --user`), so a bare `once` fails with `once: not
found`. Start the crontab with a `PATH=` line naming the directory `command -v once` prints
(cron expands neither `~` nor `$HOME` there), or write `once` with its absolute path.

The working directory is the user's home: give the command its absolute path.

The environment is the crontab's own `NAME=value` lines, not your shell's: set
`ONCE_DATABASE_URL`, or `ONCE_DATABASE_URL_FILE` naming a file that holds the URL, there. A
variable exported only in your shell leaves cron's `once` on the default SQLite ledger
(FILES); `once status` and `once check` name the ledger they read.

`once` writes its own lines, `once:` ..., to standard error and passes the command's output
through; cron mails whatever a line prints to `MAILTO` (by default the crontab's owner). A
skipped period prints nothing, but a period whose attempts are used up is warned about on
every fire, which a line firing every five minutes would mail every five minutes: `-q`
silences that warning and keeps every error.

`%` in a crontab's command field is a newline (cron passes what follows it to the command's
standard input): write each `%` of a URL (`p%40ss`) or of a hook's `date +%F` as `\\%`. A
`NAME=value` line and a file (`ONCE_DATABASE_URL_FILE`, `--db-password-file`,
`--ping-url-file`) take `%` as it is.
"""

OUTPUT = """\
Where the command's standard output or error is not a terminal, `once run`, `once catchup`
and `once rerun` give it a pipe and copy what comes out of it, unchanged and as it comes, to
where it was going, and keep its last `--output-tail` bytes (default 16KiB, both streams
together). They are stored with the attempt's result in the ledger, for `once logs` (and the
last line of a failure for `once history`, `once status --json` and `once serve`; the whole
of it on `once serve`'s `/logs/NAME` pages), sent as the success and
failure pings' body (`--ping-body-tail`), and given to hooks in `ONCE_OUTPUT_FILE`. On a
terminal nothing is captured. Once the command has ended, what its background processes
still write is copied for a second more; after that they get a broken pipe. A slow reader
gets every byte the command wrote, while `once` keeps renewing the claim; when `once` was
stopping the command (a signal, `--timeout`), for `--kill-after` at most.

Privacy: whatever the command prints, secrets included, is readable by everyone who can read
the ledger (and whoever can reach `once serve`'s pages: give it a `--token-file` when it
listens beyond 127.0.0.1), and goes
to the ping service. `--output-tail 0` stores and sends nothing; `--ping-body-tail 0` keeps
it out of the pings; `once prune` deletes it with the attempts it deletes.
"""

COMPLETION = """\
The scripts in the source tree's `completions/` directory complete commands, options, job
names from a SQLite ledger (a server ledger is not asked), zone names for `--tz` and the
specs `--every` takes. Install `once.bash` as
`/usr/share/bash-completion/completions/once` (or
`~/.local/share/bash-completion/completions/once`), `_once` in a directory of zsh's
`$fpath`, and `once.fish` as `~/.config/fish/completions/once.fish`. Without the files,
`eval "$(_ONCE_COMPLETE=bash_source once)"` in `~/.bashrc` (`zsh_source` in `~/.zshrc`)
does the same.
"""

# (what it shows, the literal block). Every `once ...` command line in a block is parsed by
# the test suite against the real CLI, so an example cannot use an option that is gone.
EXAMPLES = (
    (
        "A crontab line on every machine that may run the job: whichever fires first in a day runs "
        "`bill.sh` for that day; the others skip it. Firing every five minutes retries a failed "
        "day (up to `--max-attempts`) and costs one short transaction once the day is done; "
        "`-q` keeps a day that failed out from mailing a warning on every fire (UNDER CRON):",
        """\
PATH=/usr/local/bin:/usr/bin:/bin
ONCE_DATABASE_URL_FILE=/etc/once/database-url
ONCE_TZ=Europe/Berlin
*/5 * * * * once run -q --job invoices --every day -- /opt/bill.sh
""",
    ),
    (
        "A Kubernetes CronJob container, with `concurrencyPolicy: Forbid` as a second line of "
        "defence and `terminationGracePeriodSeconds` above `--kill-after`; the owner is the pod, "
        "and the ledger's URL comes from a Secret:",
        """\
command: ["once", "run", "--job", "report", "--every", "hour",
          "--kill-after", "20s", "--", "/app/report"]
env:
  - name: ONCE_OWNER
    valueFrom: {fieldRef: {fieldPath: metadata.name}}
  - name: ONCE_DATABASE_URL
    valueFrom: {secretKeyRef: {name: once-ledger, key: url}}
""",
    ),
    (
        "A backfill: list the October days that have no done row, then run them, oldest first. "
        "Several machines may run the same catch-up; they split the days between them:",
        """\
once catchup --job invoices --every day --tz Europe/Berlin \\
    --since 2026-10-01 --until 2026-10-31 --dry-run
once catchup --job invoices --every day --tz Europe/Berlin \\
    --since 2026-10-01 --until 2026-10-31 -- /opt/bill.sh
""",
    ),
    (
        "A new sync job that should start from a chosen watermark: seed it before its first "
        "run (a job that has never run is refused without its schedule, so that a misspelt "
        "name is not set silently):",
        """\
once state sync-orders --set '2026-01-01 00:00:00+00|0' --every 5m
""",
    ),
    (
        "Monitoring from cron: mail when a due period of any job has no done row an hour after "
        "it ended, or a heartbeat has gone stale:",
        """\
PATH=/usr/local/bin:/usr/bin:/bin
MAILTO=ops@example.com
*/15 * * * * once check --grace 1h >/dev/null || echo "failed: $?"
""",
    ),
    (
        "The fleet's dashboard and a Prometheus endpoint, on every interface, behind a token "
        "(`curl -H \"Authorization: Bearer $(cat token)\" http://host:8321/metrics`):",
        """\
once serve --listen 0.0.0.0:8321 --token-file /etc/once/serve-token
""",
    ),
    (
        "An application's scheduler, started on every replica and run by one at a time: when "
        "the leader stops, a candidate takes over within about a second, and within the lease "
        "(15 s) when it dies:",
        """\
once lead --name beat -- celery -A app beat
""",
    ),
    (
        "The hourly periods of a night on which New York's clocks fall back, with their keys:",
        """\
once periods --every hour --tz America/New_York \\
    --from 2026-11-01T00:00 --to 2026-11-01T03:00
""",
    ),
)

SEE_ALSO = (("cron", "8"), ("crontab", "5"), ("flock", "1"), ("systemd.timer", "5"))


# -- examples, as the tests check them -------------------------------------------------------


def example_commands() -> Iterator[list[str]]:
    """Every `once ...` command line in EXAMPLES, split into argv (without `once`)."""
    for _, block in EXAMPLES:
        text = block.replace("\\\n", " ")
        for row in text.splitlines():
            listed = re.search(r'\[\s*"once".*', row)
            if listed:
                joined = _json_list(text, row)
                yield joined[1:]
                continue
            if not re.search(r"(^|\s)once\s", row):
                continue
            words = shlex.split(row)
            words = words[words.index("once") + 1 :]
            for stop in ("||", "&&", ";", "|"):
                if stop in words:
                    words = words[: words.index(stop)]
            yield [w for w in words if not w.startswith((">", "2>"))]


def _json_list(text: str, row: str) -> list[str]:
    """A YAML flow list written as JSON, which may go on over the following lines."""
    start = text.index(row)
    opening = text.index("[", start)
    closing = text.index("]", opening)
    value = json.loads(text[opening : closing + 1])
    return [str(v) for v in value]


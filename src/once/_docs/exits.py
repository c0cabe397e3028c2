"""The exit statuses of every command, as data: the man page's EXIT STATUS section and
docs/reference/exit-statuses.md are laid out from it (once._docs.man, markdown). The words
use the roff engine's markup, as once._docs.prose's do. Imports nothing.
"""

from __future__ import annotations

# (status, meaning) per command; `once run`'s table is the contract's.
EXIT_STATUS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "once run",
        "",
        (
            ("the command's status", "The command ran; 128+<N> when signal <N> ended it. "
                                     "After a SIGTERM, SIGINT or SIGHUP that `once` forwarded, "
                                     "still the command's own (0 for one that caught it and "
                                     "exited 0), recorded `interrupted`."),
            (
                "0",
                "Skipped: the period is done, a live attempt holds it, or its attempts are used "
                "up (the last also warns on stderr). `--skipped-exit-code` changes this status.",
            ),
            ("1", "The command exited 0 but left a `--state` watermark that cannot be stored: "
                  "recorded `failed`."),
            ("2", "Usage: a bad option, period spec, zone, duration or URL, a value the "
                  "ledger cannot hold (see LIMITS), or no ledger named in a container (FILES); "
                  "nothing was sent to the ledger."),
            (
                "70",
                "Fenced out: `once` could no longer prove it held the claim while the command "
                "ran (another attempt took it over, a failover lost the claim, the ledger "
                "stayed unreachable past the owner's deadline, or the final write matched no "
                "row), or already when its claim was answered, after the owner's deadline (a "
                "claim that waited longer than `--stale-after`). The command was stopped, or "
                "never started, and `once_runs` was not written.",
            ),
            (
                "75",
                "The ledger could not be reached, or answered with an error, before the claim "
                "was decided (a ledger whose schema is newer than this once's among them, a "
                "PostgreSQL standby, and a claim that no synchronous standby confirmed in "
                "time, which is then released): nothing was run. Also when the command "
                "finished but its result could not be written: the ledger stayed unreachable "
                "(or kept failing the write) until the final write's bound, or refused it "
                "with an error no retry cures, at once; the `once:` line says which. The row "
                "is then left to go stale, and the period is run again, at most 3 times "
                "`--max-attempts` attempts in all; a write that got no answer may still land "
                "after `once` has ended (a server that was only slow, a lock let go), and then "
                "the period stays done (the line says so: `as far as once knows`).",
            ),
            ("124", "`--timeout` ended the command."),
            ("128+<N>", "`--all-shards` stopped by signal <N> (SIGTERM, SIGINT, SIGHUP) when "
                        "no shard that it did not interrupt had failed: the shard in hand got "
                        "the signal, no later shard was claimed."),
        ),
    ),
    (
        "once catchup",
        "0 when every period it tried is done or was skipped; otherwise the status "
        "`once run` would have given for the first period that did not succeed "
        "(without `--keep-going` it stops there). 2 and 75 as for `once run`. A SIGTERM, "
        "SIGINT or SIGHUP stops it after the period in hand, which gets the signal: then the "
        "status of the first period that failed without it, else 128+<N> (143 for SIGTERM).",
        (),
    ),
    (
        "once rerun",
        "As `once run`, and:",
        (("69", "Refused: a live attempt holds the period, or, for a job of `--no-overlap`, "
                "another period of it; the `once:` line names it. Nothing was run, and "
                "nothing makes it up later: run it again once that attempt has ended."),),
    ),
    (
        "once check",
        "The highest status that applies:",
        (
            ("0", "Every due period has a done row."),
            ("1", "A running attempt's heartbeat is stale."),
            (
                "2",
                "A due period is missing or failed, or a period has failed with no attempts "
                "left, or a <JOB> named has never run. A period <P> of a job with lag <L> is "
                "due once the end of period <P>+<L> plus `--grace` has passed; a live attempt "
                "of a due period that has run longer than the period lasts, plus `--grace`, is "
                "overrun (a hung or slow run; a rerun or a catch-up of an old period is not, "
                "as it starts). Also a lead name of `once lead` that has had no leader for "
                "longer than its `--lease` plus `--grace`, counted from when the last "
                "holder's lease ran out or was released (leaderless: no candidate took over); "
                "a name retired with `once lead --retire` is not watched.",
            ),
            (
                "3",
                "UNKNOWN: no job (nor lead name) has run in the ledger at all, most often "
                "because it is not "
                "the ledger the jobs use (`ONCE_DATABASE_URL` set in a shell but not in the "
                "crontab); or the ledger read is a PostgreSQL standby further behind its "
                "primary than `--grace` (at least a second), or by a time it cannot tell; or the "
                "server cannot answer for the ledger, a Galera node outside the Primary "
                "component (`not-ready`). "
                "The line names the ledger read.",
            ),
            (
                "75",
                "The ledger could not be read: the server unreachable, or answering with an "
                "error, or a table of the ledger locked by another session (`LOCK TABLE`, DDL "
                "in an open transaction) for longer than 60 s, every report's bound. Nothing "
                "was checked: no finding is printed, the `once:` line on stderr says why.",
            ),
        ),
    ),
    (
        "once lead",
        "",
        (
            ("the command's status", "The command ran while `once lead` led, and ended "
                                     "(128+<N> when signal <N> ended it, a SIGTERM that `once "
                                     "lead` received and forwarded among them; 137 when it had "
                                     "to be killed; 126 or 127 when it could not be started); "
                                     "the lease was then released (where the ledger could not "
                                     "be written, it runs out by itself)."),
            ("128+<N>", "A SIGTERM, SIGINT or SIGHUP that came once the lease was released, "
                        "as `once lead` exited: it died of it (its last line tells the "
                        "command's status). One that comes after the command's end but before "
                        "the release leaves the command's status."),
            ("0", "Stopped by SIGTERM, SIGINT or SIGHUP while a candidate: nothing was run."),
            ("2", "Usage: a bad option or name, a `--lease` outside 3s to 1 year or a "
                  "`--kill-after` that does not fit it, no COMMAND (or one with `--retire`), "
                  "`--retire` of a name the ledger does not have, or no ledger named in a "
                  "container (FILES); nothing was sent to the ledger."),
            ("69", "`--retire` refused: a leader holds the name."),
            ("70", "The lease was lost while the command ran: another holder took it, or no "
                   "renewal succeeded in time (the ledger unreachable, `once lead` stopped "
                   "past its deadline). The command was stopped: SIGTERM `--kill-after` "
                   "before the deadline (at once when the lease was found taken), SIGKILL at "
                   "it. With `--rejoin` it stands as a candidate again instead."),
            ("75", "`--retire` could not reach the ledger. An unreachable ledger never ends "
                   "`once lead` otherwise: a candidate keeps trying (every 5 s at most), a "
                   "leader loses its lease (70)."),
        ),
    ),
    (
        "once serve",
        "0 when SIGTERM or SIGINT stopped it; 2 on a usage error, an address it cannot listen "
        "on included. An unreachable ledger never stops it: its pages say so and `/healthz` "
        "answers 503.",
        (),
    ),
    (
        "other commands",
        "0 on success, 2 on a usage error, 75 when the ledger could not be "
        "reached or answered with an error; a table of the ledger that another session "
        "keeps locked (`LOCK TABLE`, DDL in an open transaction) is waited for 60 s at "
        "most, then 75 too.",
        (),
    ),
)

EXIT_STATUS_NOTE = """\
Every non-zero status that is not the command's own is explained in one line on standard
error that starts with `once:`. A SIGINT (Ctrl-C) that comes where a command above does not
say what one does (while `once` starts and reads its options, or while a report reads the
ledger) ends `once` with 130: `once: interrupted`; one in Python's own start, the first
hundredths of a second before `once`'s code runs, ends it as Python ends, with a traceback.
A SIGTERM or SIGHUP that comes where no command above says what one does (while `once`
starts, after the result is written) ends `once` as it ends any program, without a line: a
shell shows 128+N. As PID 1 of a container, which the kernel spares the signals it has no
handler for, `once` exits 128+N then, the same.
"""

"""The `once` command: a thin click layer over once.run.flow, once.ledger and once.periods.
This module holds the group, `once run` and the entry point; the options every command
shares are once.cli.options', and the other commands are once.cli.runs', reports',
ledger_commands' and lead's, which load_commands adds to the group.

Every error a user can cause is one `once:` line on stderr with a documented status:
2 for usage (bad option, spec, zone, duration, URL), 75 when the ledger cannot be reached.
Reports (status, history, check, metrics) import SQLAlchemy and rich inside their commands
only, so that `once run` never pays for them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

import click

from once import __version__, limits
from once.cli.complete import job_names
from once.cli.options import (
    command_argument,
    kill_after_for,
    ledger_for,
    ledger_options,
    liveness_options,
    notifier,
    notify_options,
    open_target,
    schedule_options,
    verbosity,
    verbosity_options,
)
from once.limits import InputError
from once.periods import SpecError

# 128 + SIGINT: a Ctrl-C that no command took as a stop of its own (once.cli answers one
# that comes outside click's handling of it alike).
INTERRUPTED = 130

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "ONCE",
           "max_content_width": 100}


class OnceGroup(click.Group):
    """Builds `once run` at import and every other command when first asked for: building
    click commands costs milliseconds, and `once run` pays on every cron fire."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            load_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        load_commands()
        return super().list_commands(ctx)


def load_commands() -> Mapping[str, click.Command]:
    """Add every other command to `cli` (idempotent: the same objects again); return them all
    by name. Their modules define them and import the shared options (once.cli.options),
    never this module."""
    from once.cli import lead, ledger_commands, reports, runs

    for command in (*runs.COMMANDS, *reports.COMMANDS, *ledger_commands.COMMANDS, lead.lead):
        cli.add_command(command)
    return cli.commands


@click.group(cls=OnceGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="once")
def cli() -> None:
    """Run a scheduled command exactly once per period, however many machines fire it."""


# -- once run --------------------------------------------------------------------------------


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--job", required=True, metavar="NAME", shell_complete=job_names,
              help="Job name (1-200 printable characters, no whitespace; with --namespace, "
                   "NS:JOB at most 255).")
@schedule_options
@ledger_options
@liveness_options
@click.option("--catchup", default=0, show_default=True, type=click.IntRange(0, limits.CATCHUP_MAX),
              metavar="N",
              help="First make up every one of the N periods before this one that needs a "
                   "run (missing, stale, or failed with attempts left), oldest first.")
@click.option("--skipped-exit-code", default=0, show_default=True,
              type=click.IntRange(0, 255), metavar="N",
              help="Exit status when the period is skipped.")
@click.option("--all-shards", is_flag=True,
              help="With --shards: keep claiming shards of the period until none is left.")
@click.option("--require-same-command", is_flag=True,
              help="Refuse (exit 2) to run under a command other than the one the job's "
                   "latest attempt ran.")
@notify_options
@verbosity_options
@command_argument
def run(job: str, every: str | None, cron: str | None, tz: str, db: str | None,
        db_password_file: str | None, namespace: str | None, lag: int, stale_after: float,
        kill_after: float | None, timeout: float | None, max_attempts: int, state: bool,
        shards: int, version_tag: str | None, no_overlap: bool, output_tail: int,
        max_clock_skew: float, catchup: int, skipped_exit_code: int, all_shards: bool,
        require_same_command: bool, ping: str | None, ping_url_file: str | None,
        ping_on_skip: bool, ping_exit_status: bool, ping_body_tail: int | None,
        on_success: str | None, on_failure: str | None, on_skip: str | None, verbose: int,
        quiet: bool, log_format: str, command: tuple[str, ...]) -> int:
    """Claim the current period of JOB and, if this call wins it, run COMMAND.

    COMMAND runs directly (no shell) with ONCE_JOB, ONCE_PERIOD, ONCE_PERIOD_START,
    ONCE_PERIOD_END, ONCE_PERIOD_TZ, ONCE_ATTEMPT and ONCE_FENCE in its environment. once exits
    with the command's status (128+N for signal N), 0 when the period is done or held
    (--skipped-exit-code), 2 on a usage error, 70 when the claim was lost while the command
    ran, 75 when the ledger could not be reached, 124 on --timeout.
    """
    from once.run import flow
    from once.schedules import schedule as make_schedule

    sched = make_schedule(every, cron, tz)
    the_job = flow.claiming_job(job, namespace, sched, lag, max_attempts, stale_after, shards,
                                no_overlap)
    target = open_target(db, db_password_file)
    settings = flow.Settings(kill_after=kill_after_for(kill_after, stale_after),
                             timeout=timeout, skipped_exit_code=skipped_exit_code,
                             verbosity=verbosity(verbose, quiet), log_format=log_format,
                             state=state,
                             command_hash=flow.command_hash(command, version_tag),
                             require_same_command=require_same_command,
                             max_clock_skew=max_clock_skew, output_tail=output_tail,
                             notifier=notifier(ping, ping_url_file, ping_on_skip,
                                               ping_exit_status, on_success, on_failure,
                                               on_skip, ping_body_tail, output_tail))
    period = flow.current_period(sched, lag)
    with ledger_for(target, stale_after, quiet, log_format) as ledger:
        if catchup:
            from once.run.backfill import catch_up_then_run  # only with --catchup

            return catch_up_then_run(ledger, the_job, sched, period, command, settings,
                                     catchup, all_shards)
        return flow.run_shards(ledger, the_job, period, command, settings, all_shards).status


# -- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run the CLI; turn every error into one `once:` line and its documented status.
    What it shows is scrubbed of the ledger's secrets (once.secrets)."""
    from once import secrets

    if argv is None:
        _collect_less()
    with secrets.kept(for_the_process=argv is None):
        status = _status(argv)
    code = status if isinstance(status, int) else 0
    if argv is None:  # the `once` script, not a caller in its own process
        _end_past_threads(code)
    sys.exit(code)


# Allocations between two runs of the cycle collector in the `once` process (CPython's: 700).
GC_THRESHOLD = 50_000


def _collect_less() -> None:
    """A read of a large fleet (`once serve`'s pages, `once status`, `once metrics`) makes
    hundreds of thousands of objects that reference counting frees: at CPython's threshold
    the cycle collector ran hundreds of times a read, walking them again each time (a sixth
    of `/api/status`'s CPU over 10,000 jobs; `once metrics` over 1M rows 0.21 s of CPU
    against 0.23). once makes next to no cycles: they wait longer."""
    import gc

    gc.set_threshold(GC_THRESHOLD, 10, 10)


def _status(argv: Sequence[str] | None) -> object:
    """The command's exit status, its errors told as one `once:` line each."""
    from once.ledger import LedgerError

    try:
        status = cli.main(args=list(argv) if argv is not None else None, prog_name="once",
                          standalone_mode=False)
    except click.exceptions.Abort:  # a KeyboardInterrupt (SIGINT) nothing took as a stop
        status = _fail("interrupted", INTERRUPTED)
    except click.UsageError as exc:
        status = _fail(exc.format_message(), 2)
    except click.ClickException as exc:
        status = _fail(exc.format_message(), exc.exit_code)
    except (SpecError, InputError) as exc:  # UrlError is an InputError
        status = _fail(str(exc), 2)
    except OverflowError as exc:  # a period past year 9999 or before year 1: nothing ran
        status = _fail(f"out of range: {exc} (periods exist from year 1 to 9999)", 2)
    except LedgerError as exc:
        status = _fail(str(exc), 75)
    return status


def _end_past_threads(code: int) -> None:
    """With a thread of its own still alive (after any claim: the final write's worker, the
    PostgreSQL watchdog; a thread left blocked in a dead server's read, which can crash the
    interpreter's teardown after the last line: SIGSEGV, seen on MariaDB with connections
    killed), once ends here, as soon as what it printed is out. Nothing of once's needs the
    teardown: ledgers are closed, commits are synchronous, temporary files are removed."""
    launch = sys.modules.get("once.run.launch")  # a guard was started: its watcher ends
    if launch is not None:
        launch.reap_watchers()
    threading = sys.modules.get("threading")  # not imported: no thread was started
    if threading is None or threading.active_count() <= 1:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: started with that descriptor closed
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: what was printed is lost either way
            pass
    os._exit(code)


def _fail(message: str, status: int) -> int:
    from once.escape import shown
    from once.secrets import scrub, scrub_line

    # One line of printable text, whatever was typed; scrubbed before the blanks are joined
    # (a password may hold two spaces or a tab) and after the escapes (it may hold a control).
    line = shown(" ".join(scrub(message).split()))
    print(scrub_line(f"once: {line}"), file=sys.stderr)
    return status

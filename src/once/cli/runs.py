"""The commands that claim and run periods besides `once run`: `once catchup`, `once rerun`,
and `once state` (the watermark a --state run carries), added to the group by
once.cli.main.load_commands when any command but `run` is named, listed or documented:
building click commands costs milliseconds, which `once run` never pays.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click

from once import limits
from once.cli.complete import job_names
from once.cli.options import (
    DURATION,
    clock_option,
    command_argument,
    kill_after_for,
    kill_after_option,
    ledger_for,
    ledger_options,
    liveness_options,
    open_target,
    output_tail_option,
    schedule_options,
    verbosity,
    verbosity_options,
)
from once.escape import shown
from once.messages import say
from once.secrets import scrub


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--job", required=True, metavar="NAME", shell_complete=job_names,
              help="Job name.")
@schedule_options
@ledger_options
@click.option("--since", metavar="P", help="First period: a key, a date or an ISO instant "
              "[default: the job's first period].")
@click.option("--until", metavar="P", help="Last period, included [default: the period "
              "once run would claim now].")
@click.option("--max", "max_count", type=click.IntRange(min=1), metavar="N",
              envvar="ONCE_CATCHUP_MAX",
              help="Run at most the N oldest periods that need a run.")
@click.option("--keep-going", is_flag=True, help="Go on after a failed period; exit with the "
              "first failure's status.")
@click.option("--dry-run", is_flag=True, help="List the periods that would run; run nothing.")
@click.option("--allow-future", is_flag=True, help="Let --until name a period that has not "
              "begun (refused otherwise: exit 2).")
@liveness_options
@verbosity_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARG]...")
def catchup(job: str, every: str | None, cron: str | None, tz: str, db: str | None,
            db_password_file: str | None, namespace: str | None, since: str | None,
            until: str | None, max_count: int | None, keep_going: bool, dry_run: bool,
            allow_future: bool,
            lag: int, stale_after: float, kill_after: float | None, timeout: float | None,
            max_attempts: int, state: bool, shards: int, version_tag: str | None,
            no_overlap: bool, output_tail: int, max_clock_skew: float, verbose: int, quiet: bool,
            log_format: str, command: tuple[str, ...]) -> int:
    """Run COMMAND for every period in [--since, --until] that needs a run, oldest first:
    missing, stale, or failed with attempts left (what once check reports, but a period
    failed with no attempts left, which takes once rerun).

    Each period is claimed exactly as once run claims it, so catch-ups on several machines
    split the work and never run a period twice. Stops at the first failure with its status
    unless --keep-going. Without --every or --cron, the job's schedule, zone, --lag and
    --shards are the ledger's (as its latest claim left them).
    """
    from once.periods import iso
    from once.run import flow
    from once.schedules import schedule as make_schedule

    if not command and not dry_run:
        raise click.UsageError("no command given: once catchup ... -- COMMAND [ARG]...")
    grace = kill_after_for(kill_after, stale_after)
    target = open_target(db, db_password_file)
    with ledger_for(target, stale_after, quiet, log_format) as ledger:
        if every is None and cron is None:  # as the job's latest claim left it
            sched, lag, shards, no_overlap = _stored_schedule(ledger, job, namespace, tz, lag,
                                                              shards, no_overlap)
        else:
            sched = make_schedule(every, cron, tz)
        the_job = flow.claiming_job(job, namespace, sched, lag, max_attempts, stale_after,
                                    shards, no_overlap)
        first = sched.resolve(since) if since else None
        last = sched.resolve(until) if until else flow.current_period(sched, lag)
        if not allow_future:
            flow.refuse_future(last, "--until")
        try:
            todo = flow.missing_periods(ledger, the_job, sched, first, last, max_count,
                                        held=not dry_run)
        except flow.NothingToResume as exc:
            raise click.UsageError(str(exc)) from None
        if dry_run:
            for period in todo:
                click.echo(scrub(f"{period.key} {iso(period.start)} {iso(period.end)}"))
            return 0
        settings = flow.Settings(kill_after=grace, timeout=timeout,
                                 verbosity=verbosity(verbose, quiet), log_format=log_format,
                                 state=state, max_clock_skew=max_clock_skew,
                                 output_tail=output_tail,
                                 command_hash=flow.command_hash(command, version_tag))
        from once.run import backfill

        return backfill.catch_up(ledger, the_job, todo, command, settings, keep_going,
                                 _progress(quiet, log_format))


def _stored_schedule(ledger: Any, job: str, namespace: str | None, tz: str, lag: int,
                     shards: int, no_overlap: bool) -> tuple[Any, int, int, bool]:
    """A catch-up with neither --every nor --cron: the job's schedule and zone as the ledger
    holds them, with its --lag, --shards and --no-overlap where they were not given (they
    say which periods are due and how they are keyed). A --tz that differs from the job's
    zone is refused: it would name other periods."""
    from once import stored

    name = limits.stored_name(job, namespace)
    found = ledger.job_info(name)
    if found is None:
        raise click.UsageError(f"unknown job {name!r}: it has never run in "
                               f"{ledger.target.redacted}, so give its schedule: --every "
                               f"SPEC or --cron EXPR")
    ctx = click.get_current_context()

    def given(option: str) -> bool:
        return ctx.get_parameter_source(option) not in (click.core.ParameterSource.DEFAULT,
                                                         None)

    if given("tz") and tz != found.tz:
        raise click.UsageError(f"--tz {tz} differs from the zone job {name!r} runs in "
                               f"({found.tz}): leave --tz out, or give --every/--cron with it")
    sched = stored.job_schedule(found.kind, found.schedule, found.tz)
    return (sched, lag if given("lag") else found.lag,
            shards if given("shards") else found.shards,
            no_overlap or found.no_overlap)


def _progress(quiet: bool, log_format: str = "text") -> Any:
    """A bar between the periods on a terminal (once.cli.progress); plain (or JSON) lines
    elsewhere; no line but errors with --quiet."""
    from once.run import backfill

    if not quiet and sys.stderr is not None and sys.stderr.isatty() and log_format == "text":
        from once.cli.progress import BarProgress

        return BarProgress()
    return backfill.Progress(quiet)


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--job", required=True, metavar="NAME", shell_complete=job_names,
              help="Job name.")
@click.option("--period", "key", required=True, metavar="P", envvar="ONCE_RERUN_PERIOD",
              help="The period: its key, a date or an instant, as catchup --since takes "
                   "them (KEY#i: shard i).")
@click.option("--reason", metavar="TEXT", help="Why, kept in the history.")
@click.option("--allow-future", is_flag=True, help="Run a period that has not begun (refused "
              "otherwise: exit 2).")
@ledger_options
@kill_after_option
@click.option("--timeout", type=DURATION, help="SIGTERM the command when it runs longer.")
@click.option("--version-tag", metavar="TEXT",
              help="Counts as part of the command's fingerprint (see once run).")
@output_tail_option
@clock_option
@verbosity_options
@command_argument
def rerun(job: str, key: str, reason: str | None, allow_future: bool, db: str | None,
          db_password_file: str | None, namespace: str | None, kill_after: float | None,
          timeout: float | None, version_tag: str | None, output_tail: int,
          max_clock_skew: float, verbose: int, quiet: bool, log_format: str,
          command: tuple[str, ...]) -> int:
    """Run a done or failed period again, as a new attempt with a new fence.

    The job's schedule and zone come from the ledger (as its latest once run left them).
    Refused, with status 69, while a live attempt holds the period (or, with --no-overlap,
    another period of the job).
    """
    from once import stored
    from once.run import flow

    name = limits.stored_name(job, namespace)
    if reason is not None:
        limits.reason(reason)
    flow.default_owner()  # a bad ONCE_OWNER: refused before anything is sent
    target = open_target(db, db_password_file)
    with ledger_for(target, quiet=quiet, log_format=log_format) as ledger:
        the_job = ledger.job_info(name)
        if the_job is None:
            raise click.UsageError(f"unknown job {name!r}: it has never run in "
                                   f"{target.redacted}")
        sched = stored.job_schedule(the_job.kind, the_job.schedule, the_job.tz)
        base, shard = stored.parse(key, name, the_job.shards)
        period = sched.resolve(base)
        key = stored.shard_key(period.key, shard)
        if not allow_future:
            flow.refuse_future(period, "--period")
        # The grace must fit the job's --stale-after, which the ledger holds.
        settings = flow.Settings(kill_after=kill_after_for(kill_after, the_job.stale_after),
                                 timeout=timeout, verbosity=verbosity(verbose, quiet),
                                 log_format=log_format, max_clock_skew=max_clock_skew,
                                 output_tail=output_tail,
                                 command_hash=flow.command_hash(command, version_tag))
        result = flow.rerun_period(ledger, the_job, period, command, settings,
                                   reason or "once rerun", shard)
    return result.status  # flow.EXIT_REFUSED (69) while a live attempt holds the way


# -- once state -----------------------------------------------------------------------------


@click.command()
@click.argument("job", metavar="JOB", shell_complete=job_names)
@ledger_options
@click.option("--set", "value", metavar="VALUE", envvar="ONCE_STATE_SET",
              help="Set the watermark deliberately (recorded in the history).")
@schedule_options
def state(job: str, db: str | None, db_password_file: str | None, namespace: str | None,
          value: str | None, every: str | None, cron: str | None, tz: str) -> int:
    """Print the watermark of JOB (what its last successful --state run left), or set it.

    A job that has never run is refused, so that a misspelt name is not set silently; to seed
    its watermark before its first run, give --set with the job's schedule (--every or --cron,
    and --tz), which registers the job until that run records its own."""
    from once.periods import iso
    from once.run import flow

    name = limits.stored_name(job, namespace)
    owner = flow.default_owner()
    seed = None
    if every or cron:
        if value is None:
            raise click.UsageError("--every and --cron go with --set: they seed the watermark "
                                   "of a job that has never run")
        seed = seed_job(name, every, cron, tz)
    if value is not None:
        limits.state(value)
    target = open_target(db, db_password_file)
    with ledger_for(target) as ledger:
        known = ledger.job_info(name) is not None
        if not known and seed is None:
            hint = (" (give its schedule, --every or --cron, to seed its watermark before its "
                    "first run)" if value is not None else "")
            raise click.UsageError(f"unknown job {name!r}: it has never run in "
                                   f"{target.redacted}{hint}")
        if value is None:
            current, _version = ledger.state(name)
            if current is not None:
                # As stored in a pipe (a script's data); escaped on a terminal, which would
                # obey an escape sequence in it.
                click.echo(scrub(shown(current) if sys.stdout.isatty() else current))
            return 0
        if known or seed is None:  # a job that ran keeps the schedule it ran with
            version = ledger.set_state(name, value, owner)
            say(f"{name}: state set (version {version})")
            return 0
        job_row, first = seed
        version = ledger.set_state(name, value, owner, job_row, first)
    say(f"{name}: state set (version {version}); the job is registered until its first "
        f"run, expected from {iso(first)}")
    return 0


def seed_job(name: str, every: str | None, cron: str | None,
             tz: str) -> tuple[Any, datetime]:
    """The job row `once state --set` registers for a job that has never run, and the start
    of its first expected period: the one after the current, so that no report finds a
    period missing before the job's first fire could have run it (that fire's claim moves the
    start back to its own period)."""
    from once.ledger import Job
    from once.run import flow
    from once.schedules import schedule as make_schedule

    sched = make_schedule(every, cron, tz)
    limits.schedule(sched.spec, sched.tz_name)
    job_row = Job(name, sched.kind, sched.spec, sched.tz_name, 0, 3, 300.0)
    first = sched.next(flow.current_period(sched, 0)).start
    return job_row, first


COMMANDS = (catchup, rerun, state)

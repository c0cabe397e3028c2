"""The commands other than `once run`, registered on `once.cli.main.cli` when first asked for.

`once run` is on the hot path of every cron fire and building click commands costs
milliseconds, so cli.py builds only `run` at import; the group loads this module when any
other command is named, listed or documented.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click

from once import limits
from once.cli.complete import job_names
from once.cli.main import (
    DURATION,
    DURATION_OR_OFF,
    Duration,
    cli,
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
from once.secrets import scrub, scrub_json


@cli.command(context_settings={"allow_interspersed_args": False})
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

    if not quiet and sys.stderr.isatty() and log_format == "text":
        from once.cli.progress import BarProgress

        return BarProgress()
    return backfill.Progress(quiet)


@cli.command(context_settings={"allow_interspersed_args": False})
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



# -- once periods ----------------------------------------------------------------------------


@cli.command()
@schedule_options
@click.option("--from", "start", required=True, metavar="T", envvar="ONCE_PERIODS_FROM",
              help="ISO 8601 datetime, date or period key.")
@click.option("--to", "end", required=True, metavar="T", envvar="ONCE_PERIODS_TO",
              help="ISO 8601 datetime, date or period key (exclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def periods(every: str | None, cron: str | None, tz: str, start: str, end: str,
            as_json: bool) -> None:
    """List the periods that overlap [--from, --to): one `KEY START END` a line."""
    from once.periods import iso
    from once.schedules import schedule as make_schedule

    sched = make_schedule(every, cron, tz)
    first, last = sched.parse_instant(start), sched.parse_instant(end)
    found = [{"key": p.key, "start": iso(p.start), "end": iso(p.end)}
             for p in sched.overlapping(first, last)]
    if as_json:
        import json

        click.echo(scrub_json(json.dumps(found, indent=2)))
    else:
        for p in found:
            click.echo(scrub(f"{p['key']} {p['start']} {p['end']}"))


# -- once state -----------------------------------------------------------------------------


@cli.command()
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


# -- reports: status, history, check, metrics (once.report; SQLAlchemy and rich live there) --


class Grace(Duration):
    """A duration that may also be 0 (no grace)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if str(value).strip() in ("0", "0s", "0.0"):
            return 0.0
        return super().convert(value, param, ctx)


GRACE = Grace()


@cli.command()
@click.argument("jobs", nargs=-1, metavar="[JOB]...", shell_complete=job_names)
@ledger_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object a job.")
@click.option("--timeline", is_flag=True, help="Draw each job's recent periods: done, failed, "
              "missing, running.")
@click.option("--last", type=click.IntRange(min=1), metavar="N",
              help="With --timeline: draw the N latest periods [default: about 13 weeks of "
                   "days, 7 days of hours, 6 hours of minutes, 60 other periods].")
@click.option("--wide", is_flag=True, help="On a terminal, every column in full, however "
              "wide (a pipe always gets them).")
@click.option("--leads", is_flag=True, help="Show the lead names (once lead) alone; with "
              "--json, print their array.")
def status(jobs: tuple[str, ...], db: str | None, db_password_file: str | None,
           namespace: str | None, as_json: bool, timeline: bool, last: int | None,
           wide: bool, leads: bool) -> int:
    """Show each job: schedule, last done period, what runs now, failed and missing periods,
    whether the current period is done (NOW), and the next.

    Missing periods are due (the period after it, plus --lag periods, has ended) but have no
    done row, no failed row and no live attempt, from the job's first claim on. On a
    terminal the table fits its width: short times, fewer columns (--wide: all of them).

    Under the jobs, a table of the lead names of once lead: LEADER (who holds it, or how long
    none has), TERM, SINCE (when it took the lease), RENEWED (its last renewal, by the
    database's clock), LEASE and CANDIDATES (waiting). --json prints the jobs alone, as ever;
    --leads --json the lead names. A NAME given is a job's or a lead name.
    """
    from once import report

    if last is not None and not timeline:
        raise click.UsageError("--last goes with --timeline")
    if leads and timeline:
        raise click.UsageError("--timeline draws jobs' periods: it does not go with --leads")
    for job in jobs:
        limits.stored_name(job, namespace)  # a usage error for a bad name
    return report.status(open_target(db, db_password_file), jobs, namespace, as_json,
                         timeline=timeline, last=last, wide=wide, leads_only=leads)


@cli.command()
@click.argument("job", metavar="[JOB]", required=False, shell_complete=job_names)
@ledger_options
@click.option("--limit", type=click.IntRange(min=1), metavar="N",
              help="Show the N latest attempts [default: 50 of a JOB, 20 of the fleet].")
@click.option("--period", "key", metavar="P", help="Only the attempts at this period of JOB: "
              "a key, a date or an instant, as catchup --since takes them.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object an "
              "attempt (with --lead, a term).")
@click.option("--lead", is_flag=True, help="JOB is a lead name (once lead): show its terms, "
              "also where a job has the same name.")
@click.option("--wide", is_flag=True, help="On a terminal, every column in full, however "
              "wide, the last line too (a pipe always gets them).")
def history(job: str | None, db: str | None, db_password_file: str | None,
            namespace: str | None, limit: int | None, key: str | None, as_json: bool,
            lead: bool, wide: bool) -> int:
    """Show every attempt of JOB, newest first: period, attempt, fence, owner, times, outcome,
    exit status, rerun reason and, for a failed attempt, the last line of its output.

    Without JOB, the latest attempts of every job (of --namespace), newest first. Of a lead
    name of once lead (--lead, or a name no job has), its terms, newest first: who held it,
    from when to when (UTC), and how each ended: released, lost (its holder stepped down) or
    expired (its lease ran out unrenewed).

    On a terminal the table fits its width: short times, fewer columns, the last line cut
    short, and a line under it saying what was left out (--wide: all of it; once logs: all an
    attempt said)."""
    from once import report

    target = open_target(db, db_password_file)
    if lead and (job is None or key is not None):
        raise click.UsageError("--lead takes a NAME and no --period: once history --lead NAME")
    if job is None:
        if key is not None:
            raise click.UsageError("--period goes with JOB: once history JOB --period P")
        return report.fleet_history(target, namespace, limit or 20, as_json, wide)
    return report.history(target, limits.stored_name(job, namespace), limit or 50, as_json,
                          period=key, lead=lead, wide=wide)


@cli.command()
@click.argument("job", metavar="JOB", shell_complete=job_names)
@ledger_options
@click.option("--period", "key", metavar="P",
              help="The latest attempt at this period: a key, a date or an instant, as "
                   "catchup --since takes them [default: the job's latest attempt].")
@click.option("--attempt", type=click.IntRange(min=1), metavar="N",
              help="Attempt N (of --period, else of the latest attempt's period).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object: the attempt as "
              "once history --json shows it, with its output.")
def logs(job: str, db: str | None, db_password_file: str | None, namespace: str | None,
         key: str | None, attempt: int | None, as_json: bool) -> int:
    """Print what an attempt of JOB said: the last --output-tail bytes of its stdout and
    stderr, as stored in the ledger when it finished, after a one-line header (period,
    attempt, outcome, exit status, owner, when). Control characters but line breaks and
    tabs are shown escaped (\\u001b)."""
    from once.report import logs as show

    return show.logs(open_target(db, db_password_file), limits.stored_name(job, namespace), key,
                     attempt, as_json)


@cli.command()
@click.argument("jobs", nargs=-1, metavar="[JOB]...", shell_complete=job_names)
@ledger_options
@click.option("--grace", default="0", show_default=True, type=GRACE,
              help="How long after a period is due its done row may still be missing.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def check(jobs: tuple[str, ...], db: str | None, db_password_file: str | None,
          namespace: str | None, grace: float, as_json: bool) -> int:
    """Audit the ledger for monitoring: exit 0 all due periods done, 1 a stale heartbeat,
    2 a due period missing, failed or held by a live attempt that has run longer than the
    period lasts, plus --grace (overrun), a period failed with no attempts left, a lead name
    (once lead) without a leader for longer than its lease plus --grace (leaderless), or a
    JOB named that is neither a job nor a lead name, 3 (UNKNOWN) no job or lead name in the
    ledger at all (the wrong ledger?), a PostgreSQL standby lagging past --grace, or a
    Galera node outside the Primary component.

    Each finding is one line on stdout, `SEVERITY JOB PERIOD PROBLEM (DETAILS)` (a lead
    name's: `CRITICAL NAME - leaderless (DETAILS)`), most severe first; `OK ...` naming the
    ledger when there is none. On a terminal too narrow for a finding, its (DETAILS) go on
    indented lines under it.
    """
    from once import report

    for job in jobs:
        limits.stored_name(job, namespace)  # a usage error for a bad name
    return report.check(open_target(db, db_password_file), jobs, namespace, grace, as_json)


@cli.command()
@ledger_options
def metrics(db: str | None, db_password_file: str | None, namespace: str | None) -> int:
    """Print Prometheus text exposition (for node_exporter's textfile collector)."""
    from once import report

    return report.metrics(open_target(db, db_password_file), namespace)


# -- once serve -----------------------------------------------------------------------------


@cli.command()
@click.option("--listen", default="127.0.0.1:8321", show_default=True, metavar="HOST:PORT",
              help="Where to listen; 0.0.0.0:8321 (or [::]:8321) for every interface.")
@ledger_options
@click.option("--refresh", default="30s", show_default=True, type=DURATION_OR_OFF,
              help="How often the pages reload themselves; 0 or off: never.")
@click.option("--read-timeout", default="5s", show_default=True, type=DURATION,
              help="Give up on a ledger read after this long: the pages say the ledger is "
                   "unreachable and /healthz answers 503.")
@click.option("--token-file", metavar="PATH", type=click.Path(dir_okay=False),
              help="Require the token in PATH (Authorization: Bearer TOKEN, or HTTP Basic "
                   "with it as password) for every page but /healthz.")
@click.option("--allow-host", "allow_host", multiple=True, metavar="NAME",
              help="Also answer requests whose Host header names NAME, without a port (any "
                   "port): a Service's or an ingress's name; .example.com for it and every "
                   "name under it; '*' for any name, which lets a web page read the pages "
                   "through DNS rebinding. Repeatable. Without it only localhost, 127.0.0.1, "
                   "[::1], the --listen host and the address a client reached are answered; "
                   "any other name gets 421.")
def serve(listen: str, db: str | None, db_password_file: str | None, namespace: str | None,
          refresh: float, read_timeout: float, token_file: str | None,
          allow_host: tuple[str, ...]) -> int:
    """Serve the ledger read-only over HTTP: / (every job, problems first, and the lead
    names), /job/NAME, /metrics (as once metrics), /api/status (as once status --json;
    ?limit=N&offset=M for a page), /api/leads (as once status --leads --json) and /healthz.

    Nothing it serves changes the ledger. It answers only requests whose Host header names
    it (--allow-host), so that a web page cannot read it through DNS rebinding. It runs until
    SIGTERM or SIGINT (exit 0).
    """
    from once import serve as server

    try:
        host, port = server.parse_listen(listen)
        hosts = server.Hosts.of(host, allow_host)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    token = _read_token(token_file) if token_file else None
    settings = server.ServeOptions(open_target(db, db_password_file), namespace, refresh,
                                   read_timeout, token, hosts)
    try:
        return server.serve(settings, host, port)
    except OSError as exc:
        raise click.UsageError(f"cannot listen on {listen}: {exc.strerror or exc}") from None


def _read_token(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise click.UsageError(f"cannot read --token-file {path}: {exc.strerror}") from None
    if not token:
        raise click.UsageError(f"--token-file {path} holds no token")
    return token


import once.cli.ledger_commands  # noqa: E402, F401  (schema, prune, doctor: registers on import)

"""The commands that read: `once status`, `history`, `logs`, `check`, `metrics` and `serve`
(their work is once.report's and once.serve's, where SQLAlchemy and rich live), and `once
periods` (a schedule's periods: no ledger at all); added to the group by
once.cli.main.load_commands, never loaded by `once run`.
"""

from __future__ import annotations

from typing import Any

import click

from once import limits
from once.cli.complete import history_names, job_names, job_or_lead_names
from once.cli.options import (
    DURATION,
    DURATION_OR_OFF,
    Duration,
    ledger_options,
    open_target,
    schedule_options,
)
from once.secrets import scrub, scrub_json

# -- once periods ----------------------------------------------------------------------------


@click.command()
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


# -- reports: status, history, check, metrics (once.report; SQLAlchemy and rich live there) --


class Grace(Duration):
    """A duration that may also be 0 (no grace)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if str(value).strip() in ("0", "0s", "0.0"):
            return 0.0
        return super().convert(value, param, ctx)


GRACE = Grace()


@click.command()
@click.argument("jobs", nargs=-1, metavar="[JOB]...",
                shell_complete=job_or_lead_names)
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


@click.command()
@click.argument("job", metavar="[JOB]", required=False,
                shell_complete=history_names)
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
    stored = limits.stored_name(job, namespace, "lead" if lead else "job")
    return report.history(target, stored, limit or 50, as_json, period=key, lead=lead,
                          wide=wide)


@click.command()
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


@click.command()
@click.argument("jobs", nargs=-1, metavar="[JOB]...",
                shell_complete=job_or_lead_names)
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
    Galera node outside the Primary component; 75 when the ledger cannot be read (the
    server unreachable or failing, a table another session locked past 60s): nothing was
    checked.

    Each finding is one line on stdout, `SEVERITY JOB PERIOD PROBLEM (DETAILS)` (a lead
    name's: `CRITICAL NAME - leaderless (DETAILS)`), most severe first; `OK ...` naming the
    ledger when there is none. On a terminal too narrow for a finding, its (DETAILS) go on
    indented lines under it.
    """
    from once import report

    for job in jobs:
        limits.stored_name(job, namespace)  # a usage error for a bad name
    return report.check(open_target(db, db_password_file), jobs, namespace, grace, as_json)


@click.command()
@ledger_options
def metrics(db: str | None, db_password_file: str | None, namespace: str | None) -> int:
    """Print Prometheus text exposition (for node_exporter's textfile collector)."""
    from once import report

    return report.metrics(open_target(db, db_password_file), namespace)


# -- once serve -----------------------------------------------------------------------------


@click.command()
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


COMMANDS = (periods, status, history, logs, check, metrics, serve)

"""The `once` command: a thin click layer over once.core, once.ledger and once.periods.

Every error a user can cause is one `once:` line on stderr with a documented status:
2 for usage (bad option, spec, zone, duration, URL), 75 when the ledger cannot be reached.
Reports (status, history, check, metrics) import SQLAlchemy and rich inside their commands
only, so that `once run` never pays for them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import click

from once import __version__
from once.periods import SpecError

F = TypeVar("F", bound=Callable[..., Any])

JOB_NAME_MAX = 200

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "ONCE",
           "max_content_width": 100}


class Duration(click.ParamType):
    """90, 90s, 5m, 2h, 1d, 1h30m: seconds as a float."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        from once.periods import parse_duration

        try:
            return parse_duration(str(value))
        except SpecError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def ledger_options(func: F) -> F:
    """--db, --db-password-file, --tz and --namespace, each also read from the environment."""
    options = [
        click.option("--db", "db", envvar="ONCE_DATABASE_URL", metavar="URL",
                     help="Ledger URL: sqlite:///PATH, postgresql://…, mysql://… or "
                          "mariadb://… [env: ONCE_DATABASE_URL; default: SQLite file at "
                          "$XDG_STATE_HOME/once/ledger.db]"),
        click.option("--db-password-file", "db_password_file", metavar="PATH",
                     envvar="ONCE_DB_PASSWORD_FILE",
                     type=click.Path(dir_okay=False),
                     help="Read the ledger's password from PATH (keeps it out of crontabs).",),
        click.option("--namespace", envvar="ONCE_NAMESPACE", metavar="NS",
                     help="Store job names as NS:JOB [env: ONCE_NAMESPACE]."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def tz_option(func: F) -> F:
    return click.option("--tz", default="UTC", envvar="ONCE_TZ", metavar="ZONE",
                        show_default=True,
                        help="IANA time zone the periods follow [env: ONCE_TZ].")(func)


def schedule_options(func: F) -> F:
    """--every / --cron / --tz: exactly one of the first two."""
    func = tz_option(func)
    func = click.option("--cron", "cron", metavar="EXPR",
                        help="Periods between the fire times of a five-field cron "
                             "expression.")(func)
    func = click.option("--every", "every", metavar="SPEC",
                        help="Period length: minute, Nm, hour, Nh, day, week, month, quarter, "
                             "year.")(func)
    return func


def command_argument(func: F) -> F:
    return click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED,
                          metavar="-- COMMAND [ARG]...")(func)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="once")
def cli() -> None:
    """Run a scheduled command exactly once per period, however many machines fire it."""


# -- once run --------------------------------------------------------------------------------


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--job", required=True, metavar="NAME", help="Job name (1-200 printable "
              "characters, no whitespace).")
@schedule_options
@ledger_options
@click.option("--lag", default=0, show_default=True, type=click.IntRange(min=0),
              help="Claim the period N periods before the current one.")
@click.option("--stale-after", default="5m", show_default=True, type=DURATION,
              help="A running claim whose heartbeat is older than this may be taken over.")
@click.option("--kill-after", default="10s", show_default=True, type=DURATION,
              help="SIGKILL the command this long after SIGTERM.")
@click.option("--timeout", type=DURATION, help="SIGTERM the command when it runs longer; "
              "exit 124.")
@click.option("--max-attempts", default=3, show_default=True, type=click.IntRange(min=1),
              help="Retry a failed period until this many attempts have run.")
@click.option("--skipped-exit-code", default=0, show_default=True,
              type=click.IntRange(0, 255), help="Exit status when the period is skipped.")
@click.option("-v", "--verbose", count=True, help="Also log claims and skips.")
@click.option("-q", "--quiet", is_flag=True, help="Log only errors.")
@command_argument
def run(job: str, every: str | None, cron: str | None, tz: str, db: str | None,
        db_password_file: str | None, namespace: str | None, lag: int, stale_after: float,
        kill_after: float, timeout: float | None, max_attempts: int, skipped_exit_code: int,
        verbose: int, quiet: bool, command: tuple[str, ...]) -> int:
    """Claim the current period of JOB and, if this call wins it, run COMMAND.

    COMMAND runs directly (no shell) with ONCE_JOB, ONCE_PERIOD, ONCE_PERIOD_START,
    ONCE_PERIOD_END, ONCE_ATTEMPT, ONCE_FENCE and ONCE_TZ in its environment. once exits
    with the command's status (128+N for signal N), 0 when the period is done or held
    (--skipped-exit-code), 2 on a usage error, 70 when the claim was lost while the command
    ran, 75 when the ledger could not be reached, 124 on --timeout.
    """
    from once import core
    from once.periods import schedule as make_schedule

    sched = make_schedule(every, cron, tz)
    the_job = core_job(job, namespace, sched, lag, max_attempts, stale_after)
    target = open_target(db, db_password_file)
    settings = core.Settings(kill_after=kill_after, timeout=timeout,
                             skipped_exit_code=skipped_exit_code,
                             verbosity=core.QUIET if quiet else core.NORMAL + min(verbose, 1))
    period = core.current_period(sched, lag)
    with ledger_for(target, stale_after) as ledger:
        return core.run_period(ledger, the_job, period, command, settings).status


def core_job(name: str, namespace: str | None, sched: Any, lag: int, max_attempts: int,
             stale_after: float) -> Any:
    from once.ledger import Job

    return Job(stored_name(name, namespace), sched.kind, sched.spec, sched.tz_name, lag,
               max_attempts, stale_after)


def stored_name(name: str, namespace: str | None) -> str:
    """The job name as the ledger stores it, NS:JOB with a namespace; usage error if bad."""
    for label, value in (("job name", name), ("namespace", namespace)):
        if value is None:
            continue
        if not value or len(value) > JOB_NAME_MAX or not value.isprintable() or any(
                ch.isspace() for ch in value):
            raise click.UsageError(f"bad {label} {value!r}: use 1 to {JOB_NAME_MAX} printable "
                                   f"characters without whitespace")
    return f"{namespace}:{name}" if namespace else name


def open_target(db: str | None, password_file: str | None) -> Any:
    from once.ledger import default_url, parse_url

    password = None
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as handle:
                password = handle.read().rstrip("\r\n")
        except OSError as exc:
            raise click.UsageError(f"cannot read --db-password-file {password_file}: "
                                   f"{exc.strerror}") from None
    return parse_url(db or default_url(), password)


def ledger_for(target: Any, stale_after: float = 300.0) -> Any:
    from once.ledger import open_ledger

    # Every connect and statement times out well below --stale-after, so nothing hangs.
    return open_ledger(target, timeout=max(1.0, min(10.0, stale_after / 3)))


# -- once periods ----------------------------------------------------------------------------


@cli.command()
@schedule_options
@click.option("--from", "start", required=True, metavar="T",
              help="ISO 8601 datetime, date or period key.")
@click.option("--to", "end", required=True, metavar="T",
              help="ISO 8601 datetime, date or period key (exclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def periods(every: str | None, cron: str | None, tz: str, start: str, end: str,
            as_json: bool) -> None:
    """List the periods that overlap [--from, --to): one `KEY START END` a line."""
    from once.periods import iso
    from once.periods import schedule as make_schedule

    sched = make_schedule(every, cron, tz)
    first, last = sched.parse_instant(start), sched.parse_instant(end)
    found = [{"key": p.key, "start": iso(p.start), "end": iso(p.end)}
             for p in sched.overlapping(first, last)]
    if as_json:
        import json

        click.echo(json.dumps(found, indent=2))
    else:
        for p in found:
            click.echo(f"{p['key']} {p['start']} {p['end']}")


# -- once schema -----------------------------------------------------------------------------


@cli.command()
@ledger_options
@click.option("--sql", is_flag=True, help="Print the DDL for the URL's dialect; touch no "
              "database.")
def schema(db: str | None, db_password_file: str | None, namespace: str | None,
           sql: bool) -> None:
    """Create or upgrade the ledger's tables (they are also created on first use)."""
    from once import schema as ledger_schema

    target = open_target(db, db_password_file)
    if sql:
        for statement in ledger_schema.ddl(target.dialect):
            click.echo(statement + ";\n")
        return
    ledger_schema.ensure(target)
    click.echo(f"once: the ledger's tables are ready in {target.redacted} "
               f"(schema version {ledger_schema.SCHEMA_VERSION})", err=True)


# -- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run the CLI; turn every error into one `once:` line and its documented status."""
    from once.ledger import LedgerError, UrlError

    try:
        status = cli.main(args=list(argv) if argv is not None else None, prog_name="once",
                          standalone_mode=False)
    except click.exceptions.Abort:
        status = 130
    except click.UsageError as exc:
        status = _fail(exc.format_message(), 2)
    except click.ClickException as exc:
        status = _fail(exc.format_message(), exc.exit_code)
    except (SpecError, UrlError) as exc:
        status = _fail(str(exc), 2)
    except LedgerError as exc:
        status = _fail(str(exc), 75)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(message: str, status: int) -> int:
    line = " ".join(message.split())
    print(f"once: {line}", file=sys.stderr)
    return status

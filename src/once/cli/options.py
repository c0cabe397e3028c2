"""The options and helpers every command of `once` shares: the types of its values (DURATION,
SIZE), the option groups (--db and friends, --every/--cron/--tz, the liveness, ping and
verbosity options), and how a command opens its ledger (open_target, ledger_for).

`once run` (once.cli.main) imports this module at its top: it is on the hot path of every
cron fire, so it imports only click, once.limits, once.periods and the completion words (the
rest inside the functions that need it). The other commands' modules import it too, never
once.cli.main, whose group adds their commands (load_commands).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from once import limits
from once.cli.complete import every_specs, zone_names
from once.limits import InputError
from once.periods import SpecError

if TYPE_CHECKING:
    from once.ledger import Ledger, Target
    from once.run.notify import Notifier

F = TypeVar("F", bound=Callable[..., Any])

class Duration(click.ParamType):  # type: ignore[type-arg]  # generic since click 8.5
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


class DurationOrOff(Duration):
    """A duration, or 0 / off: the check it bounds is not made."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if str(value).strip().lower() in ("0", "off"):
            return 0.0
        return super().convert(value, param, ctx)


DURATION_OR_OFF = DurationOrOff()


class Size(click.ParamType):  # type: ignore[type-arg]  # generic since click 8.5
    """16KiB, 10k, 1MiB, 512, 0: bytes, at most 1 MiB (once.limits.size)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        try:
            return limits.size("size", value)
        except InputError as exc:
            self.fail(str(exc), param, ctx)


SIZE = Size()

output_tail_option = click.option(
    "--output-tail", default="16KiB", show_default=True, type=SIZE, metavar="SIZE",
    help="Keep the last SIZE bytes of the command's stdout and stderr (those that are not a "
         "terminal) in the ledger, for once logs, history and pings; 0: capture nothing; at "
         "most 1MiB.")


def ledger_options(func: F) -> F:
    """--db, --db-password-file, --tz and --namespace, each also read from the environment."""
    options = [
        click.option("--db", "db", envvar="ONCE_DATABASE_URL", metavar="URL",
                     help="Ledger: a SQLite file's path (./once.db, /var/lib/once/ledger.db), "
                          "sqlite:///PATH, postgresql://…, mysql://… or "
                          "mariadb://… [env: ONCE_DATABASE_URL, or the file "
                          "ONCE_DATABASE_URL_FILE names; default: the SQLite file "
                          "$XDG_STATE_HOME/once/ledger.db, or ~/.local/state/once/ledger.db "
                          "where XDG_STATE_HOME is unset, as under cron; none in a container "
                          "or a Kubernetes pod, where a command with no ledger named exits "
                          "2]"),
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
                        show_default=True, shell_complete=zone_names,
                        help="IANA time zone the periods follow [env: ONCE_TZ].")(func)


def schedule_options(func: F) -> F:
    """--every / --cron / --tz: exactly one of the first two."""
    func = tz_option(func)
    func = click.option("--cron", "cron", metavar="EXPR",
                        help="Periods between the fire times of a five-field cron "
                             "expression, or a nickname (@hourly, @daily, @weekly, @monthly, "
                             "@yearly).")(func)
    func = click.option("--every", "every", metavar="SPEC", shell_complete=every_specs,
                        help="Period length: minute, Nm, hour, Nh, day, week, month, quarter, "
                             "year.")(func)
    return func


def command_argument(func: F) -> F:
    return click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED,
                          metavar="-- COMMAND [ARG]...")(func)


def clock_option(func: F) -> F:
    """--max-clock-skew, for every command that claims (run, catchup, rerun)."""
    return click.option(
        "--max-clock-skew", default="1m", show_default=True, type=DURATION_OR_OFF,
        help="Refuse to claim (exit 75) when the database's clock and this host's disagree "
             "by more than this: the period comes from this host's clock. 0 or off: never "
             "check. "
             "A SQLite ledger has no clock of its own: not checked there.")(func)


kill_after_option = click.option(
    "--kill-after", type=DURATION, show_default="10s, or a third of --stale-after if less",
    help="SIGKILL the command this long after SIGTERM; at most a third of --stale-after "
         "(the command is dead by the lease's deadline).")


def kill_after_for(kill_after: float | None, stale_after: float) -> float:
    """--kill-after as given, a usage error when it does not fit --stale-after; else the
    default, which the wrapper shortens to fit."""
    from once.deadlines import DEFAULT_KILL_AFTER, kill_after_problem

    if kill_after is None:
        return DEFAULT_KILL_AFTER
    problem = kill_after_problem(kill_after, stale_after)
    if problem:
        raise click.UsageError(problem)
    return kill_after


def liveness_options(func: F) -> F:
    """The options `once run` shares with `once catchup`."""
    options = [
        click.option("--lag", default=0, show_default=True,
                     type=click.IntRange(0, limits.LAG_MAX),
                     metavar="N",
                     help="Claim the period N periods before the current one."),
        click.option("--stale-after", default="5m", show_default=True, type=DURATION,
                     help="A running claim whose heartbeat is older than this may be taken "
                          "over; the owner renews it every third of this."),
        kill_after_option,
        click.option("--timeout", type=DURATION,
                     help="SIGTERM the command when it runs longer; record failed, exit 124."),
        click.option("--max-attempts", default=3, show_default=True,
                     type=click.IntRange(1, limits.ATTEMPTS_MAX), metavar="N",
                     help="Retry a failed period until this many attempts have failed "
                          "(one ended by a forwarded SIGTERM, SIGINT or SIGHUP does not "
                          "count); a period gets at most 3 times this many of any cause."),
        click.option("--state", is_flag=True,
                     help="Give the command the job's watermark in ONCE_STATE and take a new "
                          "one from the file ONCE_STATE_OUT names (stored only with a done, "
                          "fenced finish)."),
        click.option("--shards", default=1, show_default=True,
                     type=click.IntRange(1, limits.SHARDS_MAX),
                     metavar="N",
                     help="Split each period into N shards (rows KEY#0..KEY#N-1), claimed "
                          "independently; ONCE_SHARD and ONCE_SHARDS tell the command which."),
        click.option("--version-tag", metavar="TEXT",
                     help="Counts as part of the command when telling whether hosts run "
                          "different commands under one job."),
        click.option("--no-overlap", is_flag=True,
                     help="Claim nothing while a live attempt holds another period of the "
                          "job (a later --catchup or once catchup makes the period up)."),
        output_tail_option,
    ]
    for option in reversed(options):
        func = option(func)
    return clock_option(func)


def notify_options(func: F) -> F:
    """Dead-man pings and outcome hooks: they never change the outcome or the exit status."""
    options = [
        click.option("--ping", metavar="URL",
                     help="Request URL/start when the command starts, URL when it succeeds, "
                          "URL/fail when it fails (healthchecks.io style)."),
        click.option("--ping-url-file", metavar="PATH", type=click.Path(dir_okay=False),
                     help="Read the --ping URL from PATH (keeps its key out of crontabs)."),
        click.option("--ping-on-skip", is_flag=True,
                     help="Also ping URL when the period is skipped (counts as alive)."),
        click.option("--ping-exit-status", is_flag=True,
                     help="On failure request URL/STATUS (the exit status) instead of "
                          "URL/fail."),
        click.option("--ping-body-tail", type=SIZE, metavar="SIZE",
                     help="Send the last SIZE bytes of the command's captured output as the "
                          "success and failure pings' body (POST); 0: send none (GET) "
                          "[default: --output-tail, at most 10KiB]."),
        click.option("--on-success", metavar="CMD",
                     help="Run CMD (through /bin/sh) after a done run; ONCE_OUTCOME and "
                          "ONCE_STATUS are set."),
        click.option("--on-failure", metavar="CMD",
                     help="Run CMD after a failed, timed-out or fenced-out run."),
        click.option("--on-skip", metavar="CMD", help="Run CMD when the period is skipped."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def notifier(ping: str | None, ping_url_file: str | None, ping_on_skip: bool,
             ping_exit_status: bool, on_success: str | None, on_failure: str | None,
             on_skip: str | None, ping_body_tail: int | None = None,
             output_tail: int = limits.OUTPUT_TAIL) -> Notifier | None:
    """A Notifier when any ping or hook is asked for (None keeps urllib off the hot path)."""
    if ping_url_file:
        from once.run.notify import read_url_file

        if ping:
            raise click.UsageError("--ping and --ping-url-file exclude each other")
        try:
            ping = read_url_file(ping_url_file)
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise click.UsageError(f"cannot read --ping-url-file {ping_url_file}: "
                                   f"{why}") from None
        if not ping:
            raise click.UsageError(f"--ping-url-file {ping_url_file} holds no URL")
    if ping:
        from once.run.notify import check_url, redact_ping

        why = check_url(ping)
        if why:  # never quote the URL: its path holds the key
            raise click.UsageError(f"bad ping URL {redact_ping(ping)}: {why}")
    if not (ping or on_success or on_failure or on_skip):
        return None
    from once.run.notify import Notifier

    body = min(output_tail, limits.PING_BODY_MAX) if ping_body_tail is None else ping_body_tail
    return Notifier(ping, ping_on_skip, ping_exit_status, on_success, on_failure, on_skip,
                    body)


def verbosity_options(func: F) -> F:
    func = click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
                        show_default=True, help="json: one JSON object a line (time, level, "
                        "event, job, period, attempt, fence, owner, message).")(func)
    func = click.option("-q", "--quiet", is_flag=True,
                        help="Log only errors (not the warning that a period failed out, "
                             "which every fire of a */5 cron line would repeat).")(func)
    return click.option("-v", "--verbose", count=True, help="Also log claims and skips.")(func)


def verbosity(verbose: int, quiet: bool) -> int:
    from once.messages import NORMAL, QUIET

    return QUIET if quiet else NORMAL + min(verbose, 1)


def open_target(db: str | None, password_file: str | None, anywhere: bool = False) -> Target:
    """The ledger named by --db, else by the file ONCE_DATABASE_URL_FILE names, else the
    default SQLite file: a usage error in a container (once.ledger.unnamed_url), unless
    `anywhere` (schema --sql, which touches no ledger)."""
    import os

    from once import secrets
    from once.ledger import default_url, parse_url, unnamed_url

    url_file = os.environ.get("ONCE_DATABASE_URL_FILE")
    if not db and url_file:
        db = limits.read_secret(url_file, "ONCE_DATABASE_URL_FILE").strip()
        if not db:
            raise InputError(f"ONCE_DATABASE_URL_FILE {url_file} holds no URL")
    if db:  # before anything can fail: every later message is scrubbed of its secrets
        secrets.remember_url(db)
    password = None
    if password_file:
        password = limits.read_secret(password_file, "--db-password-file")
        secrets.remember_password(password)
    return parse_url(db or (default_url() if anywhere else unnamed_url()), password)


def ledger_for(target: Target, stale_after: float = 300.0, quiet: bool = False,
               log_format: str = "text") -> Ledger:
    """The ledger of a command that may create it; the default's first use is said (not
    under -q)."""
    from once.deadlines import statement_timeout
    from once.ledger import open_ledger

    first_use(target, quiet, log_format)
    return open_ledger(target, timeout=statement_timeout(stale_after))


def first_use(target: Target, quiet: bool = False, log_format: str = "text") -> None:
    """Create the default ledger's file if it is missing, and say where (not under -q): else
    a machine's own ledger appears without a word (the one of many first uses at once that
    created it says it)."""
    import os

    from once.ledger import create_private, default_url

    if target.url != default_url() or os.path.exists(target.path):
        return
    try:
        created = create_private(target)
    except OSError:  # an unwritable HOME: the ledger's own open says so (exit 75)
        return
    if created and not quiet:
        from once.messages import say
        from once.run import flow

        settings = flow.Settings(log_format=log_format) if log_format == "json" else None
        say(f"created the ledger {target.path}: no --db, ONCE_DATABASE_URL or "
            f"ONCE_DATABASE_URL_FILE named one, so it is this machine's own", settings,
            event="ledger-created", json_level="info")

"""`once lead`, added to the group with the other commands (once.cli.main.load_commands)."""

from __future__ import annotations

import click

from once import limits
from once.cli.complete import lead_names
from once.cli.options import DURATION, ledger_options, open_target


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--name", required=True, metavar="NAME", shell_complete=lead_names,
              help="Lead name: one leader per name and ledger (1-200 printable characters, no "
                   "whitespace; with --namespace, NS:NAME at most 255).")
@click.option("--lease", default="15s", show_default=True, type=DURATION,
              help="How long a leader's lease lasts unless renewed (every third of it); a "
                   "candidate takes over at most this long after a leader dies. 3s to 1 year.")
@click.option("--kill-after", type=DURATION,
              help="SIGTERM the command this long before the lease's deadline, SIGKILL at it "
                   "[default: a third of --lease, at most 10s; at most a third of --lease].")
@click.option("--rejoin", is_flag=True,
              help="After the lease was lost (the command stopped), stand as a candidate "
                   "again instead of exiting 70.")
@click.option("--owner", envvar="ONCE_OWNER", metavar="TEXT",
              help="This process's name in reports [env: ONCE_OWNER; default: host name and "
                   "process id].")
@click.option("--retire", is_flag=True,
              help="Forget NAME (no COMMAND): once check stops watching it. Refused (exit 69) "
                   "while a leader holds it; its terms stay in the history.")
@ledger_options
@click.option("-q", "--quiet", is_flag=True,
              help="Log only errors (not each change of state: candidate, leading, released).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: one JSON object a line (time, level, event, "
              "lead, owner, message).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARG]...")
def lead(name: str, lease: float, kill_after: float | None, rejoin: bool, owner: str | None,
         retire: bool, db: str | None, db_password_file: str | None, namespace: str | None,
         quiet: bool, log_format: str, command: tuple[str, ...]) -> int:
    """Run COMMAND on one process at a time of all that run `once lead --name NAME`.

    Every replica runs the same line; one wins the lease and runs COMMAND with ONCE_LEAD
    (the name) and ONCE_TERM (the term: larger than every term of NAME before it) in its
    environment, the others wait as candidates and take over when it stops. The command gets
    SIGTERM --kill-after before the lease's deadline and SIGKILL at it when renewals fail,
    even if once itself is stopped or killed. once exits with the command's status (128+N for
    signal N) once it has ended and the lease is released, 0 when stopped by a signal as a
    candidate, 2 on a usage error, 69 when --retire finds NAME held, 70 when the lease was
    lost and the command stopped, 75 when --retire cannot reach the ledger.
    """
    from once.run import lead as leading

    stored = limits.stored_name(name, namespace, "lead")
    problem = leading.lease_problem(lease, kill_after)
    if problem:
        raise click.UsageError(problem)
    if retire and command:
        raise click.UsageError("--retire takes no COMMAND")
    if not retire and not command:
        raise click.UsageError("no command given: once lead --name NAME -- COMMAND [ARG]...")
    who = limits.owner(owner) if owner else _default_owner()
    target = open_target(db, db_password_file)
    from once.messages import NORMAL, QUIET

    voice = leading.Voice(stored, who, QUIET if quiet else NORMAL, log_format)
    from once.deadlines import statement_timeout
    from once.ledger import open_ledger

    with open_ledger(target, timeout=statement_timeout(lease)) as ledger:
        if retire:
            return _retire(ledger, stored)
        elector = leading.Elector(ledger, stored, lease, who, voice)
        return leading.lead_command(elector, command, leading.kill_after_for(lease, kill_after),
                                    rejoin)


def _default_owner() -> str:
    from once.run.flow import default_owner

    return default_owner()


def _retire(ledger: object, name: str) -> int:
    from once.ledger.leases import Leases
    from once.messages import say

    retired = Leases(ledger).retire(name)  # type: ignore[arg-type]
    if retired is None:
        raise click.UsageError(f"no lead name {name!r} in the ledger")
    if not retired:
        say(f"{name} is held by a live leader: stop every `once lead --name {name}` first")
        return 69
    say(f"retired {name}: once status and once check no longer show it")
    return 0

"""The commands that look after the ledger itself: `once schema`, `once prune` and
`once doctor`, added to the group by once.cli.main.load_commands (never on the hot path)."""

from __future__ import annotations

import click

from once.cli.options import DURATION, SIZE, first_use, ledger_options, open_target
from once.escape import shown
from once.messages import say
from once.secrets import scrub, scrub_json

# -- once schema -----------------------------------------------------------------------------


@click.command()
@ledger_options
@click.option("--sql", is_flag=True, help="Print the DDL for the URL's dialect; touch no "
              "database.")
def schema(db: str | None, db_password_file: str | None, namespace: str | None,
           sql: bool) -> None:
    """Create or upgrade the ledger's tables (they are also created on first use)."""
    from once.ledger import schema as ledger_schema

    target = open_target(db, db_password_file, anywhere=sql)  # --sql touches no ledger
    if sql:
        for statement in ledger_schema.ddl(target.backend):
            click.echo(scrub(statement + ";\n"))
        return
    first_use(target)
    ledger_schema.ensure(target)
    if target.dialect == "postgresql":  # and the claim a catch-up calls, where it may
        from once.ledger.postgres import PostgresLedger

        ledger = PostgresLedger(target)
        with ledger:
            ledger.make_stored_claim()
    say(f"the ledger's tables are ready in {target.redacted} "
             f"(schema version {ledger_schema.SCHEMA_VERSION})")


# -- once prune -----------------------------------------------------------------------------


@click.command()
@ledger_options
@click.option("--older-than", required=True, type=DURATION, metavar="DURATION",
              help="Forget attempts, done rows and lead terms that finished longer ago "
                   "than this.")
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
def prune(db: str | None, db_password_file: str | None, namespace: str | None,
          older_than: float, dry_run: bool) -> int:
    """Delete old history and done rows; never a running or failed row, never a job's latest
    done row, never a done row after the job's oldest gap (catch-up and check count them).
    Every attempt of a deleted row goes with it. Terms of once lead that ended go too, never a
    lead name's latest term (the next one is numbered from it). Lists jobs idle for longer
    than --older-than."""
    from once import report
    from once.ledger import prune as pruning

    target = open_target(db, db_password_file)
    pruned = pruning.prune(target, older_than, report.oldest_gaps, dry_run)
    if pruned.no_tables:
        say(f"no ledger tables in {target.redacted} (nothing has run there): nothing to "
            f"prune")
    verb = "would delete" if dry_run else "deleted"
    click.echo(scrub(f"{verb} {pruned.runs} done rows, {pruned.attempts} attempts and "
                     f"{pruned.lead_terms} lead terms"))
    for job, last in pruned.idle_jobs:
        click.echo(scrub(f"idle job {shown(job)}: last fired {last:%Y-%m-%d %H:%M} UTC "
                         f"(renamed or retired?)"))
    return 0


# -- once doctor ----------------------------------------------------------------------------


@click.command()
@ledger_options
@click.option("--output-tail", default="16KiB", show_default=True, type=SIZE, metavar="SIZE",
              help="The --output-tail the fleet stores, to check the server's packet limit.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor(db: str | None, db_password_file: str | None, namespace: str | None,
           output_tail: int, as_json: bool) -> int:
    """Check that the ledger's server can keep the promise: this user's grants, durability,
    replication, standbys and replicas, Galera, every host of a host list, limits. One line
    per finding, `SEVERITY TOPIC WHAT`; what it could not read is a WARNING, never OK; exit
    0 OK, 1 WARNING, 2 CRITICAL (as once check), 75 when the server cannot be read."""
    from once.ledger.server import server_facts
    from once.report import doctor as judging

    target = open_target(db, db_password_file)
    verdicts = judging.judge(target.dialect, server_facts(target), output_tail)
    shown_verdicts = judging.render(verdicts, as_json)
    click.echo(scrub_json(shown_verdicts) if as_json else scrub(shown_verdicts))
    return judging.worst(verdicts)


COMMANDS = (schema, prune, doctor)

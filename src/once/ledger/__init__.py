"""The ledger: every SQL statement once sends, and nothing else holds SQL text.

The hot path (`once run`) imports this package: it and the modules it imports (url, records,
base, catchup) load no driver and no SQLAlchemy. `open_ledger` imports the one dialect module
the URL names (sqlite, postgres or mysql), which loads its driver when it connects.

    url       where the ledger lives: Target, parse_url, redact, default_url
    records   what it answers and how it fails: Job, Claim, LedgerError and the error rules
    base      the flow every dialect shares: Ledger (claim, renew, finish, state, reads)
    catchup   catch-up's reads of done rows (once.gaps.Rows)
    sqlite, postgres, mysql   one dialect each, importing only its own driver
    schema    the tables in SQLAlchemy Core, their DDL and upgrades (never on the hot path)
    prune     `once prune` (SQLAlchemy, never on the hot path)
    queries   the reads of the reports and `once serve`, by name (SQLAlchemy, never on the
              hot path), and their one missing-table rule

Callers import the public names from here (`from once.ledger import Target, open_ledger`);
schema, prune and queries are imported as modules, where they are needed.
"""

from __future__ import annotations

from once.ledger.base import Ledger
from once.ledger.catchup import LedgerRows
from once.ledger.records import (
    Claim,
    ClockSkew,
    CommandDrift,
    Job,
    LedgerError,
    describe,
    from_db_time,
)
from once.ledger.url import (
    Dialect,
    Target,
    UrlError,
    create_private,
    default_url,
    parse_url,
    redact,
)

__all__ = [
    "Claim", "ClockSkew", "CommandDrift", "Dialect", "Job", "Ledger", "LedgerError",
    "LedgerRows", "Target", "UrlError", "create_private", "default_url", "describe",
    "from_db_time", "open_ledger", "parse_url", "redact",
]


def open_ledger(target: Target, timeout: float = 10.0) -> Ledger:
    """A ledger for the target's dialect; connects lazily, on the first statement. Only that
    dialect's module is imported."""
    return _ledger_class(target)(target, timeout)


def _ledger_class(target: Target) -> type[Ledger]:
    if target.dialect == "postgresql":
        from once.ledger.postgres import PostgresLedger

        return PostgresLedger
    if target.dialect == "mysql":
        from once.ledger.mysql import MysqlLedger

        return MysqlLedger
    from once.ledger.sqlite import SqliteLedger

    return SqliteLedger

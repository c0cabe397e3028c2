"""The ledger: every SQL statement once sends, and nothing else holds SQL text.

The hot path (`once run`) imports this package: it and the modules it imports (url, records,
dialect, dialects, base, gap_rows) load no driver and no SQLAlchemy. `open_ledger` imports the
one dialect module the URL names (sqlite, postgres or mysql), which loads its driver when it
connects.

    url       where the ledger lives: Target (which holds its backend), redact, default_url,
              unnamed_url, and each backend's URL parser
    dialect   what every backend answers (how to connect, SQL fragments, instants, errors, the
              schema lock, replication): Dialect; errors their error rules
    dialects  the registry, above the flow the backends share: one Dialect each (Sqlite,
              Postgres, Mysql), whose methods import that backend's own modules when they
              need them; parse_url, REGISTRY, named
    connect   how a connection to a server is opened, for every path (the URL's hosts in turn)
    records   what it answers and how it fails: Job, Claim, LedgerError and the error rules
    base      the flow every dialect shares: Ledger (claim, renew, finish, state, reads)
    gap_rows  the gap finder's reads of one job's rows (once.gaps.Rows), catch-up's and the
              reports'
    rows      the rows the reports read, one record each (RunRow, JobRow) and their columns
    fleet     what the survey reads across jobs (`once status`, `check`, `once serve`), in plain
              SQL on the driver: no SQLAlchemy
    sqlite, postgres, mysql   one dialect's statements each, importing only its own driver
    tables    the tables in SQLAlchemy Core (never on the hot path)
    schema    their DDL and creation, upgrade an older ledger's steps (never on the hot path)
    prune     `once prune` (SQLAlchemy, never on the hot path)
    history   the attempts' reads of `once history`, `logs` and `metrics`, by name (SQLAlchemy,
              never on the hot path)
    engines   the reports' and `once serve`'s read-only engines and their sessions' first
              reads (schema version, clock), and their one missing-table rule

Callers import the public names from here (`from once.ledger import Target, open_ledger`);
schema, prune, history and engines are imported as modules, where they are needed. The flow
the backends share (base, url, connect, schema, upgrade, watchdog) never imports this package
or the registry: it takes its backend from the target.
"""

from __future__ import annotations

from once.ledger.base import Ledger
from once.ledger.dialects import UnknownDialect, parse_url
from once.ledger.gap_rows import LedgerRows
from once.ledger.records import (
    Claim,
    ClockSkew,
    CommandDrift,
    Job,
    LedgerError,
    describe,
    from_db_time,
    newer_schema,
)
from once.ledger.url import (
    Dialect,
    Target,
    UrlError,
    create_private,
    default_url,
    redact,
    unnamed_url,
)

__all__ = [
    "Claim",
    "ClockSkew",
    "CommandDrift",
    "Dialect",
    "Job",
    "Ledger",
    "LedgerError",
    "LedgerRows",
    "Target",
    "UnknownDialect",
    "UrlError",
    "create_private",
    "default_url",
    "describe",
    "from_db_time",
    "newer_schema",
    "open_ledger",
    "parse_url",
    "redact",
    "unnamed_url",
]


def open_ledger(target: Target, timeout: float = 10.0) -> Ledger:
    """A ledger for the target's dialect; connects lazily, on the first statement. Only that
    dialect's module is imported."""
    return _ledger_class(target)(target, timeout)


def _ledger_class(target: Target) -> type[Ledger]:
    return target.backend.ledger_class()  # the registry's Dialect, which parse_url put there

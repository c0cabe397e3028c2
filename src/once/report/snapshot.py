"""Reading one snapshot of the ledger: `surveying` for the survey of `once status` and
`once check` (once.ledger.reads, plain SQL on the driver: no SQLAlchemy), `reading` for the
reports that read through once.ledger.queries (SQLAlchemy: history, metrics' attempt counts),
each one read-only connection in one consistent transaction.

An absent ledger (no SQLite file, no tables) is NoLedger, never created; a ledger whose schema
is older than this once's is upgraded first, as the next `once run` would do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from once.ledger import LedgerError, Target, describe
from once.ledger.reads import NoLedger, Snapshot

if TYPE_CHECKING:
    from sqlalchemy import Connection

__all__ = ["NoLedger", "reading", "surveying"]


def surveying(target: Target) -> AbstractContextManager[Snapshot]:
    """One read-only snapshot for the survey (once.report.survey), without SQLAlchemy."""
    return Snapshot.open(target)


@contextmanager
def reading(target: Target) -> Iterator[Connection]:
    """One connection in one consistent snapshot; errors become LedgerError (exit 75).

    A ledger whose schema is older than this once's is upgraded first (`once schema`), as the
    next `once run` would do, so that reports can read the columns they know.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from once.ledger import queries
    from once.ledger import schema as tables
    from once.ledger.engines import report_engine

    if target.dialect == "sqlite" and not os.path.exists(target.path):
        raise NoLedger  # connecting would create an empty file
    try:
        eng = report_engine(target)
    except ValueError as exc:  # SQLAlchemy cannot read the URL that once's parser took
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    yielded = False
    try:
        for tries in (1, 2):
            with eng.connect() as conn:
                if target.dialect != "sqlite":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    if tries == 2 or queries.schema_version(conn) >= tables.SCHEMA_VERSION:
                        yielded = True
                        yield conn
                        return
            tables.ensure(target)
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if yielded:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    except SQLAlchemyError as exc:
        if queries.is_missing_table(target, exc):
            raise NoLedger from None
        raise LedgerError(
            f"cannot read the ledger {target.redacted}: {describe(exc.orig or exc)}"
            if hasattr(exc, "orig") else f"cannot read the ledger {target.redacted}: {exc}"
        ) from exc
    finally:
        eng.dispose()


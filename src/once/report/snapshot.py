"""Reading one snapshot of the ledger: `surveying` for the survey of `once status` and
`once check` and `once metrics` (once.ledger.fleet, plain SQL on the driver: no SQLAlchemy),
`reading` for the reports that read through once.ledger.history (SQLAlchemy: history, logs),
each one read-only connection in one consistent transaction.

An absent ledger (no SQLite file, no tables) is NoLedger, never created; a ledger whose schema
is older than this once's is upgraded first, as the next `once run` would do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from once.ledger import LedgerError, Target, describe, dialects, newer_schema
from once.ledger.fleet import NoLedger, Snapshot, failed_read
from once.ledger.records import LOCK_WAIT

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

    from once.ledger import engines
    from once.ledger import schema as tables

    if dialects.of(target).absent(target):
        raise NoLedger  # connecting would create an empty file
    eng = engines.report_engine(target)  # it connects as `once run` does, and only when asked
    yielded = False
    try:
        for tries in (1, 2):
            with eng.connect() as conn:
                conn = conn.execution_options(**dialects.of(target).snapshot_options(False))
                with conn.begin():
                    for sql in dialects.of(target).lock_waits(LOCK_WAIT):  # a table's lock
                        conn.exec_driver_sql(sql)
                    version = engines.schema_version(conn)
                    if version > tables.SCHEMA_VERSION:
                        raise newer_schema(version)
                    if tries == 2 or version == tables.SCHEMA_VERSION:
                        yielded = True
                        yield conn
                        return
            tables.ensure(target)
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if yielded:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    except SQLAlchemyError as exc:
        if engines.is_missing_table(target, exc):
            raise NoLedger from None
        said = failed_read(dialects.of(target), exc.orig or exc) if hasattr(exc, "orig") \
            else str(exc)
        raise LedgerError(f"cannot read the ledger {target.redacted}: {said}") from exc
    finally:
        eng.dispose()


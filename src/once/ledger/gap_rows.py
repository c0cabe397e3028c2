"""Catch-up's reads of a job's rows: `LedgerRows` answers once.gaps.Rows in plain SQL on the
ledger's own connection (counted and located by index seeks and ranges on
once_runs_job_status_start, one round trip each), and reads the job's span and its open rows,
so that `once run --catchup` finds its gaps without SQLAlchemy.

Imports only the stdlib; the statements go through the Ledger (once.ledger.base), which
speaks each dialect.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from once.ledger.dbapi import Params, Row


class RowSource(Protocol):
    """What LedgerRows reads through: a Ledger (catch-up) or a fleet Snapshot (the reports)."""

    @property
    def HEARTBEAT_AGE(self) -> str: ...  # the SQL of a heartbeat's age

    def _read(self, sql: str, params: Params) -> list[Row]: ...

    def _time(self, instant: datetime) -> datetime | str: ...

    def _from_db_time(self, value: Any) -> datetime: ...

JOB_SPAN = """
    SELECT (SELECT first_period_start FROM once_jobs WHERE job = %(job)s),
           (SELECT max(period_start) FROM once_runs WHERE job = %(job)s AND status = 'done'),
           (SELECT max(period_start) FROM once_runs
            WHERE job = %(job)s AND status = 'running'),
           (SELECT max(period_start) FROM once_runs
            WHERE job = %(job)s AND status = 'failed')"""

OPEN_ROWS = """
    SELECT period, period_start, status, attempt, {age}, stale_after, interrupted
    FROM once_runs
    WHERE job = %(job)s AND status IN ('running', 'failed')
      AND period_start >= %(lo)s AND period_start < %(hi)s
    ORDER BY period_start"""

COUNT_TERMS = 8  # stretches counted per statement
DONE_COUNTS = " UNION ALL ".join(
    f"SELECT {i}, count(*) FROM once_runs WHERE job = %(job)s AND status = 'done' "
    f"AND period_start >= %(a{i})s AND period_start < %(b{i})s"
    for i in range(COUNT_TERMS))

KEYS_AT = """
    SELECT period_start, period FROM once_runs
    WHERE job = %(job)s AND period_start IN ({starts})"""

# The first done row in range, and every done row not followed directly by another.
DONE_BREAKS = """
    SELECT s, e, f, n FROM (
        SELECT period_start AS s, period_end AS e,
               LEAD(period_start) OVER (ORDER BY period_start) AS f,
               ROW_NUMBER() OVER (ORDER BY period_start) AS n
        FROM once_runs
        WHERE job = %(job)s AND status = 'done'
          AND period_start >= %(lo)s AND period_start < %(hi)s
    ) breaks
    WHERE n = 1 OR f IS NULL OR f > e
    ORDER BY s"""

SHORT_STARTS = """
    SELECT period_start FROM once_runs
    WHERE job = %(job)s AND period_start >= %(lo)s AND period_start < %(hi)s
    GROUP BY period_start HAVING count(*) < %(shards)s
    ORDER BY period_start LIMIT %(limit)s"""


class LedgerRows:
    """once.gaps.Rows in plain SQL on the ledger's own connection (catch-up's reads)."""

    def __init__(self, ledger: RowSource, job: str) -> None:
        self.ledger, self.job = ledger, job

    def span(self) -> tuple[datetime | None, datetime | None]:
        """(the job's first period start, the start of its latest row of any status), UTC;
        (None, None) for a job that has never run."""
        rows = self.ledger._read(JOB_SPAN, {"job": self.job})
        if not rows or rows[0][0] is None:
            return None, None
        first, *latest = (self.ledger._from_db_time(v) for v in rows[0] if v is not None)
        return first, max(latest, default=None)

    def open_rows(self, lo: datetime,
                  hi: datetime) -> list[tuple[str, datetime, str, int, bool, int]]:
        """The running and failed rows whose period starts in [lo, hi), oldest first:
        (key, period start, status, attempt, whether it is a running row past its owner's
        promise by the database's clock, how many attempts ended interrupted)."""
        ledger = self.ledger
        rows = ledger._read(OPEN_ROWS.format(age=ledger.HEARTBEAT_AGE),
                            {"job": self.job, "lo": ledger._time(lo), "hi": ledger._time(hi)})
        return [(key, ledger._from_db_time(start), status, int(attempt),
                 status == "running" and age is not None and float(age) > float(stale_after),
                 int(interrupted))
                for key, start, status, attempt, age, stale_after, interrupted in rows]

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        ledger, terms = self.ledger, COUNT_TERMS
        out: list[int] = []
        for first in range(0, len(stretches), terms):
            chunk = stretches[first:first + terms]
            params: Params = {"job": self.job}
            for i in range(terms):
                # The terms left over count the empty stretch [a, a).
                a, b = chunk[i] if i < len(chunk) else (chunk[-1][0], chunk[-1][0])
                params[f"a{i}"], params[f"b{i}"] = ledger._time(a), ledger._time(b)
            counts = {int(i): int(n) for i, n in ledger._read(DONE_COUNTS, params)}
            out += [counts.get(i, 0) for i in range(len(chunk))]
        return out

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        ledger = self.ledger
        found: dict[datetime, set[str]] = {}
        for first in range(0, len(starts), 500):
            chunk = starts[first:first + 500]
            params: Params = {"job": self.job}
            params.update({f"t{i}": ledger._time(at) for i, at in enumerate(chunk)})
            sql = KEYS_AT.format(starts=", ".join(f"%(t{i})s" for i in range(len(chunk))))
            for at, key in ledger._read(sql, params):
                found.setdefault(ledger._from_db_time(at), set()).add(key)
        return found

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        ledger = self.ledger
        rows = ledger._read(DONE_BREAKS, {"job": self.job, "lo": ledger._time(lo),
                                                 "hi": ledger._time(hi)})
        when = ledger._from_db_time
        first = when(rows[0][0]) if rows else None
        return first, [(when(e), None if f is None else when(f)) for _, e, f, n in rows
                       if f is None or when(f) > when(e)]

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        ledger = self.ledger
        rows = ledger._read(SHORT_STARTS, {"job": self.job, "lo": ledger._time(lo),
                                                  "hi": ledger._time(hi), "shards": shards,
                                                  "limit": limit})
        return [ledger._from_db_time(at) for (at,) in rows]

"""What `once serve` shows, read from the ledger in bounded time and without writing.

Every read is one read-only snapshot that gives up within about --read-timeout: the connect
is bounded by the driver's connect timeout, each statement by a server-side statement timeout
(PostgreSQL) or the driver's read timeout (MySQL/MariaDB, SQLite's busy timeout), and the
whole read by a watchdog that shuts the connection's socket down, so that a server that stops
answering (stopped, hung, partitioned) fails the read instead of holding it. Unlike the
commands, a read never creates or upgrades the ledger's tables: `once serve` changes nothing.

The data come from once.report's functions, so that the pages say what the commands say:
`/metrics` is `once metrics`, `/api/status` is `once status --json`, `/api/leads` is `once
status --leads --json`, a job's page holds `once history`, `once check` and `once status
--timeline`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from once import report
from once.ledger import LedgerError, Target, describe, dialects, engines, newer_schema
from once.ledger import schema as tables
from once.ledger.engines import serve_engine
from once.ledger.fleet import NoLedger, Snapshot, Standby
from once.ledger.leases import Lead
from once.ledger.watchdog import ReadWatchdog
from once.periods import Period

STRIP = 30  # periods in each job's strip on the overview


@dataclass
class Fleet:
    """Every job (of the namespace) at the database's now, for `/` and `/api/status`."""

    now: datetime
    states: list[report.JobState] = field(default_factory=list)
    strips: dict[str, list[tuple[Period, str]]] = field(default_factory=dict)
    shown: list[report.JobState] | None = None  # the jobs pick picked (None: no pick)
    standby: Standby | None = None  # the ledger read is a standby's copy
    leads: list[Lead] = field(default_factory=list)  # the lead names (of the namespace)


@dataclass
class JobPage:
    """One job for `/job/NAME`: its state, timeline, check findings and history."""

    now: datetime
    state: report.JobState
    cells: list[tuple[Period, str]]
    findings: list[report.Finding]
    tz: str
    entries: list[dict[str, Any]]


@dataclass
class Output:
    """One attempt for `/logs/NAME`: as `once logs --json` has it, and its stored output."""

    now: datetime
    entry: dict[str, Any]
    output: str | None


Pick = Callable[[list[report.JobState]], list[report.JobState]]


def read_fleet(target: Target, namespace: str | None, timeout: float,
               strips: bool = True, pick: Pick | None = None) -> Fleet:
    """Every job's state; with strips, the timelines of those pick picks (every job's
    without it: a page of thousands of jobs shows a hundred)."""
    try:
        with read_only(target, timeout) as conn:
            snap = Snapshot.over(conn, target)
            standby = snap.standby()
            # A page reads the detail of the jobs it shows alone (the verdicts of the others
            # need only their counts), and their strips in one read.
            detail = not strips or pick is None
            states, now = report.survey_jobs(snap, None, namespace, detail=detail)
            fleet = Fleet(now, states, standby=standby)
            if strips:
                shown = pick(states) if pick else states
                fleet.shown = shown if pick else None
                report.complete(snap, shown)
                fleet.strips = report.timelines(snap, shown, STRIP)
            # The lead names last: their read may end the snapshot (once.report.leads).
            fleet.leads = report.read_leads(snap, None, namespace)
            return fleet
    except NoLedger:
        return Fleet(datetime.now(UTC))


def read_metrics(target: Target, namespace: str | None, timeout: float) -> str:
    """`/metrics`: what `once metrics` prints (once.report.metrics_text: every job from its
    counts, not read in full)."""
    try:
        with read_only(target, timeout) as conn:
            return report.metrics_text(Snapshot.over(conn, target), namespace)
    except NoLedger:
        return report.exposition([], {})


def read_leads(target: Target, namespace: str | None,
               timeout: float) -> tuple[list[Lead], Standby | None]:
    """The lead names (of the namespace), for `/api/leads`; none on an absent ledger."""
    try:
        with read_only(target, timeout) as conn:
            snap = Snapshot.over(conn, target)
            standby = snap.standby()
            return report.read_leads(snap, None, namespace), standby
    except NoLedger:
        return [], None


def read_job(target: Target, name: str, timeout: float, limit: int = 100) -> JobPage | None:
    """The job's page; None when the job has never run."""
    try:
        with read_only(target, timeout) as conn:
            snap = Snapshot.over(conn, target)
            states, now = report.survey_jobs(snap, [name], None)
            found = report.attempt_entries(conn, target, name, limit)
            if not states or found is None:
                return None
            state = states[0]
            cells = report.timeline_cells(snap, state, None)
    except NoLedger:
        return None
    tz, entries = found
    verdict = sorted(report.findings([state]), key=lambda f: f.order)
    return JobPage(now, state, cells, verdict, tz, entries)


def output_wanted(query: str) -> tuple[str | None, int | None, str | None]:
    """/logs/NAME's query, ?period=P&attempt=N: the period and the attempt's number (None
    for the latest), and a sentence when the number is none."""
    given = {k: v[-1] for k, v in parse_qs(query).items()}
    number = given.get("attempt", "")
    attempt = int(number) if number.isascii() and number.isdigit() and 0 < len(
        number) < 10 else None
    period = given.get("period") or None
    # a NUL, which PostgreSQL refuses to be asked for, is in no ledger
    unstored = period is not None and not (period.isprintable() and len(period) <= 200)
    refused = "no such attempt" if (number and attempt is None) or unstored else None
    return period, attempt, refused


def read_output(target: Target, name: str, period: str | None, attempt: int | None,
                timeout: float) -> Output | str:
    """An attempt's output, as `once logs` finds it; a sentence when there is none (an
    unknown job, period or attempt)."""
    from once.report import logs

    try:
        with read_only(target, timeout) as conn:
            found = logs.attempt_output(conn, target, name, period, attempt)
            now = engines.db_now(conn, target)
    except NoLedger:
        found = None
    if found is None:
        return f"no job {name!r} in the ledger"
    entry, output = found
    if entry is None:
        which = f"attempt {attempt}" if attempt is not None else "attempt"
        where = f" at period {output}" if period is not None else ""
        return f"job {name} has no {which}{where}"
    return Output(now, entry, output)


def ping(target: Target, timeout: float) -> None:
    """Raise LedgerError unless the ledger answers a read (an absent ledger answers)."""
    with suppress(NoLedger), read_only(target, timeout) as conn:
        engines.schema_version(conn)


@contextmanager
def read_only(target: Target, timeout: float) -> Iterator[Connection]:
    """One read-only snapshot, given up on within about `timeout` seconds (LedgerError)."""
    if dialects.of(target).absent(target):
        raise NoLedger  # connecting would create an empty file
    eng = serve_engine(target, timeout)
    watchdog = ReadWatchdog(timeout, target)
    connected = False
    try:
        with eng.connect() as conn:
            connected = True
            watchdog.arm(conn.connection.dbapi_connection)
            try:
                conn = conn.execution_options(**dialects.of(target).snapshot_options(True))
                with conn.begin():
                    engines.begin_read_only(conn, target, timeout)
                    version = engines.schema_version(conn)
                    if version > tables.SCHEMA_VERSION:
                        raise newer_schema(version)
                    if version < tables.SCHEMA_VERSION:
                        raise LedgerError(
                            f"the ledger {target.redacted} has schema version {version}, "
                            f"older than this once's {tables.SCHEMA_VERSION}: the next once "
                            f"run or `once schema` upgrades it (once serve never writes)")
                    yield conn
            finally:
                watchdog.cancel()  # before the socket is closed and its number reused
    except LedgerError as exc:  # once.ledger.fleet's (the survey's), or ours
        if not watchdog.fired:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: no answer within "
                          f"{timeout:g}s") from exc
    except SQLAlchemyError as exc:
        if engines.is_missing_table(target, exc):
            raise NoLedger from None
        why = (f"no answer within {timeout:g}s" if watchdog.fired
               else describe(getattr(exc, "orig", None) or exc))
        raise LedgerError(f"cannot read the ledger {target.redacted}: {why}") from exc
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if connected:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    finally:
        eng.dispose()



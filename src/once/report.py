"""Reports on the ledger: `once status`, `once history`, `once check` and `once metrics`.

Only the reports import SQLAlchemy and rich (`once run` never pays for them). They read the
ledger with SQLAlchemy Core over the tables of `once.schema`, in one snapshot, and change
nothing (except that a ledger whose schema is older than this once's is upgraded first, as
the next `once run` would do; an absent ledger is reported empty, never created).

What the reports call a job's periods, for a job with lag L and a check with --grace G:

* its first period: the one containing `once_jobs.first_period_start` (its earliest claim);
* a period P is due once the end of P+L plus G has passed (README "Monitoring"), so the latest due
  period is the one L+1 periods before the period containing now - G;
* missing: a due period, from the first one on, with no done row, no failed row and no live
  attempt: no row at all, or a running row whose heartbeat is older than the job's
  --stale-after (by the database's clock);
* failed: a failed row; failed-out: a failed row with no attempts left (its attempt has reached
  the --max-attempts of the job's latest run).

With --shards N, every period should have N rows (KEY#0 ... KEY#N-1) and each shard without
one is a missing unit of its own.

Scale: the number of due periods is counted arithmetically (once.gaps) and compared with one
COUNT of done rows over an index range per job (index once_runs_job_status_start); only a job
whose count shows a gap has its gaps located, by counting ever smaller stretches
(once.gaps.GapFinder, which catch-up uses too: about log8(periods) round trips per gap; the
stretch after a job's latest row costs none), and only the first few missing keys and the last
one are walked. So `once status` and `once check` read O(jobs) index ranges and walk O(listed)
periods, not every period of every job. A cron schedule has no closed-form count: its gaps are
the stretches between its done rows (a window query over the job's done rows, in index order),
walked up to WALK_LIMIT.

Known limit: the counts assume the job's rows follow its current schedule. After a change of
--every/--cron/--tz/--shards, rows of the old schedule inside the due range can hide or invent
missing periods.

`once check` lines, one per finding on stdout, most severe first (stable; scripts may parse
them: the first three fields never contain spaces):

    CRITICAL <job> <period> missing
    CRITICAL <job> <first>..<last> missing (<n> more periods)
    CRITICAL <job> <period> failed (attempt <a> of <max>, exit <code>)
    CRITICAL <job> <period> failed-out (attempt <a> of <max>, exit <code>, no attempts left)
    CRITICAL <job> <period> stale (owner <o>, attempt <a>, heartbeat <age> ago, stale after <d>)
    WARNING <job> <period> stale (...)                 (the period is not due yet)
    CRITICAL <job> - unknown (no run of this job in the ledger)
    UNKNOWN - - empty (no job has run in the ledger <url>; ...)     (exit 3)
    OK <n> jobs: every due period done (ledger <url>)  (only when there is no finding)

Text from the ledger is shown through once.escape.shown: a finding is always one line.

A range line follows the first ten listed findings of one kind for one job.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import islice
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    create_engine,
    event,
    func,
    literal_column,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Executable

from once import gaps
from once import schema as tables
from once.escape import shown, shown_word
from once.ledger import LedgerError, Target, describe
from once.periods import Period, Schedule, SpecError, iso
from once.periods import schedule as make_schedule

LIST_LIMIT = 10  # findings (missing keys, failed periods) listed one by one per job and kind
WALK_LIMIT = 100_000  # missing units walked per job to count the gaps of a cron job
CHUNK = 200  # jobs per statement (SQLite allows 500 terms in a compound SELECT)

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
SEVERITY = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}

STATE_PERIOD = "(state)"  # the history's rows of `once state --set`: no attempt, no fire

_NEVER = datetime.min.replace(tzinfo=UTC)

runs, attempts, jobs = tables.runs, tables.attempts, tables.jobs


# -- reading the ledger ----------------------------------------------------------------------


class _NoLedger(Exception):
    """The ledger's tables do not exist yet: nothing has run."""


def _engine(target: Target) -> Engine:
    """An engine for reading: SQLite opens a deferred (read) transaction, never a write lock,
    on a read-only connection (_sqlite_read_only)."""
    if target.dialect == "sqlite":
        eng = create_engine("sqlite://", poolclass=NullPool,
                            creator=lambda: _sqlite_read_only(target.path))
    else:
        args = tables._engine_args(target)  # the connect arguments once.schema uses
        eng = create_engine(target.sqlalchemy_url, poolclass=NullPool, **args)
    if target.dialect == "sqlite":

        @event.listens_for(eng, "connect")
        def _manual_transactions(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        @event.listens_for(eng, "begin")
        def _begin_snapshot(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN")  # WAL: a consistent snapshot for every read

    return eng


def _sqlite_read_only(path: str) -> Any:
    """A connection that cannot write: reports work for an account that may only read the
    ledger (a monitoring user), and never create or change a file.

    A WAL ledger with no writer at work has no shared-memory file (`-shm`), and a read-only
    connection cannot create one where it may not write: SQLite then refuses to read at all.
    The file is then opened as immutable, which needs no shared memory; that is sound here
    because a writer at work would have made the `-shm` file.
    """
    import sqlite3
    from urllib.parse import quote

    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=30, check_same_thread=False)


@contextmanager
def _reading(target: Target) -> Iterator[Connection]:
    """One connection in one consistent snapshot; errors become LedgerError (exit 75).

    A ledger whose schema is older than this once's is upgraded first (`once schema`), as the
    next `once run` would do, so that reports can read the columns they know.
    """
    if target.dialect == "sqlite" and not os.path.exists(target.path):
        raise _NoLedger  # connecting would create an empty file
    try:
        eng = _engine(target)
    except ValueError as exc:  # SQLAlchemy cannot read the URL that once's parser took
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    reading = False
    try:
        for tries in (1, 2):
            with eng.connect() as conn:
                if target.dialect != "sqlite":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    version = conn.execute(select(tables.meta.c.value).where(
                        tables.meta.c.name == "schema_version")).scalar()
                    if tries == 2 or int(version or 0) >= tables.SCHEMA_VERSION:
                        reading = True
                        yield conn
                        return
            tables.ensure(target)
    except (OSError, ValueError) as exc:  # the driver's, while connecting (a TLS file, say)
        if reading:
            raise
        raise LedgerError(f"cannot read the ledger {target.redacted}: {describe(exc)}") from exc
    except SQLAlchemyError as exc:
        if _is_missing_table(exc):
            raise _NoLedger from None
        raise LedgerError(
            f"cannot read the ledger {target.redacted}: {describe(exc.orig or exc)}"
            if hasattr(exc, "orig") else f"cannot read the ledger {target.redacted}: {exc}"
        ) from exc
    finally:
        eng.dispose()


def _is_missing_table(exc: SQLAlchemyError) -> bool:
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) == "42P01":  # PostgreSQL: undefined table
        return True
    args = getattr(orig, "args", ())
    if args and args[0] == 1146:  # MySQL: no such table
        return True
    return "no such table" in str(orig)


def _utc(value: datetime) -> datetime:
    """A stored time as an aware UTC datetime (SQLite and MySQL hand back naive UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _bind(target: Target, instant: datetime) -> datetime:
    """An instant as the dialect's column type wants it bound: UTC, naive outside PostgreSQL."""
    at = instant.astimezone(UTC)
    return at if target.dialect == "postgresql" else at.replace(tzinfo=None)


def _db_now(conn: Connection, target: Target) -> datetime:
    """The database's clock, which wrote every heartbeat."""
    if target.dialect == "sqlite":
        text = conn.execute(select(func.strftime("%Y-%m-%d %H:%M:%f", "now"))).scalar_one()
        return datetime.fromisoformat(str(text)).replace(tzinfo=UTC)
    expr = func.clock_timestamp() if target.dialect == "postgresql" else func.utc_timestamp(6)
    value = conn.execute(select(expr)).scalar_one()
    return _utc(value)


# -- what the ledger says about each job -----------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    """A row of once_runs."""

    job: str
    period: str
    status: str
    attempt: int
    fence: int
    owner: str
    period_start: datetime
    period_end: datetime
    started_at: datetime
    heartbeat_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    stale_after: float = 300.0  # the owner's promise: a running row is stale past it

    @classmethod
    def of(cls, row: Any) -> RunRow:
        m = row._mapping
        return cls(m["job"], m["period"], m["status"], m["attempt"], m["fence"], m["owner"],
                   _utc(m["period_start"]), _utc(m["period_end"]), _utc(m["started_at"]),
                   _utc(m["heartbeat_at"]),
                   _utc(m["finished_at"]) if m["finished_at"] is not None else None,
                   m["exit_code"], float(m["stale_after"]))

    @property
    def duration(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


# A missing unit: a period (or, with --shards, one shard of it), as (its start, its key).
Unit = tuple[datetime, str]

_RUN_COLUMNS = (runs.c.job, runs.c.period, runs.c.status, runs.c.attempt, runs.c.fence,
                runs.c.owner, runs.c.period_start, runs.c.period_end, runs.c.started_at,
                runs.c.heartbeat_at, runs.c.finished_at, runs.c.exit_code,
                runs.c.stale_after)


@dataclass
class JobState:
    """One job as the reports see it at `now`."""

    name: str
    kind: str
    spec: str
    tz: str
    lag: int
    max_attempts: int
    stale_after: float
    fires: int
    first_period_start: datetime
    now: datetime
    shards: int = 1
    sched: Schedule | None = None
    error: str = ""  # the stored schedule cannot be rebuilt here (an unknown zone, say)
    first: Period | None = None
    due_last: Period | None = None  # the latest due period; None: nothing is due yet
    current: Period | None = None  # the period `once run` claims now
    next: Period | None = None  # the one it claims next ...
    next_at: datetime | None = None  # ... from this instant on
    expected: int | None = 0  # due periods from the first on (None: cron, not counted)
    done_due: int = 0
    last_done: RunRow | None = None
    open_rows: list[RunRow] = field(default_factory=list)  # running and failed rows
    no_row: int = 0  # due periods without any row
    no_row_listed: list[Unit] = field(default_factory=list)  # the first LIST_LIMIT + 1
    no_row_last: Unit | None = None
    no_row_at_least: bool = False  # no_row is a lower bound (a cron job's huge gap)
    # The last line of output of the failed rows listed (by period; None: nothing stored).
    failure_lines: dict[str, str | None] = field(default_factory=dict)

    @property
    def schedule_text(self) -> str:
        return f"every {self.spec}" if self.kind == "every" else f"cron {self.spec}"

    @property
    def zone(self) -> Any:
        return self.sched.tz if self.sched else UTC

    def due(self, row: RunRow) -> bool:
        return (self.first is not None and self.due_last is not None
                and _utc(self.first.start) <= row.period_start < _utc(self.due_last.end))

    def heartbeat_age(self, row: RunRow) -> float:
        return (self.now - row.heartbeat_at).total_seconds()

    def is_stale(self, row: RunRow) -> bool:
        """Judged by the row's own promise (its owner's --stale-after), as a takeover is."""
        return row.status == "running" and self.heartbeat_age(row) > row.stale_after

    @property
    def running(self) -> list[RunRow]:
        return [r for r in self.open_rows if r.status == "running"]

    @property
    def failed(self) -> list[RunRow]:
        return [r for r in self.open_rows if r.status == "failed"]

    def failed_out(self, row: RunRow) -> bool:
        return row.status == "failed" and row.attempt >= self.max_attempts

    @property
    def listed_failures(self) -> list[RunRow]:
        """The failed rows a report lists: the first LIST_LIMIT and the latest failure."""
        failed = self.failed
        listed = failed[:LIST_LIMIT]
        latest = self.last_failure
        return [*listed, latest] if latest is not None and latest not in listed else listed

    @property
    def last_failure(self) -> RunRow | None:
        """The failed row that finished last."""
        return max(self.failed, key=lambda r: (r.finished_at or _NEVER, r.period_start),
                   default=None)

    @property
    def stale_due(self) -> list[RunRow]:
        return [r for r in self.running if self.is_stale(r) and self.due(r)]

    @property
    def missing(self) -> int:
        """Due periods with no done row, no failed row and no live attempt."""
        return self.no_row + len(self.stale_due)

    def missing_keys(self, limit: int = LIST_LIMIT) -> list[str]:
        found = list(self.no_row_listed)
        found += [(r.period_start, r.period) for r in self.stale_due]
        return [key for _, key in sorted(found)[:limit]]


def _select_jobs(conn: Connection, names: Sequence[str] | None,
                 namespace: str | None) -> list[Any]:
    query = select(jobs.c.job, jobs.c.kind, jobs.c.schedule, jobs.c.tz, jobs.c.lag,
                   jobs.c.max_attempts, jobs.c.stale_after, jobs.c.fires,
                   jobs.c.first_period_start, jobs.c.shards)
    if names:
        found: list[Any] = []
        for chunk in _chunks(list(names), 500):
            found += conn.execute(query.where(jobs.c.job.in_(chunk))).all()
        return sorted(found, key=lambda r: r.job)
    if namespace:
        query = query.where(jobs.c.job.startswith(namespace + ":", autoescape=True))
    return sorted(conn.execute(query).all(), key=lambda r: r.job)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def survey(conn: Connection, target: Target, job_rows: Sequence[Any], now: datetime,
           grace: float = 0.0) -> list[JobState]:
    """Every named job's state at `now`: due range, counts, open rows, missing periods."""
    states = [_plan(row, now, grace) for row in job_rows]
    ready = [s for s in states if s.sched is not None]
    _count_done(conn, target, ready)
    _read_open_rows(conn, ready)
    _read_last_done(conn, ready)
    _read_failure_lines(conn, ready)
    for state in ready:
        _locate_missing(conn, target, state)
    return states


def _plan(row: Any, now: datetime, grace: float) -> JobState:
    """The job's periods at `now`, from its stored schedule: no database needed."""
    state = JobState(row.job, row.kind, row.schedule, row.tz, row.lag, row.max_attempts,
                     float(row.stale_after), row.fires, _utc(row.first_period_start), now,
                     max(1, int(row.shards or 1)))
    try:
        sched = make_schedule(row.schedule if row.kind == "every" else None,
                              row.schedule if row.kind == "cron" else None, row.tz)
        state.sched = sched
        state.first = sched.containing(state.first_period_start)
        running_now = sched.containing(now)
        state.current = sched.shifted(running_now, -row.lag)
        state.next = sched.next(state.current)
        state.next_at = _utc(running_now.end)
        due_last = sched.shifted(sched.containing(now - timedelta(seconds=grace)),
                                 -(row.lag + 1))
        if _utc(due_last.start) >= _utc(state.first.start):
            state.due_last = due_last
            state.expected = gaps.count(sched, state.first, due_last)
    except (SpecError, ValueError, OverflowError) as exc:
        state.sched = None
        state.error = str(exc)
    return state


def _count_done(conn: Connection, target: Target, states: list[JobState]) -> None:
    """done rows in each job's due range: one COUNT over an index range per job, CHUNK jobs
    per statement."""
    due = [s for s in states if s.due_last is not None and s.first is not None]
    for chunk in _chunks(due, CHUNK):
        params: dict[str, Any] = {}
        for i, s in enumerate(chunk):
            assert s.first is not None and s.due_last is not None
            params[f"j{i}"] = s.name
            params[f"a{i}"] = _bind(target, s.first.start)
            params[f"b{i}"] = _bind(target, s.due_last.end)
        for i, n in conn.execute(_done_counts(len(chunk)), params).all():
            chunk[int(i)].done_due = int(n)


@cache
def _done_counts(size: int) -> Executable:
    """done rows of job j_i in [a_i, b_i) for i < size: text, not a Core construct, since a
    compound SELECT of CHUNK terms took SQLAlchemy a tenth of a second to compile, in every
    report (a new process each time)."""
    when = runs.c.period_start.type
    sql = " UNION ALL ".join(
        f"SELECT {i} AS i, count(*) AS n FROM once_runs WHERE job = :j{i} AND status = 'done'"
        f" AND period_start >= :a{i} AND period_start < :b{i}" for i in range(size))
    return text(sql).bindparams(*(bindparam(f"{edge}{i}", type_=when)
                                  for i in range(size) for edge in "ab"))


def _read_open_rows(conn: Connection, states: list[JobState]) -> None:
    """The running and failed rows of the jobs (index once_runs_job_status)."""
    by_name = {s.name: s for s in states}
    for chunk in _chunks(list(by_name), 500):
        query = select(*_RUN_COLUMNS).where(runs.c.job.in_(chunk),
                                            runs.c.status.in_(("running", "failed")))
        for row in conn.execute(query.order_by(runs.c.job, runs.c.period_start)):
            by_name[row.job].open_rows.append(RunRow.of(row))


def _read_last_done(conn: Connection, states: list[JobState]) -> None:
    """Each job's latest done period (by period start): one index seek per job."""
    by_name = {s.name: s for s in states}
    latest = runs.alias("latest")
    newest = (select(func.max(latest.c.period_start))
              .where(latest.c.job == jobs.c.job, latest.c.status == "done")
              .scalar_subquery())
    for chunk in _chunks(list(by_name), 500):
        query = (select(*_RUN_COLUMNS)
                 .select_from(jobs.join(runs, and_(runs.c.job == jobs.c.job,
                                                   runs.c.status == "done",
                                                   runs.c.period_start == newest)))
                 .where(jobs.c.job.in_(chunk)))
        for row in conn.execute(query):
            by_name[row.job].last_done = RunRow.of(row)


def _read_failure_lines(conn: Connection, states: list[JobState]) -> None:
    """The last line of output of each failed row listed: the end of its attempt's stored
    output (primary-key lookups, only where a job has failed rows)."""
    wanted = [(s, r) for s in states for r in s.listed_failures]
    by_key = {(s.name, r.period, r.attempt): s for s, r in wanted}
    for chunk in _chunks(list(by_key), 100):
        match = or_(*(and_(attempts.c.job == job, attempts.c.period == period,
                           attempts.c.attempt == attempt) for job, period, attempt in chunk))
        query = select(attempts.c.job, attempts.c.period, attempts.c.attempt,
                       _output_end(conn).label("output_end")).where(match)
        for row in conn.execute(query):
            state = by_key[(row.job, row.period, row.attempt)]
            state.failure_lines[row.period] = last_line(row.output_end)


# How much of the end of a stored output the reports read to find its last line.
LAST_LINE_SCAN = 2000


def _output_end(conn: Connection) -> Any:
    """SQL for the last LAST_LINE_SCAN characters of once_attempts.output (up to 1 MiB: the
    reports never fetch it whole)."""
    if conn.dialect.name == "sqlite":
        return func.substr(attempts.c.output, -LAST_LINE_SCAN)
    return func.right(attempts.c.output, LAST_LINE_SCAN)


def last_line(output: str | None) -> str | None:
    """The last line the command wrote that says something: after the last newline (or
    carriage return: a progress bar's last state), trailing blank lines skipped; None when
    there is none."""
    if not output:
        return None
    for line in reversed(output.split("\n")):
        text = line.rstrip("\r").rsplit("\r", 1)[-1].strip()
        if text:
            return text
    return None


def _locate_missing(conn: Connection, target: Target, s: JobState) -> None:
    """Count the due periods (with --shards: shards) that have no row; list the first few and
    the last one (once.gaps.GapFinder, as catch-up finds them)."""
    if s.due_last is None or s.first is None or s.sched is None:
        return
    lo, hi = _utc(s.first.start), _utc(s.due_last.end)
    starts = [r.period_start for r in s.open_rows]
    if s.last_done is not None:
        starts.append(s.last_done.period_start)
    finder = gaps.GapFinder(s.sched, s.shards, _Rows(conn, target, s.name),
                            [(r.period_start, r.period) for r in s.open_rows],
                            max(starts, default=None))
    if s.expected is None:  # cron: no count; walk the gaps between the done rows
        listed: list[Unit] = []
        for period, key in finder.units(lo, hi):
            s.no_row += 1
            s.no_row_last = (_utc(period.start), key)
            if len(listed) <= LIST_LIMIT:
                listed.append(s.no_row_last)
            if s.no_row >= WALK_LIMIT:
                s.no_row_at_least = True
                break
        s.no_row_listed = listed
        return
    present = s.done_due + sum(1 for r in s.open_rows if lo <= r.period_start < hi)
    missing = s.expected * s.shards - present
    if missing <= 0:
        return  # every due period has its rows: the common, cheap case
    s.no_row = missing
    s.no_row_listed = [(_utc(p.start), key) for p, key
                       in islice(finder.units(lo, hi, missing), LIST_LIMIT + 1)]
    s.no_row_last = next(((_utc(p.start), key) for p, key
                          in finder.units(lo, hi, missing, backwards=True)), None)


@cache
def _split_counts() -> Executable:
    """Done rows of job in [a0, b0), ..., [a7, b7): one statement, built and compiled once."""
    when = runs.c.period_start.type
    return union_all(*[
        select(literal_column(str(i)).label("i"), func.count().label("n")).where(
            runs.c.job == bindparam("job"), runs.c.status == "done",
            runs.c.period_start >= bindparam(f"a{i}", type_=when),
            runs.c.period_start < bindparam(f"b{i}", type_=when))
        for i in range(gaps.SPLIT)])


class _Rows:
    """once.gaps.Rows for the reports: SQLAlchemy Core, inside the report's snapshot."""

    def __init__(self, conn: Connection, target: Target, job: str) -> None:
        self.conn, self.target, self.job = conn, target, job

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        params: dict[str, Any] = {"job": self.job}
        for i in range(gaps.SPLIT):
            a, b = stretches[i] if i < len(stretches) else (_NEVER, _NEVER)
            params[f"a{i}"], params[f"b{i}"] = _bind(self.target, a), _bind(self.target, b)
        done: dict[Any, Any] = dict(self.conn.execute(_split_counts(), params).all())
        return [int(done.get(i, 0)) for i in range(len(stretches))]

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        found: dict[datetime, set[str]] = {}
        for chunk in _chunks([_bind(self.target, x) for x in starts], 500):
            keys = select(runs.c.period_start, runs.c.period).where(
                runs.c.job == self.job, runs.c.period_start.in_(chunk))
            for at, key in self.conn.execute(keys):
                found.setdefault(_utc(at), set()).add(key)
        return found

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        in_range = and_(runs.c.job == self.job, runs.c.status == "done",
                        runs.c.period_start >= _bind(self.target, lo),
                        runs.c.period_start < _bind(self.target, hi))
        following = func.lead(runs.c.period_start, type_=runs.c.period_start.type).over(
            order_by=runs.c.period_start)
        rows = (select(runs.c.period_start.label("s"), runs.c.period_end.label("e"),
                       following.label("f"))
                .where(in_range).subquery())
        query = (select(rows.c.e, rows.c.f)
                 .where(or_(rows.c.f.is_(None), rows.c.f > rows.c.e))
                 .order_by(rows.c.s))
        first = self.conn.execute(select(func.min(runs.c.period_start)).where(in_range)).scalar()
        return (None if first is None else _utc(first),
                [(_utc(e), None if f is None else _utc(f)) for e, f in self.conn.execute(query)])

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        short = (select(runs.c.period_start)
                 .where(runs.c.job == self.job, runs.c.period_start >= _bind(self.target, lo),
                        runs.c.period_start < _bind(self.target, hi))
                 .group_by(runs.c.period_start).having(func.count() < shards))
        return [_utc(x) for x in self.conn.execute(short.limit(limit)).scalars()]


# -- the commands ----------------------------------------------------------------------------


def _stored(jobs_named: Sequence[str], namespace: str | None) -> list[str]:
    return [f"{namespace}:{j}" if namespace else j for j in jobs_named]


def _load(target: Target, names: Sequence[str] | None, namespace: str | None,
          grace: float = 0.0) -> tuple[list[JobState], datetime]:
    try:
        with _reading(target) as conn:
            return survey_jobs(conn, target, names, namespace, grace)
    except _NoLedger:
        return [], datetime.now(UTC)


def survey_jobs(conn: Connection, target: Target, names: Sequence[str] | None,
                namespace: str | None, grace: float = 0.0) -> tuple[list[JobState], datetime]:
    """The named jobs (all of them, or those of a namespace) at the database's now."""
    now = _db_now(conn, target)
    return survey(conn, target, _select_jobs(conn, names, namespace), now, grace), now


def status(target: Target, jobs_named: Sequence[str], namespace: str | None,
           as_json: bool, timeline: bool = False, last: int | None = None) -> int:
    """`once status`: one row per job; --timeline draws each job's recent periods."""
    names = _stored(jobs_named, namespace)
    states, now = _load(target, names or None, namespace)
    unknown = sorted(set(names) - {s.name for s in states})
    drawings: dict[str, list[tuple[Period, str]]] = {}
    if timeline and states:
        drawings = _timelines(target, states, last)
    if as_json:
        _print(json.dumps(status_objects(states, drawings if timeline else None,
                                         target.redacted), indent=2))
    elif timeline:
        from once import timeline as draw

        draw.render([(s, drawings.get(s.name, [])) for s in states], _tty())
    elif states:
        _render_status(states, now, target)
    elif not unknown:
        _say(f"no jobs in the ledger {target.redacted}"
             + (f" under namespace {namespace}" if namespace else ""))
    for name in unknown:
        _say(f"unknown job {name!r}: no run of it in the ledger {target.redacted}")
    return 2 if unknown else 0


def status_objects(states: Sequence[JobState],
                   drawings: dict[str, list[tuple[Period, str]]] | None = None,
                   ledger: str | None = None) -> list[dict[str, Any]]:
    """The array `once status --json` prints; with drawings, each job's `timeline` too;
    with ledger (a redacted URL), the ledger read, in each object."""
    out = []
    for s in states:
        obj = status_object(s)
        if ledger is not None:
            obj["ledger"] = ledger
        if drawings is not None:
            obj["timeline"] = [{"period": p.key, "start": iso(p.start), "state": cell}
                               for p, cell in drawings.get(s.name, [])]
        out.append(obj)
    return out


def status_object(s: JobState) -> dict[str, Any]:
    """A job's entry in `once status --json`."""
    tz = s.zone
    last = s.last_done

    def at(instant: datetime | None) -> str | None:
        return iso(instant.astimezone(tz)) if instant is not None else None

    return {
        "job": s.name,
        "kind": s.kind,
        "schedule": s.spec,
        "tz": s.tz,
        "lag": s.lag,
        "max_attempts": s.max_attempts,
        "stale_after_s": s.stale_after,
        "first_period": s.first.key if s.first else None,
        "last_done": last.period if last else None,
        "last_finished_at": at(last.finished_at) if last else None,
        "last_duration_s": _round(last.duration) if last else None,
        "running": [
            {"period": r.period, "attempt": r.attempt, "fence": r.fence, "owner": r.owner,
             "started_at": at(r.started_at), "heartbeat_at": at(r.heartbeat_at),
             "heartbeat_age_s": _round(s.heartbeat_age(r)), "stale": s.is_stale(r),
             "stale_after_s": r.stale_after, "due": s.due(r)}
            for r in s.running
        ],
        "failed": len(s.failed),
        "failed_out": sum(1 for r in s.failed if s.failed_out(r)),
        "failed_periods": [
            {"period": r.period, "attempt": r.attempt, "exit_code": r.exit_code,
             "finished_at": at(r.finished_at), "attempts_left": max(0, s.max_attempts - r.attempt),
             "due": s.due(r), "last_line": s.failure_lines.get(r.period)}
            for r in s.failed[:LIST_LIMIT]
        ],
        "last_failure": (
            {"period": failure.period, "attempt": failure.attempt,
             "exit_code": failure.exit_code, "finished_at": at(failure.finished_at),
             "last_line": s.failure_lines.get(failure.period)}
            if (failure := s.last_failure) is not None else None),
        "missing": s.missing,
        "missing_at_least": s.no_row_at_least,
        "missing_periods": s.missing_keys(),
        "missing_last": _last_missing(s),
        "due_through": s.due_last.key if s.due_last else None,
        "current": s.current.key if s.current else None,
        "next": s.next.key if s.next else None,
        "next_at": at(s.next_at),
        "fires": s.fires,
        "error": s.error or None,
    }


def _last_missing(s: JobState) -> str | None:
    candidates = [(r.period_start, r.period) for r in s.stale_due]
    if s.no_row_last is not None:
        candidates.append(s.no_row_last)
    return max(candidates)[1] if candidates else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def check(target: Target, jobs_named: Sequence[str], namespace: str | None, grace: float,
          as_json: bool) -> int:
    """`once check`: the findings, one a line; exit 0, 1 (WARNING), 2 (CRITICAL) or 3
    (UNKNOWN: no job in the ledger, which is more often the wrong ledger than a quiet one)."""
    names = _stored(jobs_named, namespace)
    states, _ = _load(target, names or None, namespace, grace)
    found = findings(states)
    for name in sorted(set(names) - {s.name for s in states}):
        found.append(Finding(CRITICAL, name, "-", "unknown", "no run of this job in the ledger"))
    if not states and not names:
        where = f"namespace {namespace} in " if namespace else ""
        found.append(Finding(UNKNOWN, "", "-", "empty",
                             f"no job has run in {where}the ledger {target.redacted}; is it "
                             f"the one the jobs use? see --db and ONCE_DATABASE_URL"))
    found.sort(key=lambda f: f.order)
    worst = max((f.severity for f in found), default=OK)
    if as_json:
        _print(json.dumps([{**f.as_dict(), "ledger": target.redacted} for f in found],
                          indent=2))
    elif found:
        for f in found:
            _print(f.line)
    else:
        count = len(states)
        _print(f"OK {count} job{'' if count == 1 else 's'}: every due period done "
               f"(ledger {shown(target.redacted)})")
    return worst


@dataclass
class Finding:
    severity: int
    job: str
    period: str  # a key, FIRST..LAST for a range, or - for the job as a whole
    problem: str  # missing, failed, failed-out, stale, unknown, unreadable, empty
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    at: datetime = _NEVER  # for ordering

    @property
    def line(self) -> str:
        """One line, whatever the job, period or owner hold (their controls escaped)."""
        job = shown_word(self.job) or "-"  # "": the ledger as a whole
        text = f"{SEVERITY[self.severity]} {job} {shown_word(self.period)} {self.problem}"
        return f"{text} ({shown(self.detail)})" if self.detail else text

    @property
    def order(self) -> tuple[Any, ...]:
        return (-self.severity, self.job, self.at, self.problem)

    def as_dict(self) -> dict[str, Any]:
        return {"severity": SEVERITY[self.severity], "status": self.severity,
                "job": self.job or None,
                "period": None if self.period == "-" else self.period,
                "problem": self.problem, "detail": self.detail or None, **self.extra,
                "line": self.line}


def findings(states: Sequence[JobState]) -> list[Finding]:
    """What `once check` reports for each job (unsorted)."""
    found: list[Finding] = []
    for s in states:
        if s.sched is None:
            found.append(Finding(CRITICAL, s.name, "-", "unreadable", s.error))
            continue
        found += _missing_findings(s)
        failed = [r for r in s.failed if s.failed_out(r) or s.due(r)]
        found += _capped(s, [_failed_finding(s, r) for r in failed])
        found += _capped(s, [_stale_finding(s, r) for r in s.running if s.is_stale(r)])
    return found


def _missing_findings(s: JobState) -> list[Finding]:
    listed = s.no_row_listed
    out = [Finding(CRITICAL, s.name, key, "missing", at=start)
           for start, key in listed[:LIST_LIMIT]]
    if s.no_row > LIST_LIMIT and len(listed) > LIST_LIMIT and s.no_row_last is not None:
        more = s.no_row - LIST_LIMIT
        (start, first), (_, last) = listed[LIST_LIMIT], s.no_row_last
        word = "at least " if s.no_row_at_least else ""
        noun = "period" if s.shards == 1 else "shard"
        out.append(Finding(CRITICAL, s.name, f"{first}..{last}", "missing",
                           f"{word}{more} more {noun}{'' if more == 1 else 's'}",
                           {"count": more, "first": first, "last": last}, at=start))
    return out


def _failed_finding(s: JobState, r: RunRow) -> Finding:
    out = s.failed_out(r)
    detail = f"attempt {r.attempt} of {s.max_attempts}, exit {r.exit_code}"
    if out:
        detail += ", no attempts left"
    return Finding(CRITICAL, s.name, r.period, "failed-out" if out else "failed", detail,
                   {"attempt": r.attempt, "max_attempts": s.max_attempts,
                    "exit_code": r.exit_code, "due": s.due(r)}, at=r.period_start)


def _stale_finding(s: JobState, r: RunRow) -> Finding:
    age = s.heartbeat_age(r)
    due = s.due(r)
    detail = (f"owner {r.owner}, attempt {r.attempt}, heartbeat {_age(age)} ago, "
              f"stale after {_age(r.stale_after)}")
    return Finding(CRITICAL if due else WARNING, s.name, r.period, "stale", detail,
                   {"owner": r.owner, "attempt": r.attempt, "heartbeat_age_s": _round(age),
                    "due": due}, at=r.period_start)


def _capped(s: JobState, found: list[Finding]) -> list[Finding]:
    """At most LIST_LIMIT findings of one kind, then one range line for the rest."""
    if len(found) <= LIST_LIMIT:
        return found
    rest = found[LIST_LIMIT:]
    first, last = rest[0], rest[-1]
    more = len(rest)
    summary = Finding(max(f.severity for f in rest), s.name, f"{first.period}..{last.period}",
                      first.problem, f"{more} more period{'' if more == 1 else 's'}",
                      {"count": more, "first": first.period, "last": last.period},
                      at=first.at)
    return [*found[:LIST_LIMIT], summary]


def history(target: Target, stored_job: str, limit: int, as_json: bool,
            period: str | None = None) -> int:
    """`once history JOB`: every attempt, newest first."""
    try:
        with _reading(target) as conn:
            found = attempt_entries(conn, target, stored_job, limit, period)
            if found is None:
                raise _NoLedger
            tz, entries = found
    except _NoLedger:
        _say(f"unknown job {stored_job!r}: no run of it in the ledger {target.redacted}")
        return 2
    if as_json:
        _print(json.dumps(entries, indent=2))
    else:
        _render_history(stored_job, tz, entries)
    return 0


def attempt_entries(conn: Connection, target: Target, stored_job: str, limit: int,
                    period: str | None = None) -> tuple[str, list[dict[str, Any]]] | None:
    """The job's zone and its latest attempts, newest first, as `once history --json` shows
    them; None when the job has never run."""
    now = _db_now(conn, target)
    job_rows = _select_jobs(conn, [stored_job], None)
    if not job_rows:
        return None
    job = job_rows[0]
    query = select(*attempt_columns(conn)).where(attempts.c.job == stored_job)
    if period is not None:
        query = query.where(attempts.c.period == period)
    query = query.order_by(attempts.c.started_at.desc(), attempts.c.attempt.desc())
    rows = conn.execute(query.limit(limit)).all()
    holders = _holders(conn, stored_job, {r.period for r in rows})
    try:
        tz: Any = _zone(job.tz)
    except SpecError:
        tz = UTC
    return job.tz, [_attempt_entry(r, holders.get(r.period), now, tz) for r in rows]


def attempt_columns(conn: Connection) -> list[Any]:
    """once_attempts' columns as the history reads them: of the output, only its end."""
    return [*(c for c in attempts.c if c.name != "output"),
            _output_end(conn).label("output_end")]


def _zone(name: str) -> Any:
    from once.periods import zone

    return zone(name)


def _holders(conn: Connection, job: str, periods: set[str]) -> dict[str, RunRow]:
    """The once_runs rows of the periods shown, to tell a live attempt from an abandoned one."""
    found: dict[str, RunRow] = {}
    for chunk in _chunks(sorted(periods), 500):
        query = select(*_RUN_COLUMNS).where(runs.c.job == job, runs.c.period.in_(chunk))
        for row in conn.execute(query):
            found[row.period] = RunRow.of(row)
    return found


def _attempt_entry(row: Any, holder: RunRow | None, now: datetime,
                   tz: Any) -> dict[str, Any]:
    started = _utc(row.started_at)
    finished = _utc(row.finished_at) if row.finished_at is not None else None
    outcome = row.outcome
    if row.status == "running":
        if holder is not None and holder.attempt == row.attempt and holder.status == "running":
            age = (now - holder.heartbeat_at).total_seconds()
            outcome = "stale" if age > holder.stale_after else "running"
        else:
            outcome = "taken-over"  # a later attempt or a rerun took the row; never finished
    return {
        "job": row.job,
        "period": row.period,
        "attempt": row.attempt,
        "fence": row.fence,
        "owner": row.owner,
        "status": row.status,
        "outcome": outcome,
        "started_at": iso(started.astimezone(tz)),
        "finished_at": iso(finished.astimezone(tz)) if finished else None,
        "duration_s": _round((finished - started).total_seconds()) if finished else None,
        "exit_code": row.exit_code,
        "reason": row.reason,
        # What a failed attempt said last (from the end of its stored output).
        "last_line": last_line(row.output_end) if row.status == "failed" else None,
    }


# -- metrics ---------------------------------------------------------------------------------


def metrics(target: Target, namespace: str | None) -> int:
    """`once metrics`: Prometheus text exposition format, for the textfile collector."""
    try:
        with _reading(target) as conn:
            states, _ = survey_jobs(conn, target, None, namespace)
            text = metrics_text(conn, states)
    except _NoLedger:
        text = exposition([], {})
    sys.stdout.write(text)
    return 0


def metrics_text(conn: Connection, states: Sequence[JobState]) -> str:
    """What `once metrics` prints for these jobs (their attempts are counted on conn)."""
    return exposition(states, _attempt_counts(conn, [s.name for s in states]))


@dataclass
class AttemptCounts:
    by_status: dict[str, int] = field(default_factory=dict)
    later: int = 0  # attempts after the first without a rerun reason: retries, takeovers
    reruns: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def _attempt_counts(conn: Connection, names: list[str]) -> dict[str, AttemptCounts]:
    """Per job, from once_attempts: attempts by status, takeovers and reruns."""
    from sqlalchemy import case

    found: dict[str, AttemptCounts] = {n: AttemptCounts() for n in names}
    later = func.sum(case((and_(attempts.c.attempt > 1, attempts.c.reason.is_(None)), 1),
                          else_=0))
    reruns = func.sum(case((attempts.c.reason.is_not(None), 1), else_=0))
    for chunk in _chunks(names, 500):
        query = (select(attempts.c.job, attempts.c.status, func.count(), later, reruns)
                 .where(attempts.c.job.in_(chunk),
                        attempts.c.period != STATE_PERIOD)  # `state --set` ran nothing
                 .group_by(attempts.c.job, attempts.c.status))
        for job, status_, n, n_later, n_reruns in conn.execute(query):
            counts = found[job]
            counts.by_status[status_] = counts.by_status.get(status_, 0) + int(n)
            counts.later += int(n_later or 0)
            counts.reruns += int(n_reruns or 0)
    return found


_METRICS = [
    ("once_job_info", "gauge", "The schedule each job last ran with (always 1)."),
    ("once_last_success_timestamp_seconds", "gauge",
     "When the run of the job's latest done period finished, in Unix time."),
    ("once_last_duration_seconds", "gauge",
     "How long the run of the job's latest done period took."),
    ("once_runs_total", "counter",
     "Attempts by status: done, failed, or running (still running, or never finished: "
     "taken over or abandoned)."),
    ("once_fires_total", "counter", "Claims made: every once run, catch-up and rerun call."),
    ("once_skips_total", "counter",
     "Claims that ran nothing: the period was done, held or failed out (fires - attempts)."),
    ("once_takeovers_total", "counter",
     "Attempts after the first that were not reruns: retries of a failed attempt and "
     "takeovers of a stale one."),
    ("once_reruns_total", "counter", "Attempts started by once rerun."),
    ("once_missing_periods", "gauge",
     "Due periods with no done row, no failed row and no live attempt."),
    ("once_failed_periods", "gauge", "Periods whose row is failed."),
    ("once_failed_out_periods", "gauge", "Failed periods with no attempts left."),
    ("once_running_attempts", "gauge", "Running attempts with a fresh heartbeat."),
    ("once_stale_attempts", "gauge", "Running attempts whose heartbeat is stale."),
]


def exposition(states: Sequence[JobState], counts: dict[str, AttemptCounts]) -> str:
    """The text exposition format: HELP and TYPE once per metric, then its samples."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {m[0]: [] for m in _METRICS}
    for s in states:
        job = {"once_job": s.name}
        c = counts.get(s.name, AttemptCounts())
        samples["once_job_info"].append(
            ({**job, "kind": s.kind, "schedule": s.spec, "tz": s.tz}, 1))
        last = s.last_done
        if last is not None and last.finished_at is not None:
            samples["once_last_success_timestamp_seconds"].append(
                (job, last.finished_at.timestamp()))
            samples["once_last_duration_seconds"].append((job, last.duration or 0.0))
        for state in ("done", "failed", "running"):
            samples["once_runs_total"].append(
                ({**job, "status": state}, c.by_status.get(state, 0)))
        samples["once_fires_total"].append((job, s.fires))
        samples["once_skips_total"].append((job, max(0, s.fires - c.total)))
        samples["once_takeovers_total"].append((job, c.later))
        samples["once_reruns_total"].append((job, c.reruns))
        samples["once_missing_periods"].append((job, s.missing))
        samples["once_failed_periods"].append((job, len(s.failed)))
        samples["once_failed_out_periods"].append(
            (job, sum(1 for r in s.failed if s.failed_out(r))))
        running = s.running
        stale = sum(1 for r in running if s.is_stale(r))
        samples["once_running_attempts"].append((job, len(running) - stale))
        samples["once_stale_attempts"].append((job, stale))
    lines = []
    for name, kind, help_text in _METRICS:
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples[name]:
            body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{body}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


# -- output ----------------------------------------------------------------------------------


def _tty() -> bool:
    return sys.stdout.isatty()


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")


def _say(message: str) -> None:
    print(f"once: {shown(message)}", file=sys.stderr)


def _age(seconds: float) -> str:
    """A short duration: 42s, 5m, 3h 12m, 2d 4h."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def _took(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 60 else _age(seconds)


Cell = tuple[str, str]  # (text, rich style; "" for none)

STATUS_HEADERS = ["JOB", "SCHEDULE", "TZ", "LAST DONE", "FINISHED", "TOOK", "RUNNING",
                  "FAILED", "MISSING", "NEXT"]


def status_cells(s: JobState, now: datetime) -> list[Cell]:
    """One row of the status table."""
    if s.sched is None:
        return [(s.name, "bold"), (s.schedule_text, ""), (s.tz, ""),
                (f"cannot read the schedule: {s.error}", "red"), *[("", "")] * 6]
    last = s.last_done
    running = s.running
    if running:
        r = running[-1]
        stale = s.is_stale(r)
        text = (f"{r.period} {r.owner} #{r.attempt}, beat {_age(s.heartbeat_age(r))} ago"
                + (" STALE" if stale else ""))
        if len(running) > 1:
            text += f" (+{len(running) - 1})"
        run_cell: Cell = (text, "bold yellow" if any(s.is_stale(x) for x in running) else "cyan")
    else:
        run_cell = ("-", "")
    failed = s.failed
    out = sum(1 for r in failed if s.failed_out(r))
    failed_cell: Cell = (f"{len(failed)}" + (f" ({out} out)" if out else ""),
                         "bold red" if failed else "")
    missing = s.missing
    keys = s.missing_keys(1)
    missing_text = str(missing) + ("+" if s.no_row_at_least else "")
    if keys:
        missing_text += f" from {keys[0]}"
    next_text = "-"
    if s.next is not None and s.next_at is not None:
        next_text = f"{s.next.key} in {_age((s.next_at - now).total_seconds())}"
    return [
        (s.name, "bold"),
        (s.schedule_text, ""),
        (s.tz, ""),
        (last.period if last else "never", "green" if last else "yellow"),
        (f"{_age((now - last.finished_at).total_seconds())} ago"
         if last and last.finished_at else "-", ""),
        (_took(last.duration) if last else "-", ""),
        run_cell,
        failed_cell,
        (missing_text, "bold red" if missing else ""),
        (next_text, ""),
    ]


def _render_status(states: Sequence[JobState], now: datetime, target: Target) -> None:
    rows = [status_cells(s, now) for s in states]
    caption = f"ledger: {target.redacted}"  # which ledger: the wrong one looks empty or stale
    if _tty():
        render_rich(STATUS_HEADERS, rows, caption=caption)
    else:
        _print(plain_table(STATUS_HEADERS, rows) + "\n\n" + shown(caption))


HISTORY_HEADERS = ["PERIOD", "ATTEMPT", "FENCE", "OWNER", "STARTED", "FINISHED", "TOOK",
                   "STATUS", "EXIT", "REASON", "LAST LINE"]
PLAIN_LAST_LINE = 200  # characters of LAST LINE when not on a terminal (there: its width)


def _render_history(job: str, tz: str, entries: list[dict[str, Any]]) -> None:
    style = {"done": "green", "failed": "bold red", "timed-out": "bold red",
             "exec-failed": "bold red", "interrupted": "red", "stale": "bold yellow",
             "running": "cyan", "taken-over": "yellow"}

    def local(text: str | None) -> str:
        return text[:19].replace("T", " ") if text else "-"

    rows = [[(e["period"], ""), (str(e["attempt"]), ""), (str(e["fence"]), ""),
             (e["owner"], ""), (local(e["started_at"]), ""), (local(e["finished_at"]), ""),
             (_took(e["duration_s"]), ""), (_status_word(e), style.get(
                 e["status"] if e["outcome"] in _PLAIN_OUTCOMES else e["outcome"], "")),
             ("-" if e["exit_code"] is None else str(e["exit_code"]), ""),
             (e["reason"] or "", ""), (e["last_line"] or "", "")] for e in entries]
    headers = [*HISTORY_HEADERS]
    headers[4] = f"STARTED ({tz})"
    if _tty():
        render_rich(headers, rows, title=job, cut=len(headers) - 1)
    else:
        for row in rows:
            row[-1] = (_cut(row[-1][0], PLAIN_LAST_LINE), "")
        _print(plain_table(headers, rows))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


# Outcomes that say no more than the status itself (older ledgers stored `exited`).
_PLAIN_OUTCOMES = (None, "exited", "done", "failed")


def _status_word(entry: dict[str, Any]) -> str:
    """done, failed, failed (timed-out), running, stale, taken-over."""
    status_, outcome = entry["status"], entry["outcome"]
    if status_ == "running":
        return str(outcome)
    return status_ if outcome in _PLAIN_OUTCOMES else f"{status_} ({outcome})"


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """Columns aligned with spaces: no colour, no box drawing, one line a row."""
    table = [list(headers), *[[shown(text) for text, _ in row] for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in table)


def render_rich(headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str = "",
                caption: str = "", cut: int | None = None) -> None:
    """A table for the terminal; the column numbered `cut` is one line each, cut short
    (…) to what the terminal's width leaves it, where the others fold."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    cells = [[shown(text) for text, _ in row] for row in rows]
    # Text objects, never strings: rich would read a job named `x[/]y` or `[link=…]` as markup.
    table = Table(box=box.SIMPLE_HEAD, title=Text(shown(title)) if title else None,
                  caption=Text(shown(caption)) if caption else None,
                  header_style="bold", title_justify="left", caption_justify="left")
    for number, header in enumerate(headers):
        if number == cut:
            others = sum(max([len(header_), *(len(row[i]) for row in cells)]) + 3
                         for i, header_ in enumerate(headers) if i != cut)
            table.add_column(Text(header), overflow="ellipsis", no_wrap=True,
                             max_width=max(len(header), console.width - others - 4))
        else:
            table.add_column(Text(header), overflow="fold")
    for row, texts in zip(rows, cells, strict=True):
        table.add_row(*[Text(text, style=style)
                        for text, (_, style) in zip(texts, row, strict=True)])
    console.print(table)


# -- timelines -------------------------------------------------------------------------------

# How many periods --timeline shows by default, per spec.
DEFAULT_LAST = {"minute": 180, "hour": 168, "day": 91, "week": 52, "month": 24,
                "quarter": 12, "year": 10}
MAX_LAST = 20_000


def default_last(s: JobState) -> int:
    if s.kind != "every":
        return 60
    if s.spec in DEFAULT_LAST:
        return DEFAULT_LAST[s.spec]
    n, unit = int(s.spec[:-1]), s.spec[-1]
    return 7 * 24 // n if unit == "h" else 6 * 60 // n


def _timelines(target: Target, states: Sequence[JobState],
               last: int | None) -> dict[str, list[tuple[Period, str]]]:
    """Each job's latest periods, up to the one `once run` claims now, and their state:
    done, failed, missing, running, stale, pending (not due yet) or none (before the first)."""
    with _reading(target) as conn:
        return {s.name: timeline_cells(conn, target, s, last) for s in states}


def timeline_cells(conn: Connection, target: Target, s: JobState,
                   last: int | None) -> list[tuple[Period, str]]:
    """The job's `last` latest periods (default_last when None) and their states, oldest
    first, as `once status --timeline` draws them."""
    if s.sched is None or s.current is None:
        return []
    count = min(max(1, last or default_last(s)), MAX_LAST)
    periods = [s.current]
    first = _utc(s.first.start) if s.first is not None else _NEVER
    while len(periods) < count and _utc(periods[-1].start) > first:
        periods.append(s.sched.previous(periods[-1]))  # not before the job's first period
    periods.reverse()
    query = select(runs.c.period, runs.c.status, runs.c.heartbeat_at,
                   runs.c.stale_after).where(
        runs.c.job == s.name,
        runs.c.period_start >= _bind(target, periods[0].start),
        runs.c.period_start < _bind(target, periods[-1].end))
    rows: dict[str, list[Any]] = {}
    for row in conn.execute(query):
        rows.setdefault(row.period.partition("#")[0], []).append(row)
    return [(p, _cell(s, p, rows.get(p.key, []))) for p in periods]


def _cell(s: JobState, period: Period, rows: list[Any]) -> str:
    """A period's state; with --shards, the worst of its shards' (a shard without a row is
    missing once the period is due)."""
    start = _utc(period.start)
    due = s.due_last is not None and start <= _utc(s.due_last.start)
    states = set()
    for row in rows:
        if row.status == "running":
            age = (s.now - _utc(row.heartbeat_at)).total_seconds()
            states.add("stale" if age > float(row.stale_after) else "running")
        else:
            states.add(str(row.status))
    if len(rows) < s.shards:
        states.add("missing" if due else "pending")
    if not rows and (s.first is None or start < _utc(s.first.start)):
        return "none"
    for state in ("stale", "failed", "missing", "running", "pending"):
        if state in states:
            return state
    return "done"

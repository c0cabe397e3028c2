"""What the ledger answers and how it fails: the records `Job` and `Claim`, the errors
(`LedgerError`, `ClockSkew`, `CommandDrift`), and the rules that read a driver's exception
(transient or not, a busy server, a table or column not created yet), for every dialect.

Imports only the stdlib, once.outcomes (the words of a status) and once.frozen: the rules
look at an exception's class names, SQLSTATE, error code or text, never at a driver's classes,
so that no driver is loaded to classify its errors.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from once import outcomes
from once.frozen import Frozen
from once.outcomes import Skip

# The ledger's schema version (once_meta), which once.ledger.schema creates and upgrades to.
# 2: shards, state, state_version, command_hash; 3: once_runs.stale_after;
# 4: once_attempts.output
SCHEMA_VERSION = 4


def db_time(dialect: str, instant: datetime) -> Any:
    """An instant as the dialect's column holds it: UTC; naive outside PostgreSQL; on SQLite
    the text SQLAlchemy writes, the year in four digits (strftime('%Y') gives '1' for the year
    1, which no reader could parse and which sorts after 2026)."""
    at = instant.astimezone(UTC)
    if dialect == "postgresql":
        return at
    at = at.replace(tzinfo=None)
    return at.isoformat(" ", "microseconds") if dialect == "sqlite" else at


def from_db_time(value: datetime) -> datetime:
    """A time as a driver hands it back, as an aware UTC datetime: SQLite and MySQL give
    naive UTC, PostgreSQL an aware time in the session's zone."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# -- what the ledger answers -----------------------------------------------------------------


class Job(Frozen):
    """A job as `once run` sees it: its stored name and the schedule it last ran with."""

    name: str
    kind: str  # "every" or "cron"
    schedule: str
    tz: str
    lag: int
    max_attempts: int
    stale_after: float
    shards: int

    def __init__(self, name: str, kind: str, schedule: str, tz: str, lag: int = 0,
                 max_attempts: int = 3, stale_after: float = 300.0, shards: int = 1) -> None:
        self._set(name=name, kind=kind, schedule=schedule, tz=tz, lag=lag,
                  max_attempts=max_attempts, stale_after=stale_after, shards=shards)


class Claim(Frozen):
    """The answer to a claim: won (attempt and fence are ours) or skipped, and why."""

    won: bool
    attempt: int
    fence: int
    status: str  # skipped: the row's status as found
    owner: str  # skipped: who holds it
    heartbeat_age: float | None  # skipped: seconds since its last heartbeat
    state: str | None  # won: the job's watermark as the claim found it
    state_version: int  # won: its version, for the compare-and-set of the finish
    stale_after: float | None  # skipped: the holder's own --stale-after (its promise)

    def __init__(self, won: bool, attempt: int, fence: int, status: str = "running",
                 owner: str = "", heartbeat_age: float | None = None, state: str | None = None,
                 state_version: int = 0, stale_after: float | None = None) -> None:
        self._set(won=won, attempt=attempt, fence=fence, status=status, owner=owner,
                  heartbeat_age=heartbeat_age, state=state, state_version=state_version,
                  stale_after=stale_after)

    @property
    def skip_reason(self) -> Skip:
        """`skipped-done`, `skipped-held` or `skipped-failed` (attempts used up)."""
        return outcomes.skip(self.status)


def lost_claim(row: tuple[Any, ...] | None) -> Claim:
    """A lost claim, as the row that beat it stood (None: a claimer we cannot see yet)."""
    if row is None:
        return Claim(False, 0, 0, "running", "another process", 0.0)
    status, attempt, fence, owner, age, stale_after = row
    return Claim(False, attempt, fence, status, owner, None if age is None else float(age),
                 stale_after=None if stale_after is None else float(stale_after))


# -- how it fails ----------------------------------------------------------------------------


class LedgerError(Exception):
    """The ledger could not be reached, or answered with an error (exit 75).

    `transient`: the connection failed (worth a retry on a fresh one); otherwise the database
    refused the statement itself, and the same statement would be refused again.
    """

    transient = True


class ClockSkew(LedgerError):
    """The host's clock and the database's disagree by more than --max-clock-skew: a period
    computed from the host's clock could be the wrong one, so nothing was claimed (exit 75)."""

    transient = False


class CommandDrift(Exception):
    """--require-same-command: the job's latest attempt ran another command line (exit 2).
    Decided inside the claim, under the job row's lock, so that two hosts cannot both pass;
    raised from inside the claim's transaction, which it rolls back (nothing is written)."""

    def __init__(self, job: str, last: str, ours: str) -> None:
        super().__init__(f"job {job} last ran a different command (fingerprint {last}, this "
                         f"one {ours}): rename the job or drop --require-same-command")
        self.last, self.ours = last, ours


def skew_refusal(params: dict[str, Any], db_minus_host: float) -> ClockSkew:
    """The one-line refusal of a claim whose host clock disagrees with the database's."""
    host = params["host_now"]
    host = host if isinstance(host, datetime) else datetime.fromisoformat(str(host))
    host = from_db_time(host)  # as it was bound: naive UTC on SQLite and MySQL
    database = host + timedelta(seconds=db_minus_host)
    return ClockSkew(
        f"this host's clock ({host:%Y-%m-%d %H:%M:%S} UTC) and the database's "
        f"({database:%Y-%m-%d %H:%M:%S} UTC) disagree by {abs(db_minus_host):.0f}s, more than "
        f"--max-clock-skew {params['max_skew']:g}s: the period would be computed from a wrong "
        f"clock, so nothing was claimed; fix the host's clock (NTP)")


def describe(exc: BaseException) -> str:
    """The first line of an error, for a one-line `once:` message."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- reading a driver's exception --------------------------------------------------------------

# DB-API: OperationalError and InterfaceError are the connection's; DataError,
# IntegrityError, ProgrammingError and friends are the statement's.
_TRANSIENT = {"OperationalError", "InterfaceError", "ConnectionTimeout", "TimeoutError"}


def transient(exc: BaseException) -> bool:
    """The connection failed (a retry on a fresh one may succeed), not the statement."""
    return isinstance(exc, OSError) or any(cls.__name__ in _TRANSIENT
                                           for cls in type(exc).__mro__)


# Connection refusals that say "not now" rather than "never": out of connections, starting
# up or shutting down, or (during a restart) nobody listening yet.
_BUSY_SQLSTATES = {"53300", "57P03"}  # too_many_connections, cannot_connect_now
_BUSY_MYSQL = {1040, 1203, 1226}  # too many connections; per-user limits
_BUSY_TEXT = ("too many clients", "too many connections", "no more connections allowed",
              "the database system is starting up", "the database system is shutting down",
              "connection refused")


def busy_server(exc: BaseException) -> bool:
    """A failure to connect that a retry a moment later may not meet (see _BUSY_*)."""
    if getattr(exc, "sqlstate", None) in _BUSY_SQLSTATES or error_code(exc) in _BUSY_MYSQL:
        return True
    if isinstance(exc, ConnectionRefusedError):
        return True
    text = str(exc).lower()
    return any(words in text for words in _BUSY_TEXT)


def error_code(exc: BaseException) -> int | None:
    """A MySQL/MariaDB error's number (PyMySQL's first argument); None for other drivers."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


# A statement that names a table or a column the ledger does not have yet (its first use, or
# a schema older than this once's), as each driver says it.
_UNDEFINED_SQLSTATES = {"42P01": "table", "42703": "column"}  # PostgreSQL
_UNDEFINED_MYSQL = {1146: "table", 1054: "column"}  # MySQL, MariaDB
_UNDEFINED_SQLITE = {"no such table": "table", "no such column": "column",
                     "has no column": "column"}


def schema_missing(dialect: str, exc: BaseException, columns: bool = True) -> bool:
    """The statement failed for a table (or, with `columns`, a column) that is not there yet:
    once.ledger.schema creates or upgrades the tables, then the statement is tried again (or,
    for a read, nothing has run yet). `exc` is the driver's exception."""
    if dialect == "postgresql":
        missing = _UNDEFINED_SQLSTATES.get(getattr(exc, "sqlstate", None) or "")
    elif dialect == "mysql":
        missing = _UNDEFINED_MYSQL.get(error_code(exc) or 0)
    else:
        text = str(exc)
        missing = next((what for words, what in _UNDEFINED_SQLITE.items() if words in text),
                       None)
    return missing == "table" or (columns and missing == "column")

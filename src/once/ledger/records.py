"""What the ledger answers and how it fails: the records `Job` and `Claim`, the errors
(`LedgerError`, `ClockSkew`, `CommandDrift`), the rules that read a driver's exception the
same for every dialect (a busy server, a read-only one; each dialect's own are in
once.ledger.errors), and how a tail of output is cut to what the ledger takes (`cut_tail`).

Imports only the stdlib, once.outcomes (the words of a status) and once.frozen: the rules
look at an exception's SQLSTATE, error code or text, never at a driver's classes, so that no
driver is loaded to classify its errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal, TypeGuard

from once import outcomes
from once.frozen import Frozen
from once.outcomes import Skip

if TYPE_CHECKING:
    from once.ledger.dbapi import Params, Row

# The ledger's schema version (once_meta), which once.ledger.schema creates and upgrades to.
# 2: shards, state, state_version, command_hash; 3: once_runs.stale_after;
# 4: once_attempts.output; 5: once_jobs.fires renamed fire_count (older claims refused) and
# last_fire_at last_fired_at (older prunes refused), once_attempts.claim_id required (older
# `state --set` refused), every claim checks the version (docs/how-to/upgrading.md),
# once_runs.interrupted
SCHEMA_VERSION = 5

# How long a command outside the hot path waits for a lock another session holds (the schema
# lock, a table's behind an open transaction or a `LOCK TABLE`, a row's): a creation, upgrade
# or prune (once.ledger.schema) and the reports' reads (once.ledger.fleet, once.report) alike;
# as long as MySQL's schema lock, GET_LOCK, waits. Without it PostgreSQL and MySQL's metadata
# locks wait for ever: a first use whose commit waited for a synchronous standby that is down
# held every later first use behind its schema lock, and `once check` hung behind a table's.
LOCK_WAIT = 60.0


def lock_wait_said(lock: str, limit: float) -> str:
    """The words for a statement that gave up waiting on `lock`'s lock at `limit` seconds."""
    return f"waited on {lock}'s lock held by another session past {limit:g}s"


def schema_gate(integer: str) -> str:
    """A condition that holds while the ledger's schema is not newer than this once's: every
    write that starts something (a claim, `once state --set`) carries it in its own statement,
    so that a ledger a newer once has upgraded refuses us at no extra round trip
    (docs/how-to/upgrading.md). `integer`: the dialect's name for the cast."""
    return (f"COALESCE((SELECT CAST(value AS {integer}) FROM once_meta "
            f"WHERE name = 'schema_version'), 0) <= {SCHEMA_VERSION}")


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
    no_overlap: bool  # --no-overlap: never claim while another period's attempt lives

    def __init__(self, name: str, kind: str, schedule: str, tz: str, lag: int = 0,
                 max_attempts: int = 3, stale_after: float = 300.0, shards: int = 1,
                 no_overlap: bool = False) -> None:
        self._set(name=name, kind=kind, schedule=schedule, tz=tz, lag=lag,
                  max_attempts=max_attempts, stale_after=stale_after, shards=shards,
                  no_overlap=no_overlap)


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
    claim_id: str  # won: the identity renewals and the finish match the row on
    # skipped by --no-overlap (status "overlap"): the other period whose live attempt it met
    held_period: str
    capped: bool  # skipped: this claim recorded a stale row failed (attempt_cap)
    interrupted: int  # skipped: how many of the row's attempts ended interrupted

    def __init__(self, won: bool, attempt: int, fence: int, status: str = "running",
                 owner: str = "", heartbeat_age: float | None = None, state: str | None = None,
                 state_version: int = 0, stale_after: float | None = None,
                 claim_id: str = "", held_period: str = "", capped: bool = False,
                 interrupted: int = 0) -> None:
        self._set(won=won, attempt=attempt, fence=fence, status=status, owner=owner,
                  heartbeat_age=heartbeat_age, state=state, state_version=state_version,
                  stale_after=stale_after, claim_id=claim_id, held_period=held_period,
                  capped=capped, interrupted=interrupted)

    @property
    def skip_reason(self) -> Skip:
        """`skipped-done`, `skipped-held`, `skipped-failed` (attempts used up) or
        `skipped-overlap` (--no-overlap: another period's attempt lives)."""
        return outcomes.skip(self.status)


def new_claim_id() -> str:
    """A claim's identity: 64 random bits, as hex (once_runs.claim_id)."""
    return os.urandom(8).hex()


def overlap_claim(row: Row) -> Claim:
    """A claim that --no-overlap gave up: the live attempt of another period, as
    (period, owner, attempt, fence, heartbeat age, stale_after)."""
    period, owner, attempt, fence, age, stale_after = row
    return Claim(False, attempt, fence, "overlap", owner, None if age is None else float(age),
                 stale_after=float(stale_after), held_period=period)


def lost_claim(row: Row | None, capped: bool = False) -> Claim:
    """A lost claim, as the row that beat it stood (HOLDER's columns; None: a claimer we
    cannot see yet); capped: the claim has just recorded that row failed (attempt_cap)."""
    if row is None:
        return Claim(False, 0, 0, "running", "another process", 0.0)
    status, attempt, fence, owner, age, stale_after, interrupted = row
    return Claim(False, attempt, fence, "failed" if capped else status, owner,
                 None if age is None else float(age),
                 stale_after=None if stale_after is None else float(stale_after), capped=capped,
                 interrupted=int(interrupted or 0))


# docs/concepts/liveness.md: the bound on a period's attempts of any cause (once.outcomes).
ATTEMPTS_IN_ALL = outcomes.ATTEMPTS_IN_ALL


def attempt_cap(max_attempts: int) -> int:
    """The most attempts a period gets, of any cause (docs/concepts/liveness.md)."""
    return ATTEMPTS_IN_ALL * max_attempts


def used_up_line(attempt: int, interrupted: int, max_attempts: int) -> str:
    """The words of a skip of a failed row with no attempts left (outcomes.attempts_left)."""
    if attempt - interrupted >= max_attempts:
        spent = f"failed {attempt - interrupted} times"
        if interrupted:
            spent += f" (and {interrupted} interrupted)"
        return f"{spent}, no attempts left of --max-attempts {max_attempts}"
    return (f"{attempt} attempts, {interrupted} of them interrupted, and a period gets at most "
            f"{ATTEMPTS_IN_ALL} x --max-attempts {max_attempts} attempts in all: no attempts "
            f"left")


def capped_line(attempt: int, max_attempts: int) -> str:
    """The words of a claim that recorded a stale row failed (attempt_cap)."""
    return (f"attempt {attempt} went stale without a result, and a period gets at most "
            f"{ATTEMPTS_IN_ALL} x --max-attempts {max_attempts} attempts in all: recorded "
            f"failed, not run again (once rerun runs it again)")


def cappable(row: Row | None, params: Params) -> TypeGuard[Row]:
    """Whether a claim that lost to `row` (HOLDER's columns) records it failed: a running row
    past its owner's promise that has had its attempt_cap attempts (the SQL checks again)."""
    if row is None or params["rerun"]:
        return False
    status, attempt, _fence, _owner, age, stale_after, _interrupted = row
    return (status == "running" and attempt >= params["attempt_cap"] and age is not None
            and float(age) > float(stale_after))


def beaten(row: Row, max_attempts: int, rerun: bool) -> bool:
    """Whether a claim of ours could not take the row as the holder's read (status, attempt,
    fence, owner, heartbeat age, stale_after, interrupted) found it: a running row within its
    owner's promise; without a rerun, a done row or a failed one with no attempt left
    (outcomes.attempts_left). The takeover's condition turned round, for a claim that decides
    from a read alone (MySQL, after a conflict)."""
    status, attempt, _, _, age, stale_after, interrupted = row
    if status == "running":
        return age is None or float(age) <= float(stale_after)
    return not rerun and (status == "done" or outcomes.attempts_left(
        int(attempt), int(interrupted or 0), max_attempts) == 0)


# -- how it fails ----------------------------------------------------------------------------

# Whether a retry may cure a failure (LedgerError.failure).
Failure = Literal["unreachable", "transient", "unfit", "slow", "permanent"]


class LedgerError(Exception):
    """The ledger could not be reached, or answered with an error (exit 75).

    `failure` (records.failure) says whether a retry may cure it: `unreachable` (the
    connection failed) and `transient` (the server said "not now": busy, a lock, a deadlock, a
    failover) may pass on a fresh connection; `unfit` (a value the server cannot take as sent:
    too large for its packet or column, or outside the column's charset) and `slow` (a
    statement timeout) may pass with less in it (a finish cuts its tail, once.run.attempt);
    `permanent` is refused again whatever the retry. `cause` is the driver's own first line.
    A LedgerError once raises itself is permanent.
    """

    failure: Failure = "permanent"
    cause: str = ""
    lock: str = ""  # what the statement waited on until its bound, held by another session

    def __str__(self) -> str:
        """The message, scrubbed of the ledger's secrets (once.secrets): the Python API
        raises it as it is."""
        from once.secrets import scrub

        return scrub(super().__str__())

    @property
    def transient(self) -> bool:
        """Worth the same statement again, on a fresh connection."""
        return self.failure in ("unreachable", "transient")


class ClockSkew(LedgerError):
    """The host's clock and the database's disagree by more than --max-clock-skew: a period
    computed from the host's clock could be the wrong one, so nothing was claimed (exit 75)."""


class CommandDrift(Exception):
    """--require-same-command: the job's latest attempt ran another command line (exit 2).
    Decided inside the claim, under the job row's lock, so that two hosts cannot both pass;
    raised from inside the claim's transaction, which it rolls back (nothing is written)."""

    def __init__(self, job: str, last: str, ours: str) -> None:
        super().__init__(f"job {job} last ran a different command (fingerprint {last}, this "
                         f"one {ours}): rename the job or drop --require-same-command")
        self.last, self.ours = last, ours


def newer_schema(version: int) -> LedgerError:
    """The refusal of a ledger that a newer once has upgraded: its rules are not ours."""
    error = LedgerError(
        f"the ledger's schema is version {version}, newer than this once knows "
        f"({SCHEMA_VERSION}): upgrade once")
    error.failure = "permanent"
    return error


def skew_refusal(params: Params, db_minus_host: float) -> ClockSkew:
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
    """The first line of an error, for a one-line `once:` message: scrubbed where the
    driver's text enters (once.secrets), since a driver may quote the password (psycopg's
    `invalid percent-encoded token: "…"`) and the Python API raises this text as it is."""
    from once.secrets import scrub

    if isinstance(exc, UnicodeEncodeError):  # its character and position: a password's?
        return f"{exc.encoding!r} codec can't encode a character of what was sent: {exc.reason}"
    text = scrub(str(exc)).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- reading a driver's exception --------------------------------------------------------------

# A server that refuses writes for now: a PostgreSQL standby (25006 read_only_sql_transaction
# for a write; 55000 "recovery is in progress" for the WAL functions), which a failover
# promotes within seconds. A renewal or a final write that meets one (haproxy sending it there
# while the primary is down, say) is retried until its deadline, as a lost connection is; a
# claim says in its line that the server is a standby (docs/how-to/high-availability.md).
_READ_ONLY_SQLSTATES = {"25006"}
_READ_ONLY_TEXT = ("read-only transaction", "recovery is in progress")


def read_only_server(exc: BaseException) -> bool:
    """The server refused a write as a standby, or as a session that is read-only, does."""
    if getattr(exc, "sqlstate", None) in _READ_ONLY_SQLSTATES:
        return True
    text = str(exc).lower()
    return any(words in text for words in _READ_ONLY_TEXT)


# Connection refusals that say "not now" rather than "never": out of connections, starting
# up or shutting down, or (during a restart) nobody listening yet.
_BUSY_SQLSTATES = {"53300", "57P03"}  # too_many_connections, cannot_connect_now
_BUSY_MYSQL = {1040, 1203, 1226}  # too many connections; per-user limits
_BUSY_TEXT = ("too many clients", "too many connections", "no more connections allowed",
              "remaining connection slots are reserved",
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


# -- what the ledger takes of a tail ---------------------------------------------------------


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def cut_tail(output: str, budget: int, why: str,
             cost: Callable[[str], int] = utf8_size) -> str:
    """`output` as it fits in `budget` (bytes, by `cost`: its UTF-8 by default): whole when it
    fits, else its end, cut at a character boundary, after a first line that says so:
    `[once: N bytes cut from the start of this tail: WHY]` (N bytes of UTF-8). The line alone
    when the budget holds no more (0: keep none of the tail)."""
    if cost(output) <= budget:
        return output
    note = _cut_note(utf8_size(output), why)
    room = budget - cost(note)  # the note of the longest cut: any shorter one fits too
    if room < cost(output[-1:]):
        return note
    # The first character from which the rest fits: the cost shrinks as the start moves on.
    lo, hi = 1, len(output)
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(output[mid:]) <= room:
            hi = mid
        else:
            lo = mid + 1
    # The note of this cut may be shorter (fewer digits): it may leave room for a little more.
    while lo > 1 and cost(_cut_note(utf8_size(output[:lo - 1]), why) + output[lo - 1:]) <= budget:
        lo -= 1
    return _cut_note(utf8_size(output[:lo]), why) + output[lo:]


def _cut_note(cut: int, why: str) -> str:
    return f"[once: {cut} bytes cut from the start of this tail: {why}]\n"

"""The ledger as `once run` speaks to it: every statement of the hot path, per dialect.

This module talks to the database through the driver alone (sqlite3, psycopg 3, PyMySQL):
importing SQLAlchemy costs about 200 ms per cron fire. SQLAlchemy Core owns the tables and
their DDL (`once.schema`); when a statement here finds a table or column missing, the ledger
asks `once.schema` to create or upgrade them once and tries again.

Every time stored comes from the database's clock, so hosts with skewed clocks agree on
staleness. Every decision is fenced:

- a claim inserts the `(job, period)` row, or takes over a row that is `failed` with attempts
  left or `running` with a stale heartbeat; the takeover's WHERE clause holds the very condition
  the winner destroys, so of any number of concurrent claimers exactly one wins;
- the job's fence counter in `once_jobs` is bumped in the claim's own transaction, so fences
  grow strictly per job whatever the period or the machine (and claims of one job serialise on
  that row, which also keeps MariaDB free of insert deadlocks);
- a renewal or a finish names the attempt it owns and status `running`; zero rows means the
  claim was lost.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from once import limits

Dialect = Literal["sqlite", "postgresql", "mysql"]
Status = Literal["done", "failed"]
T = TypeVar("T")

TABLES = ("once_runs", "once_attempts", "once_jobs", "once_meta")


class UrlError(limits.InputError):
    """A --db URL that names no ledger once can use (a usage error, exit 2)."""


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


# -- where the ledger lives ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A parsed --db URL: which driver, how to connect, and how to name it in messages."""

    dialect: Dialect
    url: str
    redacted: str
    connect_args: dict[str, Any] = field(default_factory=dict)
    path: str = ""  # SQLite only

    @property
    def sqlalchemy_url(self) -> str:
        """The same ledger as a SQLAlchemy URL with the driver once uses."""
        scheme, _, rest = self.url.partition("://")
        driver = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}
        if scheme.split("+")[0] == "mariadb":
            driver["mysql"] = "mariadb+pymysql"
        return f"{driver[self.dialect]}://{rest}"


def default_url() -> str:
    """The embedded default: a SQLite file under $XDG_STATE_HOME/once/."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return "sqlite:///" + os.path.join(state, "once", "ledger.db")


def create_private(target: Target) -> None:
    """Create the default SQLite ledger's directory (0700) and file (0600), the user's alone:
    they hold job names, owners and watermarks. What already exists keeps its mode; SQLite
    gives the -wal and -shm files, and once the .locks file, the ledger's mode."""
    if target.dialect != "sqlite" or target.url != default_url():
        return
    os.makedirs(os.path.dirname(target.path), mode=0o700, exist_ok=True)
    with suppress(FileExistsError):
        os.close(os.open(target.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o600))


def parse_url(url: str, password: str | None = None) -> Target:
    """Read a SQLAlchemy-style URL; `password` (from --db-password-file) overrides the URL's."""
    scheme = url.partition("://")[0].lower()
    base = scheme.split("+")[0]
    if not url.isprintable():  # a control character, or bytes that are not UTF-8
        raise UrlError(f"bad --db URL {redact(url)!r}: it holds a control character or "
                       f"bytes that are not UTF-8")
    if "://" not in url:
        raise UrlError(f"bad --db URL '{url}': expected sqlite:///PATH, postgresql://… or mysql://…")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # [::1 without its bracket, [zz]: the host is malformed
        raise UrlError(f"bad host in --db URL {redact(url)}: {exc}") from None
    if base == "sqlite":
        return _sqlite_target(url)
    _check_port(parts.netloc.rpartition("@")[2], url)
    if base in ("postgresql", "postgres"):
        return _postgres_target(url, password)
    if base in ("mysql", "mariadb"):
        return _mysql_target(url, password)
    raise UrlError(
        f"unsupported --db URL scheme '{scheme}': use sqlite, postgresql, mysql or mariadb"
    )


def _check_port(hostinfo: str, url: str) -> None:
    """A port, when the URL gives one, is a number from 1 to 65535: the reports' SQLAlchemy
    reads the URL too, and fails on `host:` or `host:port` with a traceback."""
    if hostinfo.startswith("["):  # [::1]:5432
        hostinfo = hostinfo.partition("]")[2]
    if ":" not in hostinfo:
        return
    port = hostinfo.rpartition(":")[2]
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise UrlError(f"bad port {port!r} in --db URL {redact(url)}: give a number from 1 "
                       f"to 65535")


def redact(url: str) -> str:
    """The URL with its password replaced by ***, in the user part and in the query
    (`?password=`, as libpq and PyMySQL take it); safe for any output, even a URL that
    urlsplit cannot read."""
    # The query's secrets, whatever else the URL holds (before and after a fragment alike).
    url = _QUERY_SECRET.sub(r"\1***", url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"(://[^/?#@:]*):[^/?#@]*@", r"\1:***@", url)
    if not parts.password:  # none, or empty: nothing to hide, and *** would claim one
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostinfo}").geturl()


# A secret given as a query parameter: libpq's password and sslpassword, PyMySQL's passwd.
_QUERY_SECRET = re.compile(r"([?&](?:password|passwd|sslpassword)=)[^&#]*", re.IGNORECASE)


def _sqlite_target(url: str) -> Target:
    path = url.partition("://")[2]
    if not path.startswith("/"):
        raise UrlError(f"bad SQLite URL '{url}': write sqlite:///relative/path or sqlite:////abs")
    path = unquote(path[1:].partition("?")[0])
    if not path:
        raise UrlError(f"bad SQLite URL '{url}': no file named")
    return Target("sqlite", url, url, path=path)


def _postgres_target(url: str, password: str | None) -> Target:
    # libpq reads the URL itself (host=/socket, sslmode=… and friends keep working); only the
    # SQLAlchemy driver suffix has to go.
    conninfo = "postgresql://" + url.partition("://")[2]
    args: dict[str, Any] = {"conninfo": conninfo}
    if password is not None:
        args["password"] = password
    return Target("postgresql", url, redact(url), args)


_MYSQL_PARAMS = {"unix_socket", "charset", "ssl_ca", "ssl_cert", "ssl_key", "connect_timeout"}


def _check_mysql_query(query: dict[str, str], url: str) -> None:
    """?connect_timeout= a whole number of seconds, ?ssl_ca= (cert, key) a readable file:
    else PyMySQL fails inside the reports' driver with a traceback, not at connect time."""
    timeout = query.get("connect_timeout")
    if timeout is not None and not (timeout.isascii() and timeout.isdigit()
                                    and 1 <= int(timeout) <= 31_536_000):
        raise UrlError(f"?connect_timeout={timeout} in {redact(url)}: give whole seconds, "
                       f"1 or more")
    for key in ("ssl_ca", "ssl_cert", "ssl_key"):
        if key in query and not os.access(query[key], os.R_OK):
            raise UrlError(f"?{key}={query[key]} in {redact(url)}: no readable file there")


def _mysql_target(url: str, password: str | None) -> Target:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    unknown = set(query) - _MYSQL_PARAMS
    if unknown:
        raise UrlError(f"unknown MySQL URL parameter '{sorted(unknown)[0]}' in {redact(url)}")
    try:
        port = parts.port or 3306
    except ValueError:
        raise UrlError(f"bad port in --db URL {redact(url)}") from None
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise UrlError(f"no database named in --db URL {redact(url)}")
    args: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": port,
        "user": unquote(parts.username or "root"),
        "password": password if password is not None else unquote(parts.password or ""),
        "database": database,
    }
    # The tables are utf8mb4 with binary keys: a narrower connection charset could turn two
    # job names into one, so ?charset= may only say what once uses anyway.
    if query.get("charset", "utf8mb4").lower() != "utf8mb4":
        raise UrlError(f"?charset={query['charset']} in {redact(url)}: once speaks utf8mb4 "
                       f"(its tables' charset); leave it out or write charset=utf8mb4")
    args["charset"] = "utf8mb4"
    _check_mysql_query(query, url)
    if "unix_socket" in query:
        args["unix_socket"] = query["unix_socket"]
    ssl = {k[4:]: v for k, v in query.items() if k.startswith("ssl_")}
    if ssl:
        args["ssl"] = ssl
    return Target("mysql", url, redact(url), args)


# -- what the ledger answers -----------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A job as `once run` sees it: its stored name and the schedule it last ran with."""

    name: str
    kind: str  # "every" or "cron"
    schedule: str
    tz: str
    lag: int = 0
    max_attempts: int = 3
    stale_after: float = 300.0
    shards: int = 1


STATE_LIMIT = limits.STATE_LIMIT  # bytes of UTF-8


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: won (attempt and fence are ours) or skipped, and why."""

    won: bool
    attempt: int
    fence: int
    status: str = "running"  # skipped: the row's status as found
    owner: str = ""  # skipped: who holds it
    heartbeat_age: float | None = None  # skipped: seconds since its last heartbeat
    state: str | None = None  # won: the job's watermark as the claim found it
    state_version: int = 0  # won: its version, for the compare-and-set of the finish
    stale_after: float | None = None  # skipped: the holder's own --stale-after (its promise)

    @property
    def skip_reason(self) -> str:
        """`skipped-done`, `skipped-held` or `skipped-failed` (attempts used up)."""
        return {"done": "skipped-done", "failed": "skipped-failed"}.get(
            self.status, "skipped-held"
        )


# -- the connection --------------------------------------------------------------------------


class Ledger:
    """One connection to the ledger and the few statements `once run` sends through it.

    Subclasses hold the SQL text per dialect; this class holds the flow. Not thread-safe:
    the runner's heartbeat thread and the main thread take turns, never overlap.
    """

    dialect: ClassVar[Dialect]
    statement_timeout: float = 10.0

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        self.target = target
        self.statement_timeout = timeout
        self._conn: Any = None

    # connection life

    def connect(self, patient: bool = False) -> None:
        """Open the connection now (the first statement would otherwise do it).

        patient: a server that is out of connections or still starting (a fleet firing at
        :00, a restart) is tried again with jittered exponential backoff for up to
        `connect_patience` seconds; any other failure (a bad password, an unknown database)
        fails at once. Renewals and final writes have retry loops of their own.
        """
        if self._conn is not None:
            return
        give_up = time.monotonic() + (self.connect_patience if patient else 0.0)
        pause = 0.05
        with self._errors("cannot connect to"):
            while True:
                try:
                    self._conn = self._open()
                    return
                except Exception as exc:
                    if not _busy_server(exc) or time.monotonic() + pause > give_up:
                        raise
                import random  # only on this rare path

                time.sleep(random.uniform(pause / 2, pause))
                pause = min(1.0, pause * 2)

    @property
    def connect_patience(self) -> float:
        """How long a claim waits for a busy server: three statement timeouts (a tenth of the
        default --stale-after), from 3 s to 30 s: below --stale-after, and short enough that
        a fire which cannot get in by then is not worth making."""
        return 3.0 * self.statement_timeout

    def reconnect(self) -> None:
        """Drop the connection (it may be dead) and open a fresh one."""
        self.close()
        self.connect()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):  # a dead connection may fail to close; it is gone anyway
                conn.close()

    def abandon(self) -> None:
        """Forget the connection without closing it: a statement that got no answer still
        waits on it on another thread (runner.Lease.call), and closing a connection under
        a statement can crash the process (SQLite: SIGSEGV). The next statement opens a
        fresh one; the old one goes with the process."""
        self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the statements

    def claim(self, job: Job, key: str, start: datetime, end: datetime, owner: str,
              rerun: bool = False, reason: str | None = None,
              command_hash: str | None = None, require_same_command: bool = False,
              max_clock_skew: float = 0.0) -> Claim:
        """Insert `(job, key)` as running, or take it over; else say who holds it.

        A running row is taken over only when its heartbeat is older than the *owner's*
        --stale-after (stored in the row by the claim that won it); the caller's own
        --stale-after becomes the promise of the row it wins. A won claim also carries the
        job's watermark (`--state`) as it stood.

        Raises CommandDrift (--require-same-command) and ClockSkew (a server's clock and ours
        disagree by more than max_clock_skew seconds; 0: not checked) before anything is
        written.
        """
        params = {
            "job": job.name, "period": key, "owner": owner, "kind": job.kind,
            "schedule": job.schedule, "tz": job.tz, "lag": job.lag,
            "max_attempts": job.max_attempts, "stale_after": job.stale_after,
            "shards": job.shards, "period_start": self._time(start),
            "period_end": self._time(end), "rerun": rerun, "reason": reason,
            "command_hash": command_hash,
            "require_same": bool(require_same_command and command_hash),
            "max_skew": float(max_clock_skew),
        }

        def attempt() -> Claim:
            # Our clock is read as late as possible: the statement compares it with its own.
            params["host_now"] = self._time(datetime.now(UTC))
            return self._claim(params)

        return self._with_schema(attempt)

    def renew(self, job: str, key: str, attempt: int) -> bool:
        """Refresh the heartbeat of our attempt; False when the row is no longer ours."""
        params = {"job": job, "period": key, "attempt": attempt}
        with self._errors("cannot renew the claim in"):
            self.connect()
            return self._renew(params)

    def finish(self, job: str, key: str, attempt: int, status: Status,
               exit_code: int | None, outcome: str, state: str | None = None,
               state_version: int = 0, output: str | None = None) -> bool:
        """Record done or failed for our attempt; False when the row is no longer ours.

        `outcome` (done, failed, timed-out, exec-failed, interrupted) and `output` (the tail
        of the command's output) go to the history only.
        With `state` (only for done), the job's watermark is set in the same atomic write,
        and only if it is still at `state_version` (else nothing is written: False).
        """
        params = {"job": job, "period": key, "attempt": attempt, "status": status,
                  "exit_code": exit_code, "outcome": outcome, "state": state,
                  "state_version": state_version, "output": output}
        with self._errors("cannot record the result in"):
            self.connect()
            if state is not None and status == "done":
                written = self._finish_with_state(params)
            else:
                written = self._finish(params)
            # A retried write whose first try committed though its answer was lost (a
            # watchdog, a dropped connection) matches no running row: the row then says
            # finished by our own attempt, and that is what the ledger holds.
            recorded = written or self._finished_by(params) is not None
        self.release(job, key)
        return recorded

    def release(self, job: str, key: str) -> None:
        """Let go of a won period's liveness lock (SQLite) once its result is recorded or
        lost; nothing elsewhere. Closing the ledger releases every lock it holds."""

    # A fenced-out attempt's output goes into its own once_attempts row, which no other
    # attempt writes; the period's row is not touched.
    KEEP_OUTPUT = """
        UPDATE once_attempts SET output = %(output)s
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND output IS NULL"""

    def keep_output(self, job: str, key: str, attempt: int, output: str) -> None:
        """Store the output of our attempt after it was fenced out."""
        params = {"job": job, "period": key, "attempt": attempt, "output": output}
        with self._errors("cannot store the output in"):
            self.connect()
            self._write(self.KEEP_OUTPUT, params)

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        """One statement that changes rows, committed."""
        raise NotImplementedError

    FINISHED_BY = """
        SELECT status FROM once_runs
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status IN ('done', 'failed')"""

    def _finished_by(self, params: dict[str, Any]) -> str | None:
        """The status our attempt left in the row, if it finished it (None: not ours)."""
        rows = self._fetch(self.FINISHED_BY, params)
        return str(rows[0][0]) if rows else None

    def finish_on(self, connection: Any, job: str, key: str, attempt: int) -> bool:
        """Mark our attempt done on the caller's own connection, inside its open transaction
        (psycopg 3, sqlite3 or PyMySQL), so that the work and the marker commit together.
        Nothing is committed here; False when the row is no longer ours."""
        params = {"job": job, "period": key, "attempt": attempt, "status": "done",
                  "exit_code": 0, "outcome": "done", "state": None, "state_version": 0,
                  "output": None}
        return self._finish_on(connection, params)

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def set_state(self, job: str, value: str, owner: str, seed: Job | None = None,
                  first_period_start: datetime | None = None) -> int:
        """Set the watermark deliberately (`once state --set`); return its new version.

        Recorded in the history as a `(state)` row, so that `once history` shows it. With
        `seed`, a job that has never run is registered first, in the same transaction, with
        that schedule, expected from `first_period_start` on, fence 0 and no fire (its first
        claim then takes fence 1 and the schedule it runs with); the tables are created if
        there are none. Without it, a job that has never run is a LedgerError.
        """
        params: dict[str, Any] = {"job": job, "state": value, "owner": owner,
                                  "reason": f"state set: {value[:200]}", "seed": seed is not None}
        if seed is not None:
            assert first_period_start is not None
            params.update(kind=seed.kind, schedule=seed.schedule, tz=seed.tz, lag=seed.lag,
                          max_attempts=seed.max_attempts, stale_after=seed.stale_after,
                          shards=seed.shards, period_start=self._time(first_period_start))
            return self._with_schema(lambda: self._set_state(params), "cannot set the state in")
        with self._errors("cannot set the state in"):
            self.connect()
            return self._set_state(params)

    # reads for rerun and --state (one round trip each, still no SQLAlchemy)

    JOB_INFO = """
        SELECT kind, schedule, tz, lag, max_attempts, stale_after, shards FROM once_jobs
        WHERE job = %(job)s"""

    STATE = """SELECT state, state_version FROM once_jobs WHERE job = %(job)s"""

    LAST_COMMAND = """
        SELECT command_hash FROM once_attempts
        WHERE job = %(job)s AND command_hash IS NOT NULL
        ORDER BY started_at DESC LIMIT 1"""

    # Catch-up's reads (once.gaps finds the periods that need a run from them): index seeks
    # and ranges on once_runs_job_status_start, one round trip each.

    JOB_SPAN = """
        SELECT (SELECT first_period_start FROM once_jobs WHERE job = %(job)s),
               (SELECT max(period_start) FROM once_runs WHERE job = %(job)s AND status = 'done'),
               (SELECT max(period_start) FROM once_runs
                WHERE job = %(job)s AND status = 'running'),
               (SELECT max(period_start) FROM once_runs
                WHERE job = %(job)s AND status = 'failed')"""

    # Seconds since a row's heartbeat, by the database's clock (per dialect).
    HEARTBEAT_AGE: ClassVar[str] = ""

    OPEN_ROWS = """
        SELECT period, period_start, status, attempt, {age}, stale_after FROM once_runs
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

    def job_span(self, job: str) -> tuple[datetime | None, datetime | None]:
        """(the job's first period start, the start of its latest row of any status), UTC;
        (None, None) for a job that has never run."""
        rows = self._read(self.JOB_SPAN, {"job": job})
        if not rows or rows[0][0] is None:
            return None, None
        first, *latest = (self._from_db_time(v) for v in rows[0] if v is not None)
        return first, max(latest, default=None)

    def open_rows(self, job: str, lo: datetime,
                  hi: datetime) -> list[tuple[str, datetime, str, int, bool]]:
        """The running and failed rows whose period starts in [lo, hi), oldest first:
        (key, period start, status, attempt, whether it is a running row past its owner's
        promise by the database's clock)."""
        rows = self._read(self.OPEN_ROWS.format(age=self.HEARTBEAT_AGE),
                          {"job": job, "lo": self._time(lo), "hi": self._time(hi)})
        return [(key, self._from_db_time(start), status, int(attempt),
                 status == "running" and age is not None and float(age) > float(stale_after))
                for key, start, status, attempt, age, stale_after in rows]

    def rows(self, job: str) -> LedgerRows:
        """The job's rows as once.gaps.GapFinder reads them."""
        return LedgerRows(self, job)

    def job_info(self, name: str) -> Job | None:
        """The job as its latest claim left it in once_jobs (None: never claimed)."""
        rows = self._read(self.JOB_INFO, {"job": name})
        if not rows:
            return None
        kind, sched, tz, lag, max_attempts, stale_after, shards = rows[0]
        return Job(name, kind, sched, tz, lag, max_attempts, float(stale_after), shards)

    def state(self, job: str) -> tuple[str | None, int]:
        """The job's watermark and its version ((None, 0) when never set)."""
        rows = self._read(self.STATE, {"job": job})
        return (rows[0][0], int(rows[0][1])) if rows else (None, 0)

    def last_command(self, job: str) -> str | None:
        """The command hash of the job's latest attempt (for --require-same-command)."""
        rows = self._read(self.LAST_COMMAND, {"job": job})
        return rows[0][0] if rows else None

    def _read(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._errors("cannot read"):
            self.connect(patient=True)
            try:
                return self._fetch(sql, params)
            except Exception as exc:
                if self._is_schema_error(exc):
                    return []  # no tables yet: nothing has run
                raise

    # per dialect

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _from_db_time(self, value: Any) -> datetime:
        instant: datetime = sqlite_time(value) if isinstance(value, str) else value
        return instant.replace(tzinfo=UTC) if instant.tzinfo is None else instant.astimezone(UTC)

    def _open(self) -> Any:
        raise NotImplementedError

    def _claim(self, params: dict[str, Any]) -> Claim:
        raise NotImplementedError

    def _renew(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _finish(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _set_state(self, params: dict[str, Any]) -> int:
        raise NotImplementedError

    def _is_schema_error(self, exc: Exception) -> bool:
        raise NotImplementedError

    def _time(self, instant: datetime) -> Any:
        """A period bound as the driver wants it: UTC."""
        return instant.astimezone(UTC)

    # plumbing

    def _with_schema(self, action: Callable[[], T], doing: str = "cannot claim in") -> T:
        with self._errors(doing):
            self.connect(patient=True)
            try:
                return action()
            except Exception as exc:
                if not self._is_schema_error(exc):
                    raise
        # First use (or an older schema): create or upgrade it, then try once more.
        from once import schema  # imported here only: it pulls in SQLAlchemy

        # One connection at a time: a stampede of first uses, each holding its claim's
        # connection while it waits for the schema lock on another, would need twice as many
        # as there are processes (MariaDB's default max_connections is 151, PostgreSQL's 100).
        self.close()
        schema.ensure(self.target)
        with self._errors(doing):
            self.reconnect()
            return action()

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except (LedgerError, CommandDrift):
            raise
        except Exception as exc:
            where = self.target.redacted
            error = LedgerError(f"{doing} the ledger {where}: {describe(exc)}")
            # DB-API: OperationalError and InterfaceError are the connection's; DataError,
            # IntegrityError, ProgrammingError and friends are the statement's.
            error.transient = isinstance(exc, OSError) or any(
                cls.__name__ in _TRANSIENT for cls in type(exc).__mro__)
            raise error from exc


class LedgerRows:
    """once.gaps.Rows in plain SQL on the ledger's own connection (catch-up's reads)."""

    def __init__(self, ledger: Ledger, job: str) -> None:
        self.ledger, self.job = ledger, job

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        ledger, terms = self.ledger, Ledger.COUNT_TERMS
        out: list[int] = []
        for first in range(0, len(stretches), terms):
            chunk = stretches[first:first + terms]
            params: dict[str, Any] = {"job": self.job}
            for i in range(terms):
                # The terms left over count the empty stretch [a, a).
                a, b = chunk[i] if i < len(chunk) else (chunk[-1][0], chunk[-1][0])
                params[f"a{i}"], params[f"b{i}"] = ledger._time(a), ledger._time(b)
            counts = {int(i): int(n) for i, n in ledger._read(ledger.DONE_COUNTS, params)}
            out += [counts.get(i, 0) for i in range(len(chunk))]
        return out

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        ledger = self.ledger
        found: dict[datetime, set[str]] = {}
        for first in range(0, len(starts), 500):
            chunk = starts[first:first + 500]
            params: dict[str, Any] = {"job": self.job}
            params.update({f"t{i}": ledger._time(at) for i, at in enumerate(chunk)})
            sql = ledger.KEYS_AT.format(starts=", ".join(f"%(t{i})s" for i in range(len(chunk))))
            for at, key in ledger._read(sql, params):
                found.setdefault(ledger._from_db_time(at), set()).add(key)
        return found

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        ledger = self.ledger
        rows = ledger._read(ledger.DONE_BREAKS, {"job": self.job, "lo": ledger._time(lo),
                                                 "hi": ledger._time(hi)})
        when = ledger._from_db_time
        first = when(rows[0][0]) if rows else None
        return first, [(when(e), None if f is None else when(f)) for _, e, f, n in rows
                       if f is None or when(f) > when(e)]

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        ledger = self.ledger
        rows = ledger._read(ledger.SHORT_STARTS, {"job": self.job, "lo": ledger._time(lo),
                                                  "hi": ledger._time(hi), "shards": shards,
                                                  "limit": limit})
        return [ledger._from_db_time(at) for (at,) in rows]


_TRANSIENT = {"OperationalError", "InterfaceError", "ConnectionTimeout", "TimeoutError"}

# Connection refusals that say "not now" rather than "never": out of connections, starting
# up or shutting down, or (during a restart) nobody listening yet.
_BUSY_SQLSTATES = {"53300", "57P03"}  # too_many_connections, cannot_connect_now
_BUSY_MYSQL = {1040, 1203, 1226}  # too many connections; per-user limits
_BUSY_TEXT = ("too many clients", "too many connections", "no more connections allowed",
              "the database system is starting up", "the database system is shutting down",
              "connection refused")


def _busy_server(exc: BaseException) -> bool:
    """A failure to connect that a retry a moment later may not meet (see _BUSY_*)."""
    if getattr(exc, "sqlstate", None) in _BUSY_SQLSTATES or _mysql_code(exc) in _BUSY_MYSQL:
        return True
    if isinstance(exc, ConnectionRefusedError):
        return True
    text = str(exc).lower()
    return any(words in text for words in _BUSY_TEXT)


def describe(exc: BaseException) -> str:
    """The first line of an error, for a one-line `once:` message."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- SQLite ------------------------------------------------------------------------------------

# SQLAlchemy stores DateTime on SQLite as text with six fractional digits; 'now' has three.
_SQLITE_NOW = "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"


class SqliteLedger(Ledger):
    dialect = "sqlite"
    HEARTBEAT_AGE = "(julianday('now') - julianday(heartbeat_at)) * 86400.0"
    _period_locks: _PeriodLocks | None = None

    UPSERT_JOB = f"""
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (:job, 1, 1, :kind, :schedule, :tz, :lag, :max_attempts, :stale_after, :shards,
                :period_start, {_SQLITE_NOW}, {_SQLITE_NOW})
        ON CONFLICT (job) DO UPDATE SET
            fence = fence + 1, fires = fires + 1, kind = excluded.kind,
            schedule = excluded.schedule, tz = excluded.tz, lag = excluded.lag,
            max_attempts = excluded.max_attempts, stale_after = excluded.stale_after,
            shards = excluded.shards,
            first_period_start = min(first_period_start, excluded.first_period_start),
            last_fire_at = excluded.last_fire_at
        RETURNING fence, state, state_version"""

    # A running row is stale by its owner's promise (once_runs.stale_after), never by ours;
    # on SQLite the caller also holds the row's OS lock (see _PeriodLocks), so that a clock
    # stepped forward cannot make a live owner look dead.
    CLAIM_RUN = f"""
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at, stale_after)
        VALUES (:job, :period, 'running', 1, :fence, :owner, :period_start, :period_end,
                {_SQLITE_NOW}, {_SQLITE_NOW}, :stale_after)
        ON CONFLICT (job, period) DO UPDATE SET
            status = 'running', attempt = attempt + 1, fence = excluded.fence,
            owner = excluded.owner, started_at = excluded.started_at,
            heartbeat_at = excluded.heartbeat_at, finished_at = NULL, exit_code = NULL,
            stale_after = excluded.stale_after
        WHERE (status = 'failed' AND attempt < :max_attempts)
           OR (status = 'running' AND heartbeat_at <
               strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || stale_after || ' seconds') || '000')
           OR (:rerun AND status IN ('done', 'failed'))
        RETURNING attempt, fence, started_at"""

    HOLDER = """
        SELECT status, attempt, fence, owner,
               (julianday('now') - julianday(heartbeat_at)) * 86400.0, stale_after
        FROM once_runs WHERE job = :job AND period = :period"""

    LAST_COMMAND_LOCKED = """
        SELECT command_hash FROM once_attempts
        WHERE job = :job AND command_hash IS NOT NULL
        ORDER BY started_at DESC LIMIT 1"""

    # `output` is named so that a ledger without it (schema 3) is upgraded by the claim,
    # before its finish would need it.
    LOG_ATTEMPT = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at, reason,
                                   command_hash, output)
        VALUES (:job, :period, :attempt, :fence, :owner, 'running', :started_at, :reason,
                :command_hash, NULL)"""

    # A job seeded by `once state --set` before its first run: fence 0, no fire yet.
    SEED_JOB = f"""
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (:job, 0, 0, :kind, :schedule, :tz, :lag, :max_attempts, :stale_after, :shards,
                :period_start, {_SQLITE_NOW}, {_SQLITE_NOW})
        ON CONFLICT (job) DO NOTHING"""

    SET_STATE = f"""
        UPDATE once_jobs SET state = :state, state_version = state_version + 1
        WHERE job = :job
        RETURNING state_version, fence, {_SQLITE_NOW}"""

    LOG_STATE = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   finished_at, outcome, reason)
        VALUES (:job, '(state)', :version, :fence, :owner, 'done', :now, :now, 'state-set',
                :reason)"""

    RENEW = f"""
        UPDATE once_runs SET heartbeat_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt AND status = 'running'"""

    FINISH_RUN = f"""
        UPDATE once_runs SET status = :status, exit_code = :exit_code,
               finished_at = {_SQLITE_NOW}, heartbeat_at = {_SQLITE_NOW}
        WHERE job = :job AND period = :period AND attempt = :attempt AND status = 'running'"""

    FINISH_ATTEMPT = """
        UPDATE once_attempts SET status = :status, exit_code = :exit_code, outcome = :outcome,
               output = :output,
               finished_at = (SELECT finished_at FROM once_runs
                              WHERE job = :job AND period = :period)
        WHERE job = :job AND period = :period AND attempt = :attempt"""

    def _open(self) -> Any:
        import sqlite3

        if self.target.path != ":memory:" and not os.path.exists(self.target.path):
            directory = os.path.dirname(self.target.path)
            if directory and not os.path.isdir(directory) and self.target.url != default_url():
                raise LedgerError(
                    f"cannot open the ledger {self.target.url}: no directory {directory}"
                )
            create_private(self.target)
        # isolation_level=None: we write BEGIN IMMEDIATE ourselves, so that concurrent
        # claimers queue on SQLite's write lock (busy timeout) instead of failing on upgrade.
        conn = sqlite3.connect(self.target.path, timeout=self.statement_timeout,
                               isolation_level=None, check_same_thread=False)
        return conn

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _claim(self, params: dict[str, Any]) -> Claim:
        # One host, one clock: SQLite's 'now' is ours, so there is no skew to check.
        params = {**params, "rerun": int(params["rerun"])}
        key = (params["job"], params["period"])
        # Without the period's lock a live process holds (or is claiming) it: the claim is
        # made and counted, but nothing can be won.
        locked = self._locks().acquire(key, patient=bool(params["rerun"]))
        try:
            claim = self._claim_in_transaction(params, can_win=locked)
        except BaseException:
            self._locks().release(key)
            raise
        if not claim.won:
            self._locks().release(key)
        return claim

    def _claim_in_transaction(self, params: dict[str, Any], can_win: bool) -> Claim:
        with self._transaction() as cur:
            if params["require_same"]:
                last = cur.execute(self.LAST_COMMAND_LOCKED, params).fetchone()
                if last is not None and last[0] != params["command_hash"]:
                    raise CommandDrift(params["job"], last[0], params["command_hash"])
            fence, state, version = cur.execute(self.UPSERT_JOB, params).fetchone()
            row = (cur.execute(self.CLAIM_RUN, {**params, "fence": fence}).fetchone()
                   if can_win else None)
            if row is None:
                return _holder(cur.execute(self.HOLDER, params).fetchone())
            attempt, fence, started_at = row
            cur.execute(self.LOG_ATTEMPT, {**params, "attempt": attempt, "fence": fence,
                                           "started_at": started_at})
        return Claim(True, attempt, fence, state=state, state_version=version)

    def _locks(self) -> _PeriodLocks:
        if self._period_locks is None:
            self._period_locks = _PeriodLocks(self.target.path)
        return self._period_locks

    def release(self, job: str, key: str) -> None:
        if self._period_locks is not None:
            self._period_locks.release((job, key))

    def __exit__(self, *exc: object) -> None:
        # close() only drops a connection (a dead one is dropped mid-run, the period still
        # ours); the locks go when the ledger does.
        super().__exit__(*exc)
        locks, self._period_locks = self._period_locks, None
        if locks is not None:
            locks.close()

    def _renew(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            return bool(cur.execute(self.RENEW, params).rowcount == 1)

    KEEP_OUTPUT = """
        UPDATE once_attempts SET output = :output
        WHERE job = :job AND period = :period AND attempt = :attempt AND output IS NULL"""

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        with self._transaction() as cur:
            cur.execute(sql, params)

    def _finish(self, params: dict[str, Any]) -> bool:
        with self._transaction() as cur:
            if cur.execute(self.FINISH_RUN, params).rowcount != 1:
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
        return True

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        # BEGIN IMMEDIATE holds SQLite's write lock: the version check and both writes are
        # one atomic step.
        with self._transaction() as cur:
            version = cur.execute(self._STATE_VERSION, params).fetchone()
            if version is None or version[0] != params["state_version"]:
                return False
            if cur.execute(self.FINISH_RUN, params).rowcount != 1:
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
            cur.execute(self._ADVANCE_STATE, params)
        return True

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        if connection.execute(self.FINISH_RUN, params).rowcount != 1:
            return False
        connection.execute(self.FINISH_ATTEMPT, params)
        return True

    _STATE_VERSION = "SELECT state_version FROM once_jobs WHERE job = :job"
    _ADVANCE_STATE = """
        UPDATE once_jobs SET state = :state, state_version = state_version + 1
        WHERE job = :job"""

    def _set_state(self, params: dict[str, Any]) -> int:
        with self._transaction() as cur:
            if params["seed"]:
                cur.execute(self.SEED_JOB, params)
            row = cur.execute(self.SET_STATE, params).fetchone()
            if row is None:
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
            version, fence, now = row
            cur.execute(self.LOG_STATE, {**params, "version": version, "fence": fence,
                                         "now": now})
        return int(version)

    def _time(self, instant: datetime) -> Any:
        # As SQLAlchemy writes DateTime on SQLite, the year in four digits: strftime('%Y')
        # gives '1' for the year 1, which no reader could parse and which sorts after 2026.
        return instant.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # The shared reads are written in the pyformat style; sqlite3 wants :name.
        return [tuple(r) for r in self._conn.execute(_named(sql), params).fetchall()]

    def _is_schema_error(self, exc: Exception) -> bool:
        text = str(exc)
        return "no such table" in text or "no such column" in text or "has no column" in text


def sqlite_time(text: str) -> datetime:
    """A time as SQLite holds it, naive UTC; also as earlier versions wrote a year before 1000
    there (`1-01-01 00:00:00.000000`, the year unpadded)."""
    year, dash, rest = text.partition("-")
    if dash and len(year) < 4 and year.isdigit():
        text = f"{int(year):04d}-{rest}"
    return datetime.fromisoformat(text)


def _skew(params: dict[str, Any], db_minus_host: float) -> ClockSkew:
    """The one-line refusal of a claim whose host clock disagrees with the database's."""
    host = params["host_now"]
    host = host if isinstance(host, datetime) else datetime.fromisoformat(str(host))
    host = host.replace(tzinfo=UTC) if host.tzinfo is None else host.astimezone(UTC)
    database = host + timedelta(seconds=db_minus_host)
    return ClockSkew(
        f"this host's clock ({host:%Y-%m-%d %H:%M:%S} UTC) and the database's "
        f"({database:%Y-%m-%d %H:%M:%S} UTC) disagree by {abs(db_minus_host):.0f}s, more than "
        f"--max-clock-skew {params['max_skew']:g}s: the period would be computed from a wrong "
        f"clock, so nothing was claimed; fix the host's clock (NTP)")


def _holder(row: tuple[Any, ...] | None) -> Claim:
    """A lost claim, as the row that beat it stood (None: a claimer we cannot see yet)."""
    if row is None:
        return Claim(False, 0, 0, "running", "another process", 0.0)
    status, attempt, fence, owner, age, stale_after = row
    return Claim(False, attempt, fence, status, owner, None if age is None else float(age),
                 stale_after=None if stale_after is None else float(stale_after))


class _PeriodLocks:
    """SQLite's liveness signal that no clock can fake: an OS lock per (job, period).

    On one host the ledger's clock is the host's, so a clock stepped forward (NTP, a resume)
    would make every live owner look stale. The process that wins a SQLite row holds a lock on
    it until it has recorded the result, and a claim can win a row only while holding that
    lock: a live owner's row is never taken over, whatever the clock says, and the lock goes
    with its process when it dies.

    The locks are Linux open-file-description locks (F_OFD_SETLK) on one byte each of a file
    beside the ledger (`ledger.db.locks`, never written), at an offset hashed from the key:
    released when the holder closes the file or dies, shared with its forked children (the
    guard), and never confused between two ledgers of one process. Elsewhere (no OFD locks)
    staleness is judged by the clock alone.
    """

    def __init__(self, ledger_path: str) -> None:
        import fcntl

        self._set: int = getattr(fcntl, "F_OFD_SETLK", -1)
        self._held: set[tuple[str, str]] = set()
        self._fd = -1
        if self._set < 0 or ledger_path == ":memory:":
            return
        try:
            mode = os.stat(ledger_path).st_mode & 0o666
        except OSError:
            mode = 0o600
        self._fd = os.open(ledger_path + ".locks", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)

    def acquire(self, key: tuple[str, str], patient: bool = False) -> bool:
        """Take the key's lock now (patient: keep trying for a second, for a rerun that
        should not be refused because a no-op fire holds the lock for a few milliseconds)."""
        if self._fd < 0:
            return True
        give_up = time.monotonic() + (1.0 if patient else 0.0)
        while not self._lock(key, True):
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.02)  # an OS lock has no event to wait on with a time limit
        self._held.add(key)
        return True

    def release(self, key: tuple[str, str]) -> None:
        if key in self._held:
            self._held.discard(key)
            self._lock(key, False)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        self._held.clear()
        if fd >= 0:
            os.close(fd)  # releases every lock this description holds

    def _lock(self, key: tuple[str, str], take: bool) -> bool:
        import fcntl
        import struct
        import zlib

        data = "\0".join(key).encode("utf-8", "surrogateescape")
        # 62 bits from two CRCs (zlib costs a tenth of hashlib's import on every fire).
        offset = ((zlib.crc32(data) << 30) ^ zlib.crc32(data[::-1] + b"once")) & (2**62 - 1)
        kind = fcntl.F_WRLCK if take else fcntl.F_UNLCK
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
        request = struct.pack("@hhqqi0q", kind, os.SEEK_SET, offset, 1, 0)
        try:
            fcntl.fcntl(self._fd, self._set, request)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True


# -- PostgreSQL --------------------------------------------------------------------------------


class PostgresLedger(Ledger):
    dialect = "postgresql"
    HEARTBEAT_AGE = "extract(epoch FROM clock_timestamp() - heartbeat_at)::float8"

    # One statement, one round trip: compare the clocks, bump the job's fence, insert or take
    # over the run row, log the attempt; when nothing was won, report the row as it stands.
    # Every part reads the row's newest version: ON CONFLICT sees it whatever the statement's
    # snapshot, and the holder is read FOR SHARE (after the job row's lock, which serialises
    # the job's claims), which in READ COMMITTED follows the row to its latest committed
    # version. A plain read would report the row as it stood before a concurrent claim (a
    # rerun refused as "done by attempt 1").
    CLAIM = """
        WITH clock AS (
            SELECT %(max_skew)s = 0
                   OR abs(extract(epoch FROM clock_timestamp() - %(host_now)s)) <= %(max_skew)s
                   AS ok
        ), job AS (
            INSERT INTO once_jobs AS j (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                                        stale_after, shards, first_period_start, created_at,
                                        last_fire_at)
            SELECT %(job)s, 1, 1, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                   %(stale_after)s, %(shards)s, %(period_start)s, clock_timestamp(),
                   clock_timestamp()
            FROM clock WHERE clock.ok
            ON CONFLICT (job) DO UPDATE SET
                fence = j.fence + 1, fires = j.fires + 1, kind = excluded.kind,
                schedule = excluded.schedule, tz = excluded.tz, lag = excluded.lag,
                max_attempts = excluded.max_attempts, stale_after = excluded.stale_after,
                shards = excluded.shards,
                first_period_start = least(j.first_period_start, excluded.first_period_start),
                last_fire_at = excluded.last_fire_at
            RETURNING fence, state, state_version
        ), won AS (
            INSERT INTO once_runs AS r (job, period, status, attempt, fence, owner, period_start,
                                        period_end, started_at, heartbeat_at, stale_after)
            SELECT %(job)s, %(period)s, 'running', 1, job.fence, %(owner)s, %(period_start)s,
                   %(period_end)s, clock_timestamp(), clock_timestamp(), %(stale_after)s
            FROM job
            ON CONFLICT (job, period) DO UPDATE SET
                status = 'running', attempt = r.attempt + 1, fence = excluded.fence,
                owner = excluded.owner, started_at = excluded.started_at,
                heartbeat_at = excluded.heartbeat_at, finished_at = NULL, exit_code = NULL,
                stale_after = excluded.stale_after
            WHERE (r.status = 'failed' AND r.attempt < %(max_attempts)s)
               OR (r.status = 'running'
                   AND r.heartbeat_at < clock_timestamp() - make_interval(secs => r.stale_after))
               OR (%(rerun)s AND r.status IN ('done', 'failed'))
            RETURNING r.attempt, r.fence, r.started_at
        ), logged AS (
            INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                       reason, command_hash, output)
            SELECT %(job)s, %(period)s, attempt, fence, %(owner)s, 'running', started_at,
                   %(reason)s, %(command_hash)s, NULL
            FROM won
        ), holder AS (
            SELECT r.attempt, r.fence, r.status, r.owner,
                   extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS age,
                   r.stale_after
            FROM once_runs r, job
            WHERE r.job = %(job)s AND r.period = %(period)s AND NOT EXISTS (SELECT FROM won)
            FOR SHARE OF r
        )
        SELECT 'won', attempt, won.fence, 'running', %(owner)s, 0.0::float8, job.state,
               job.state_version, NULL::float8
        FROM won, job
        UNION ALL
        SELECT 'lost', attempt, fence, status, owner, age, NULL, 0, stale_after FROM holder
        UNION ALL
        SELECT 'skew', 0, 0, '', '', extract(epoch FROM clock_timestamp() - %(host_now)s)::float8,
               NULL, 0, NULL
        FROM clock WHERE NOT clock.ok"""

    LOCK_JOB = "SELECT 1 FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    RENEW = """
        UPDATE once_runs SET heartbeat_at = clock_timestamp()
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    FINISH = """
        WITH fin AS (
            UPDATE once_runs SET status = %(status)s, exit_code = %(exit_code)s,
                   finished_at = clock_timestamp(), heartbeat_at = clock_timestamp()
            WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
              AND status = 'running'
            RETURNING finished_at
        ), logged AS (
            UPDATE once_attempts a SET status = %(status)s, exit_code = %(exit_code)s,
                   outcome = %(outcome)s, output = %(output)s,
                   finished_at = fin.finished_at
            FROM fin
            WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s
        )
        SELECT count(*) FROM fin"""

    # The same finish, and the watermark with it, in one statement: the job row is locked
    # first (FOR UPDATE returns its newest version), the run row is finished only if the
    # watermark is still at the version the claim read, and the watermark moves only if the
    # run row was ours.
    FINISH_STATE = """
        WITH j AS (
            SELECT state_version = %(state_version)s AS fresh FROM once_jobs
            WHERE job = %(job)s FOR UPDATE
        ), fin AS (
            UPDATE once_runs SET status = 'done', exit_code = %(exit_code)s,
                   finished_at = clock_timestamp(), heartbeat_at = clock_timestamp()
            WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
              AND status = 'running' AND (SELECT fresh FROM j)
            RETURNING finished_at
        ), logged AS (
            UPDATE once_attempts a SET status = 'done', exit_code = %(exit_code)s,
                   outcome = %(outcome)s, output = %(output)s, finished_at = fin.finished_at
            FROM fin
            WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s
        ), advanced AS (
            UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
            FROM fin WHERE once_jobs.job = %(job)s
        )
        SELECT count(*) FROM fin"""

    SEED_JOB = """
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, lag, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (%(job)s, 0, 0, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                %(stale_after)s, %(shards)s, %(period_start)s, clock_timestamp(),
                clock_timestamp())
        ON CONFLICT (job) DO NOTHING"""

    SET_STATE = """
        WITH changed AS (
            UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
            WHERE job = %(job)s
            RETURNING state_version, fence
        ), logged AS (
            INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                       finished_at, outcome, reason)
            SELECT %(job)s, '(state)', state_version, fence, %(owner)s, 'done',
                   clock_timestamp(), clock_timestamp(), 'state-set', %(reason)s
            FROM changed
        )
        SELECT state_version FROM changed"""

    def _open(self) -> Any:
        import psycopg

        args = dict(self.target.connect_args)
        conninfo = args.pop("conninfo")
        # autocommit: each statement is its own transaction, one round trip.
        # prepare_threshold=None: no server-side prepared statements, so PgBouncer in
        # transaction pooling mode works.
        return psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=None,
            connect_timeout=max(2, round(self.statement_timeout)), **args,
        )

    def _claim(self, params: dict[str, Any]) -> Claim:
        if not params["require_same"]:
            return self._answer(self._execute(self.CLAIM, params).fetchone(), params)
        # --require-same-command: take the job row's lock first, so that every claim of the
        # job that committed before is visible to the next statement, and decide the drift
        # before the claim, in one transaction with it (only this flag pays the round trips).
        with self._conn.transaction():
            self._execute(self.LOCK_JOB, params)
            last = self._execute(self.LAST_COMMAND, params).fetchone()
            if last is not None and last[0] != params["command_hash"]:
                raise CommandDrift(params["job"], last[0], params["command_hash"])
            return self._answer(self._execute(self.CLAIM, params).fetchone(), params)

    def _answer(self, row: tuple[Any, ...] | None, params: dict[str, Any]) -> Claim:
        if row is None:  # the row was inserted by a claimer our snapshot cannot see yet
            return _holder(None)
        what, attempt, fence, status, owner, age, state, version, stale_after = row
        if what == "skew":
            raise _skew(params, age)
        if what == "lost":
            return _holder((status, attempt, fence, owner, age, stale_after))
        return Claim(True, attempt, fence, status, owner, age, state, version)

    def _renew(self, params: dict[str, Any]) -> bool:
        return bool(self._execute(self.RENEW, params).rowcount == 1)

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        self._execute(sql, params)

    def _finish(self, params: dict[str, Any]) -> bool:
        (count,) = self._execute(self.FINISH, params).fetchone()
        return bool(count == 1)

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        (count,) = self._execute(self.FINISH_STATE, params).fetchone()
        return bool(count == 1)

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        (count,) = connection.execute(self.FINISH, params).fetchone()
        return bool(count == 1)

    def _set_state(self, params: dict[str, Any]) -> int:
        if not params["seed"]:
            row = self._execute(self.SET_STATE, params).fetchone()
        else:
            # Two statements, one transaction: a CTE's update cannot see its sibling's insert.
            with self._conn.transaction():
                self._execute(self.SEED_JOB, params)
                row = self._execute(self.SET_STATE, params).fetchone()
        if row is None:
            raise LedgerError(f"unknown job {params['job']!r}: it has never run")
        return int(row[0])

    def _is_schema_error(self, exc: Exception) -> bool:
        return getattr(exc, "sqlstate", None) in ("42P01", "42703")  # undefined table/column

    def _execute(self, sql: str, params: dict[str, Any]) -> Any:
        """Execute under a watchdog. psycopg has no client-side statement timeout, and a
        server-side one needs session state that PgBouncer does not keep; a server that stops
        answering (stopped, hung, a partition that still ACKs) would hold us for ever. Past
        the watchdog's time the socket is shut down, which fails the statement."""
        import threading

        watchdog = threading.Timer(max(5.0, 2 * self.statement_timeout), _shut_down,
                                   (self._conn.pgconn.socket,))
        watchdog.daemon = True
        watchdog.start()
        try:
            return self._conn.execute(sql, params)
        finally:
            watchdog.cancel()

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._execute(sql, params).fetchall()]


# -- MySQL and MariaDB -------------------------------------------------------------------------

_MY_NOW = "UTC_TIMESTAMP(6)"
_DUPLICATE_KEY, _DEADLOCK, _LOCK_WAIT = 1062, 1213, 1205


class MysqlLedger(Ledger):
    dialect = "mysql"
    HEARTBEAT_AGE = f"TIMESTAMPDIFF(MICROSECOND, heartbeat_at, {_MY_NOW}) / 1e6"

    # LAST_INSERT_ID(expr) hands the new fence back in the OK packet: no extra SELECT.
    UPSERT_JOB = f"""
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, `lag`, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (%(job)s, LAST_INSERT_ID(1), 1, %(kind)s, %(schedule)s, %(tz)s, %(lag)s,
                %(max_attempts)s, %(stale_after)s, %(shards)s, %(period_start)s, {_MY_NOW},
                {_MY_NOW})
        ON DUPLICATE KEY UPDATE
            fence = LAST_INSERT_ID(fence + 1), fires = fires + 1, kind = VALUES(kind),
            schedule = VALUES(schedule), tz = VALUES(tz), `lag` = VALUES(`lag`),
            max_attempts = VALUES(max_attempts), stale_after = VALUES(stale_after),
            shards = VALUES(shards),
            first_period_start = LEAST(first_period_start, VALUES(first_period_start)),
            last_fire_at = VALUES(last_fire_at)"""

    INSERT_RUN = f"""
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at, stale_after)
        VALUES (%(job)s, %(period)s, 'running', 1, %(fence)s, %(owner)s, %(period_start)s,
                %(period_end)s, {_MY_NOW}, {_MY_NOW}, %(stale_after)s)"""

    # Stale by the owner's promise (the row's stale_after, as the WHERE clause reads the row
    # before the update), never by ours.
    TAKE_OVER = f"""
        UPDATE once_runs SET
            attempt = LAST_INSERT_ID(attempt + 1), status = 'running', fence = %(fence)s,
            owner = %(owner)s, started_at = {_MY_NOW}, heartbeat_at = {_MY_NOW},
            finished_at = NULL, exit_code = NULL, stale_after = %(stale_after)s
        WHERE job = %(job)s AND period = %(period)s
          AND ((status = 'failed' AND attempt < %(max_attempts)s)
            OR (status = 'running'
                AND heartbeat_at < {_MY_NOW} - INTERVAL ROUND(stale_after * 1000000) MICROSECOND)
            OR (%(rerun)s AND status IN ('done', 'failed')))"""

    HOLDER = f"""
        SELECT status, attempt, fence, owner,
               TIMESTAMPDIFF(MICROSECOND, heartbeat_at, {_MY_NOW}) / 1e6, stale_after
        FROM once_runs WHERE job = %(job)s AND period = %(period)s"""

    # Our clock minus the server's, in seconds (--max-clock-skew).
    SKEW = f"SELECT TIMESTAMPDIFF(MICROSECOND, %(host_now)s, {_MY_NOW}) / 1e6"

    LOCK_JOB = "SELECT fence FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    # A locking read sees the newest committed attempt, whatever the transaction's snapshot.
    LAST_COMMAND_LOCKED = Ledger.LAST_COMMAND + " LOCK IN SHARE MODE"

    LOG_ATTEMPT = """
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at, reason,
                                   command_hash, output)
        SELECT job, period, attempt, fence, owner, 'running', started_at, %(reason)s,
               %(command_hash)s, NULL
        FROM once_runs WHERE job = %(job)s AND period = %(period)s"""

    # MySQL 8 reserves LAG (a window function): quote it.
    JOB_INFO = Ledger.JOB_INFO.replace(" lag,", " `lag`,")

    LOCK_STATE = "SELECT state, state_version FROM once_jobs WHERE job = %(job)s FOR UPDATE"

    ADVANCE_STATE = """
        UPDATE once_jobs SET state = %(state)s, state_version = state_version + 1
        WHERE job = %(job)s"""

    # Not INSERT IGNORE: that would also turn a value the column cannot hold into a warning.
    SEED_JOB = f"""
        INSERT INTO once_jobs (job, fence, fires, kind, schedule, tz, `lag`, max_attempts,
                               stale_after, shards, first_period_start, created_at,
                               last_fire_at)
        VALUES (%(job)s, 0, 0, %(kind)s, %(schedule)s, %(tz)s, %(lag)s, %(max_attempts)s,
                %(stale_after)s, %(shards)s, %(period_start)s, {_MY_NOW}, {_MY_NOW})
        ON DUPLICATE KEY UPDATE job = job"""

    SET_STATE = """
        UPDATE once_jobs SET state = %(state)s,
               state_version = LAST_INSERT_ID(state_version + 1)
        WHERE job = %(job)s"""

    LOG_STATE = f"""
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   finished_at, outcome, reason)
        SELECT job, '(state)', state_version, fence, %(owner)s, 'done', {_MY_NOW}, {_MY_NOW},
               'state-set', %(reason)s
        FROM once_jobs WHERE job = %(job)s"""

    RENEW = f"""
        UPDATE once_runs SET heartbeat_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    FINISH_RUN = f"""
        UPDATE once_runs SET status = %(status)s, exit_code = %(exit_code)s,
               finished_at = {_MY_NOW}, heartbeat_at = {_MY_NOW}
        WHERE job = %(job)s AND period = %(period)s AND attempt = %(attempt)s
          AND status = 'running'"""

    FINISH_ATTEMPT = """
        UPDATE once_attempts a JOIN once_runs r ON r.job = a.job AND r.period = a.period
        SET a.status = r.status, a.exit_code = r.exit_code, a.finished_at = r.finished_at,
            a.outcome = %(outcome)s, a.output = %(output)s
        WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = %(attempt)s"""

    def _open(self) -> Any:
        import pymysql
        from pymysql.constants import CLIENT

        # FOUND_ROWS: an UPDATE reports the rows it matched, not those it changed, so two
        # renewals within one clock tick still say "still ours".
        return pymysql.connect(
            **self.target.connect_args, autocommit=False, client_flag=CLIENT.FOUND_ROWS,
            connect_timeout=self.statement_timeout, read_timeout=self.statement_timeout,
            write_timeout=self.statement_timeout,
        )

    def _claim(self, params: dict[str, Any]) -> Claim:
        params = {**params, "rerun": int(params["rerun"])}
        for attempt in range(5):
            try:
                return self._claim_once(params)
            except Exception as exc:
                self._rollback()
                if _mysql_code(exc) not in (_DEADLOCK, _LOCK_WAIT) or attempt == 4:
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _claim_once(self, params: dict[str, Any]) -> Claim:
        cur = self._conn.cursor()
        if params["max_skew"]:
            cur.execute(self.SKEW, params)
            (db_minus_host,) = cur.fetchone()
            if abs(float(db_minus_host)) > params["max_skew"]:
                self._conn.rollback()
                raise _skew(params, float(db_minus_host))
        if params["require_same"]:
            # The job row's lock first: every claim of the job serialises on it, so the
            # newest attempt read next is the newest there is, until our commit.
            cur.execute(self.LOCK_JOB, params)
            cur.execute(self.LAST_COMMAND_LOCKED, params)
            last = cur.fetchone()
            if last is not None and last[0] != params["command_hash"]:
                self._conn.rollback()
                raise CommandDrift(params["job"], last[0], params["command_hash"])
        cur.execute(self.UPSERT_JOB, params)
        fence = cur.lastrowid
        params = {**params, "fence": fence}
        try:
            cur.execute(self.INSERT_RUN, params)
            attempt = 1
        except Exception as exc:
            # Only a duplicate key means "the row exists"; never INSERT IGNORE, which would
            # turn a bad value or a missing column into a warning and a silent skip.
            if _mysql_code(exc) != _DUPLICATE_KEY:
                raise
            if cur.execute(self.TAKE_OVER, params) != 1:
                cur.execute(self.HOLDER, params)
                held = cur.fetchone()
                self._conn.commit()
                return _holder(held)
            attempt = cur.lastrowid
        cur.execute(self.LOG_ATTEMPT, params)
        cur.execute(self.LOCK_STATE, params)  # the job row is ours until the commit anyway
        state, version = cur.fetchone()
        self._conn.commit()
        return Claim(True, attempt, fence, state=state, state_version=version)

    def _renew(self, params: dict[str, Any]) -> bool:
        try:
            matched = self._conn.cursor().execute(self.RENEW, params)
            self._conn.commit()
        except Exception:
            self._rollback()
            raise
        return bool(matched == 1)

    def _write(self, sql: str, params: dict[str, Any]) -> None:
        try:
            self._conn.cursor().execute(sql, params)
            self._conn.commit()
        except Exception:
            self._rollback()
            raise

    def _finish(self, params: dict[str, Any]) -> bool:
        try:
            cur = self._conn.cursor()
            if cur.execute(self.FINISH_RUN, params) != 1:
                self._conn.rollback()
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
            self._conn.commit()
        except Exception:
            self._rollback()
            raise
        return True

    def _finish_with_state(self, params: dict[str, Any]) -> bool:
        try:
            cur = self._conn.cursor()
            cur.execute(self.LOCK_STATE, params)
            row = cur.fetchone()
            if (row is None or row[1] != params["state_version"]
                    or cur.execute(self.FINISH_RUN, params) != 1):
                self._conn.rollback()
                return False
            cur.execute(self.FINISH_ATTEMPT, params)
            cur.execute(self.ADVANCE_STATE, params)
            self._conn.commit()
        except Exception:
            self._rollback()
            raise
        return True

    def _finish_on(self, connection: Any, params: dict[str, Any]) -> bool:
        cur = connection.cursor()
        if cur.execute(self.FINISH_RUN, params) != 1:
            return False
        cur.execute(self.FINISH_ATTEMPT, params)
        return True

    def _set_state(self, params: dict[str, Any]) -> int:
        try:
            cur = self._conn.cursor()
            if params["seed"]:
                cur.execute(self.SEED_JOB, params)
            if cur.execute(self.SET_STATE, params) != 1:
                self._conn.rollback()
                raise LedgerError(f"unknown job {params['job']!r}: it has never run")
            version = cur.lastrowid
            cur.execute(self.LOG_STATE, params)
            self._conn.commit()
        except LedgerError:
            raise
        except Exception:
            self._rollback()
            raise
        return int(version)

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        try:
            cur = self._conn.cursor()
            cur.execute(sql, params)
            rows = [tuple(r) for r in cur.fetchall()]
            self._conn.commit()  # end the snapshot: the next read sees new rows
        except Exception:
            self._rollback()
            raise
        return rows

    def _rollback(self) -> None:
        with suppress(Exception):  # the connection is broken; the next statement reconnects
            self._conn.rollback()

    def _time(self, instant: datetime) -> Any:
        return instant.astimezone(UTC).replace(tzinfo=None)

    def _is_schema_error(self, exc: Exception) -> bool:
        return _mysql_code(exc) in (1146, 1054)  # no such table, unknown column


def _shut_down(fd: int) -> None:
    """Shut a connection's socket down under its driver: the pending read fails at once."""
    import socket

    with suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _named(sql: str) -> str:
    """%(name)s placeholders as sqlite3's :name."""
    import re

    return re.sub(r"%\((\w+)\)s", r":\1", sql)


def _mysql_code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


LEDGERS: dict[str, type[Ledger]] = {
    "sqlite": SqliteLedger, "postgresql": PostgresLedger, "mysql": MysqlLedger,
}


def open_ledger(target: Target, timeout: float = 10.0) -> Ledger:
    """A ledger for the target's dialect; connects lazily, on the first statement."""
    return LEDGERS[target.dialect](target, timeout)

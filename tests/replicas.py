"""PostgreSQL primaries with a standby each, from Debian's binaries (/usr/lib/postgresql/*/bin),
on loopback ports of their own: the failover tests (tests/integration/test_failover.py) stop
a primary as a crash would (`pg_ctl stop -m immediate`) and promote its standby by hand
(`pg_ctl promote`), as a failover manager does.

- `Pair(sync=True)`: a synchronous standby (`synchronous_standby_names = '*'`,
  `synchronous_commit = on`): every commit is flushed on the standby before it is answered.
- `Pair(sync=False, relayed=True)`: an asynchronous standby whose WAL stream goes through a
  TCP relay (socat) that the test pauses and then cuts, so that what the primary committed
  meanwhile is really lost to the standby.
- `Haproxy`: Debian's haproxy in TCP mode in front of a pair, the standby as `backup`.

Run as the `postgres` user when the tests run as root (initdb refuses root). Every server,
relay and haproxy is stopped by the fixture that started it, and at exit.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import psycopg

from helpers import wait_for
from procs import stopped

REQUIRED = os.environ.get("ONCE_TEST_REPLICAS") == "required"


def postgres_bin() -> Path | None:
    """The newest of Debian's PostgreSQL binary directories that has initdb, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def missing() -> str:
    """Why the failover tests cannot run here ('' when they can)."""
    if postgres_bin() is None:
        return "Debian's PostgreSQL binaries (/usr/lib/postgresql/*/bin) are not installed"
    if shutil.which("socat") is None:
        return "socat is not installed"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the servers as"
    return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _owner() -> dict[str, Any]:
    """subprocess arguments that run a server's programs as its owner."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def _run(*argv: str | Path, timeout: float = 120) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, cwd="/", **_owner())
    if done.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({done.returncode}): "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
max_connections = 200
shared_buffers = 16MB
wal_level = replica
max_wal_senders = 8
wal_keep_size = 256MB
hot_standby = on
fsync = off
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 500ms
log_min_messages = warning
"""


class Node:
    """One PostgreSQL server: a data directory and a port."""

    def __init__(self, root: Path, name: str, port: int | None = None) -> None:
        self.root, self.name = root, name
        self.data = root / name
        self.port = port or free_port()
        self.up = False

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def configure(self) -> None:
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(SETTINGS.format(port=self.port, sockets=self.root))

    def initdb(self) -> None:
        _run(BIN / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
             "--no-sync", "-E", "UTF8", "--locale=C.UTF-8")
        self.configure()
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")

    def start(self) -> None:
        _run(BIN / "pg_ctl", "-D", self.data, "-l", self.root / f"{self.name}.log", "-w",
             "-t", "60", "start")
        self.up = True

    def stop(self, mode: str = "fast") -> None:
        if self.up:
            _run(BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")
            self.up = False

    def promote(self) -> None:
        _run(BIN / "pg_ctl", "-D", self.data, "-w", "-t", "60", "promote")
        wait_for(lambda: not self.scalar("SELECT pg_is_in_recovery()"), timeout=60,
                 what=f"{self.name} to leave recovery")

    def sql(self, statement: str, params: Any = None, database: str = "postgres") -> list[Any]:
        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def scalar(self, statement: str, params: Any = None, database: str = "postgres") -> Any:
        return self.sql(statement, params, database)[0][0]

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data, ignore_errors=True)


class Relay:
    """socat between a standby and its primary: the WAL stream passes through it, so that the
    test can pause it (the standby receives nothing more) and cut it (what it held is lost)."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork",
             f"TCP:127.0.0.1:{target_port}"], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._listening, what="the relay to listen")

    def _listening(self) -> bool:
        with socket.socket() as sock, suppress(OSError):
            sock.connect(("127.0.0.1", self.port))
            return True
        return False

    def pause(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def cut(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


BIN: Path = postgres_bin() or Path("/nonexistent")


class Pair:
    """A primary and its standby (synchronous or not; its WAL through a relay or not)."""

    def __init__(self, name: str, sync: bool, relayed: bool = False) -> None:
        self.name, self.sync, self.relayed = name, sync, relayed
        self.root = Path(tempfile.mkdtemp(prefix=f"once-{name}-"))
        self.root.chmod(0o755)
        _chown(self.root)
        atexit.register(self.destroy)
        self.generation = 0
        self.primary = self._node()
        self.primary.initdb()
        self.primary.start()
        self.standby = self._node()
        self.relay: Relay | None = None
        self._attach_standby()

    def _node(self, port: int | None = None) -> Node:
        self.generation += 1
        return Node(self.root, f"n{self.generation}", port)

    def _attach_standby(self) -> None:
        """A fresh standby of the primary (a base backup, -R: it streams from there on)."""
        source = self.primary.port
        if self.relay is not None:  # the one of the standby this replaces (a test that failed
            self.relay.cut()        # before its failover left it paused)
        if self.relayed:
            self.relay = Relay(self.primary.port)
            source = self.relay.port
        _run(BIN / "pg_basebackup", "-D", self.standby.data, "-h", "127.0.0.1", "-p",
             str(source), "-U", "postgres", "-R", "-X", "stream", "--no-sync", "-c", "fast")
        self.standby.configure()  # its own port (the copied conf says the primary's)
        self.standby.start()
        names = "'*'" if self.sync else "''"
        self.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = {names}")
        self.primary.sql("SELECT pg_reload_conf()")
        self.streaming()

    def streaming(self) -> None:
        """Wait until the standby streams (and, synchronous, confirms every commit)."""
        state = "sync_state = 'sync'" if self.sync else "state = 'streaming'"
        wait_for(lambda: self.primary.scalar(
            f"SELECT count(*) FROM pg_stat_replication WHERE {state}") == 1,
            timeout=60, what=f"{self.standby.name} to stream")

    def caught_up(self) -> None:
        """Wait until the standby has replayed everything the primary has written."""
        lsn = self.primary.scalar("SELECT pg_current_wal_lsn()")
        wait_for(lambda: self.standby.scalar(
            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(lsn),)), timeout=60,
            what=f"{self.standby.name} to replay up to {lsn}")

    def fail_over(self) -> None:
        self.crash_primary()
        self.promote_standby()

    def crash_primary(self) -> None:
        """The primary dies: an immediate stop, a crash as clients see it; the relay, if
        any, goes with it (what it held is lost)."""
        self.primary.stop("immediate")
        if self.relay is not None:
            self.relay.cut()

    def promote_standby(self) -> None:
        """The standby is promoted, as a failover manager does: with no standby left, the new
        primary commits without waiting for one (Patroni's synchronous mode does the same)."""
        self.standby.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        self.standby.sql("SELECT pg_reload_conf()")
        self.standby.promote()
        self.primary, self.standby = self.standby, self.primary

    def rebuild(self, same_port: bool = False) -> None:
        """After a failover: the old primary is thrown away and a fresh standby of the new
        one takes its place, so that the next test finds the pair whole (a primary that a
        test left crashed is failed over first). With same_port, on the old primary's port:
        a multi-host URL then names the pair through any number of failovers (the torture's
        HA scenario)."""
        if not self.primary.up:
            self.promote_standby()
        port = self.standby.port if same_port else None
        self.standby.remove()
        self.standby = self._node(port)
        self._attach_standby()

    def destroy(self) -> None:
        if self.relay is not None:
            with suppress(Exception):
                self.relay.cut()
        for node in (self.primary, self.standby):
            with suppress(Exception):
                node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def multi_host_url(self, database: str) -> str:
        """Both servers, libpq choosing the one that takes writes (the query form of a
        multi-host URL, which SQLAlchemy reads too)."""
        return (f"postgresql://postgres@/{database}?host=127.0.0.1,127.0.0.1"
                f"&port={self.primary.port},{self.standby.port}"
                f"&target_session_attrs=read-write&connect_timeout=2")


HAPROXY = """
global
    maxconn 2000
defaults
    mode tcp
    timeout connect 1s
    timeout client 120s
    timeout server 120s
listen ledger
    bind 127.0.0.1:{port}
    default-server inter 200ms fall 1 rise 1 on-marked-down shutdown-sessions
    server primary 127.0.0.1:{primary} check
    server standby 127.0.0.1:{standby} check backup
"""


class Haproxy:
    """Debian's haproxy, TCP mode: the primary, and its standby as `backup` (used only while
    the primary is down: before its promotion, a standby that refuses writes)."""

    def __init__(self, pair: Pair) -> None:
        self.port = free_port()
        self.config = pair.root / f"haproxy-{self.port}.cfg"
        self.config.write_text(HAPROXY.format(port=self.port, primary=pair.primary.port,
                                              standby=pair.standby.port))
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        wait_for(lambda: self._answers(pair) or self.proc.poll() is not None,
                 what="haproxy to forward")
        if self.proc.poll() is not None:
            raise RuntimeError(f"haproxy did not start: {self.proc.stderr.read()}")

    def _answers(self, pair: Pair) -> bool:
        with suppress(psycopg.Error), psycopg.connect(self.url("postgres"),
                                                      connect_timeout=2) as conn:
            conn.execute("SELECT 1")
            return True
        return False

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?connect_timeout=2"

    def stop(self) -> None:
        stopped(self.proc, timeout=10)

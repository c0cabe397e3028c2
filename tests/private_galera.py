"""A three-node MariaDB Galera cluster on loopback, for tests/integration/test_galera.py: three
`mariadbd --wsrep-on=ON` from Debian's mariadb-server and galera-4, each with a data
directory of its own. The first node starts a new cluster, the other two join it empty and
get its data by rsync. Run as the `mysql` user (as root, the joiner's rsync would write as
`nobody` and fail). Optional: haproxy in front of it, node 1 the writer, nodes 2 and 3 its
backups, as Galera is usually fronted.

Its ports are a block of its own (Ports): the first of BLOCKS whose lock file this process
can lock and whose ports nobody listens on. A node killed and started again binds the same
ports, so they come from below the kernel's ephemeral range (a client's connection never
holds one), and the lock (released by the kernel when its holder dies, however) keeps two
sessions on one machine, or a session and `make torture`, from picking the same block.

Started once per session by tests/conftest.py when ONCE_TEST_BACKENDS names `galera` (a
cluster that does not start fails the session, never skips), stopped at its end. Under
pytest-xdist the controller starts it and a worker attaches to it (`attach`): whoever started
a node, its pid is in n{N}/launched.pid, so that any process of the session can kill a node,
start it again, or stop it at the end (the controller). Its fixture, registered by
tests/conftest.py: `galera` (the cluster, whole: a node a test killed is brought back before
the next test gets it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_for
from ledger_sql import server_rows
from procs import reaped

NODES = (1, 2, 3)
PROVIDER = "/usr/lib/galera/libgalera_smm.so"
# The blocks of ports a cluster may take (Ports), each from its base: below the kernel's
# ephemeral range (32768 on), clear of the servers' usual ports.
BLOCKS = range(13300, 14300, 100)


@dataclass(frozen=True)
class Ports:
    """A cluster's ports, from its block's base: haproxy's on base, node N's SQL on base + N,
    group communication on base + 10 + N, incremental state transfer on base + 20 + N and
    snapshot transfer (rsync) on base + 30 + N."""

    base: int

    @property
    def proxy(self) -> int:
        return self.base

    def sql(self, node: int) -> int:
        return self.base + node

    def gcomm(self, node: int) -> int:
        return self.base + 10 + node

    def ist(self, node: int) -> int:
        return self.base + 20 + node

    def sst(self, node: int) -> int:
        return self.base + 30 + node

    def all(self) -> list[int]:
        return [self.proxy, *(port(n) for n in NODES
                              for port in (self.sql, self.gcomm, self.ist, self.sst))]


class NodeProcess:
    """A node's server as a Popen has it (pid, poll, kill, terminate, wait), whether this
    process started it (its Popen) or another process of the session did (its pid alone)."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid, self.popen = pid, popen

    def poll(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        return None if _running(self.pid) else -1  # another's child: its status is not ours

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def wait(self, timeout: float | None = None) -> int:
        if self.popen is not None:
            return self.popen.wait(timeout=timeout)
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while _running(self.pid):
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        return -1

    def _signal(self, number: int) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.pid, number)


class GaleraCluster:
    """Three Galera nodes of one cluster, each killable and brought back whole."""

    def __init__(self, root: Path | None = None) -> None:
        """A new cluster's place (start() starts it), or, given the root of the session's
        running cluster, that cluster (another process of the session started it)."""
        self.mariadbd = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin")
        self.install = shutil.which("mariadb-install-db")
        self.as_mysql = os.geteuid() == 0
        self.procs: dict[int, NodeProcess] = {}
        self.proxy: subprocess.Popen[bytes] | None = None
        self.owner = root is None  # the process that stops it at the end
        self.block_lock: int | None = None  # the owner's: its block's lock file, open
        if root is not None:
            self.root = root
            self.ports = Ports(int((root / "ports").read_text()))
            self.procs = {node: NodeProcess(pid) for node in NODES
                          if (pid := self._launched(node)) is not None}
            return
        missing = [what for what, found in (("mariadbd", self.mariadbd),
                                            ("mariadb-install-db", self.install),
                                            (PROVIDER, os.path.exists(PROVIDER)),
                                            ("rsync", shutil.which("rsync")))
                   if not found]
        if missing:
            raise RuntimeError(f"a Galera cluster needs {', '.join(missing)} (Debian's "
                               f"mariadb-server, galera-4 and rsync)")
        _reclaim_abandoned()
        self.ports, self.block_lock = _free_block()
        try:
            self.root = Path(tempfile.mkdtemp(prefix="once-galera-"))
            (self.root / "session.pid").write_text(str(os.getpid()))
            (self.root / "ports").write_text(str(self.ports.base))
            self._own(self.root)
        except BaseException:  # no cluster: its block is not this session's to hold
            os.close(self.block_lock)
            raise

    # -- life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Node 1 starts a new cluster; 2 and 3 join it (rsync state transfer)."""
        first = self._datadir(1)
        subprocess.run([str(self.install), "--no-defaults", f"--datadir={first}",
                        *self._user(), "--auth-root-authentication-method=normal",
                        "--skip-test-db"], check=True, capture_output=True, timeout=180)
        self._launch(1, "--wsrep-new-cluster")
        wait_for(lambda: self._synced(1), timeout=120, what="Galera node 1 to start")
        self.join(2, 3)

    def join(self, *nodes: int) -> None:
        """Start these nodes empty: each joins the cluster and receives its data."""
        for node in nodes:
            shutil.rmtree(self.root / f"n{node}", ignore_errors=True)
            self._datadir(node)
            self._launch(node)
        for node in nodes:
            wait_for(lambda n=node: self._synced(n), timeout=180,  # type: ignore[misc]
                     what=f"Galera node {node} to join")
        wait_for(lambda: all(self.size(n) == len(NODES) for n in NODES), timeout=60,
                 what="the cluster to count three nodes on each")

    def kill(self, node: int) -> None:
        """SIGKILL the node's server, as a crash of its machine would end it."""
        proc = self.procs.pop(node)
        proc.kill()
        proc.wait(timeout=30)

    def heal(self) -> None:
        """Bring every node that is down back into the cluster."""
        down = [node for node in NODES if node not in self.procs
                or self.procs[node].poll() is not None]
        if down:
            self.join(*down)

    def stop(self) -> None:
        """Stop what this process started (haproxy); the owner stops every node and haproxy,
        whoever started them (their pid files), and removes the cluster's directory."""
        if self.proxy is not None:
            self.proxy.terminate()
            with suppress(subprocess.TimeoutExpired):
                self.proxy.wait(timeout=10)
            self.proxy = None
        if not self.owner:
            return
        proxy = _pid_in(self.root / "haproxy.pid")
        if proxy is not None:  # a worker's, if it died before stopping it
            NodeProcess(proxy).kill()
        ours = {proc.pid: proc for proc in self.procs.values()}
        latest = [ours.get(pid) or NodeProcess(pid) for pid in map(self._launched, NODES)
                  if pid is not None]  # whoever started it: a worker may have, after a kill
        for proc in latest:
            proc.terminate()
        for proc in latest:
            reaped(proc, 60)  # type: ignore[arg-type]
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.block_lock is not None:
            os.close(self.block_lock)  # the block is free for the next cluster
            self.block_lock = None

    # -- haproxy in front ----------------------------------------------------------------

    def start_proxy(self) -> str:
        """haproxy on the block's first port, node 1 the writer and 2, 3 its backups (a new
        connection goes to the first that is up); its URL without a database."""
        if self.proxy is None:
            haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
            if haproxy is None:
                raise RuntimeError("haproxy is not installed (Debian's haproxy; .ci/run "
                                   "installs it)")
            config = self.root / "haproxy.cfg"
            config.write_text(_haproxy_config(self.ports))
            with open(self.root / "haproxy.log", "wb") as log:
                self.proxy = subprocess.Popen([haproxy, "-db", "-f", str(config)],
                                              stdout=log, stderr=log)
            (self.root / "haproxy.pid").write_text(str(self.proxy.pid))
            wait_for(lambda: self._answers(self.ports.proxy), timeout=30,
                     what="haproxy to answer")
        return f"mariadb://root@127.0.0.1:{self.ports.proxy}"

    # -- reading it ----------------------------------------------------------------------

    def url(self, node: int, database: str) -> str:
        return f"mariadb://root@127.0.0.1:{self.ports.sql(node)}/{database}"

    def hosts_url(self, nodes: Sequence[int], database: str) -> str:
        """A URL that lists these nodes, in this order."""
        hosts = ",".join(f"127.0.0.1:{self.ports.sql(n)}" for n in nodes)
        return f"mariadb://root@{hosts}/{database}"

    def execute(self, node: int, sql: str, database: str | None = None
                ) -> list[tuple[object, ...]]:
        return server_rows(self.ports.sql(node), sql, database)

    def new_database(self) -> str:
        """A fresh database (made on node 1, so on every node): its name."""
        name = "once_g_" + uuid.uuid4().hex[:12]
        self.execute(1, f"CREATE DATABASE {name}")
        wait_for(lambda: all(self.execute(n, f"SHOW DATABASES LIKE '{name}'") for n in NODES),
                 timeout=30, what=f"database {name} on every node")
        return name

    @contextmanager
    def watch(self, node: int) -> Iterator[NodeWatch]:
        """One connection to the node, held for the block, to refuse its clients' queries and
        see them come back (the node accepts queries again at the block's end)."""
        watcher = NodeWatch(self.ports.sql(node))
        try:
            yield watcher
        finally:
            watcher.close()

    def size(self, node: int) -> int:
        rows = self.execute(node, "SHOW STATUS LIKE 'wsrep_cluster_size'")
        return int(str(rows[0][1])) if rows else 0

    def check(self) -> None:
        for node in NODES:
            assert self._synced(node), f"Galera node {node} is not synced"

    def _synced(self, node: int) -> bool:
        proc = self.procs.get(node)
        if proc is not None and proc.poll() is not None:
            log = self.root / f"n{node}" / "error.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"Galera node {node} exited {proc.returncode}:\n{tail}")
        try:
            rows = self.execute(node, "SHOW STATUS LIKE 'wsrep_local_state_comment'")
        except Exception:
            return False
        return bool(rows) and rows[0][1] == "Synced"

    def _answers(self, port: int) -> bool:
        import pymysql

        try:
            pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2).close()
        except Exception:
            return False
        return True

    # -- plumbing ------------------------------------------------------------------------

    def _user(self) -> list[str]:
        return ["--user=mysql"] if self.as_mysql else []

    def _own(self, path: Path) -> None:
        if self.as_mysql:
            shutil.chown(path, "mysql", "mysql")

    def _datadir(self, node: int) -> Path:
        data = self.root / f"n{node}" / "data"
        data.mkdir(parents=True, exist_ok=True)
        self._own(data.parent)
        self._own(data)
        return data

    def _launched(self, node: int) -> int | None:
        """The pid of the node's latest server, whichever process of the session started it."""
        return _pid_in(self.root / f"n{node}" / "launched.pid")

    def _launch(self, node: int, *extra: str) -> None:
        home = self.root / f"n{node}"
        ports = self.ports
        peers = ",".join(f"127.0.0.1:{ports.gcomm(n)}" for n in NODES)
        provider = (f"gmcast.listen_addr=tcp://127.0.0.1:{ports.gcomm(node)};"
                    f"ist.recv_addr=127.0.0.1:{ports.ist(node)};gcache.size=16M")
        popen = subprocess.Popen(
            [str(self.mariadbd), "--no-defaults", *self._user(), f"--datadir={home}/data",
             f"--port={ports.sql(node)}", "--bind-address=127.0.0.1",
             f"--socket={home}/socket", f"--pid-file={home}/pid",
             f"--log-error={home}/error.log", "--skip-name-resolve", "--skip-log-bin",
             "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=16M",
             "--max-connections=300", "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
             "--default-storage-engine=InnoDB", "--wsrep-on=ON", f"--wsrep-provider={PROVIDER}",
             "--wsrep-cluster-name=once-test", f"--wsrep-cluster-address=gcomm://{peers}",
             f"--wsrep-node-address=127.0.0.1:{ports.gcomm(node)}",
             f"--wsrep-node-name=n{node}", "--wsrep-sst-method=rsync",
             f"--wsrep-sst-receive-address=127.0.0.1:{ports.sst(node)}",
             f"--wsrep-provider-options={provider}", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs[node] = NodeProcess(popen.pid, popen)
        (home / "launched.pid").write_text(str(popen.pid))


class NodeWatch:
    """A node's queries refused (wsrep_reject_queries = ALL: error 1047 for every statement,
    as outside a Primary component) until a client reconnects, which `once` does only after a
    statement failed. One connection of its own, so that the count of connections the node
    has seen grows by the others' alone."""

    def __init__(self, port: int) -> None:
        import pymysql

        self.conn = pymysql.connect(host="127.0.0.1", port=port, user="root",
                                    autocommit=True, connect_timeout=5)

    def connections(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Connections'")
            return int(cur.fetchone()[1])

    def reject(self, on: bool) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"SET GLOBAL wsrep_reject_queries = {'ALL' if on else 'NONE'}")

    @contextmanager
    def refusing(self) -> Iterator[None]:
        """Refuse every statement from the block's start until a client reconnects after it
        (or, on failure, the block's end)."""
        before = self.connections()
        self.reject(True)
        try:
            yield
            wait_for(lambda: self.connections() > before, timeout=60,
                     what="a client to reconnect after a refused statement")
        finally:
            self.reject(False)

    def close(self) -> None:
        with suppress(Exception):
            self.reject(False)
        self.conn.close()


def _haproxy_config(ports: Ports) -> str:
    # TCP checks every 200 ms, down after two misses; a connection refused by a server not yet
    # marked down goes to the next one (redispatch).
    servers = "\n".join(
        f"    server n{n} 127.0.0.1:{ports.sql(n)} check{'' if n == 1 else ' backup'}"
        for n in NODES)
    return f"""global
    maxconn 1000

defaults
    mode tcp
    retries 3
    option redispatch
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    default-server inter 200ms fall 2 rise 2

listen galera
    bind 127.0.0.1:{ports.proxy}
{servers}
"""


def _free_block() -> tuple[Ports, int]:
    """The first block whose lock this process takes and whose ports are all free, and its
    lock file's descriptor (held open: the lock lasts as long as it, or this process)."""
    import fcntl

    for base in BLOCKS:
        fd = _lock_file(Path(tempfile.gettempdir()) / f"once-galera-ports-{base}.lock")
        if fd is None:  # another user's, which this one may not open: taken
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another session's cluster
            os.close(fd)
            continue
        ports = Ports(base)
        if not any(map(_listening, ports.all())):
            return ports, fd
        os.close(fd)  # not a cluster of ours: a server of the machine's
    raise RuntimeError(f"no block of ports for the Galera test cluster is free: each of the "
                       f"{len(BLOCKS)} from {BLOCKS[0]} is another session's or has a port "
                       f"taken")


def _lock_file(path: Path) -> int | None:
    """The lock file, open for reading (all flock needs: another user's made it readable),
    made if missing; None when it cannot be opened."""
    with suppress(FileNotFoundError):
        return os.open(path, os.O_RDONLY)
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None


def _reclaim_abandoned() -> None:
    """Stop the servers of a cluster whose session died (SIGKILL, or SIGTERM without its
    atexit) and remove its directory; a live session's cluster is left alone."""
    roots: dict[Path, list[int]] = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        root = next((Path(arg.partition("=")[2]).parents[1] for arg in argv
                     if arg.startswith(f"--datadir={tempfile.gettempdir()}/once-galera-")),
                    None) or next((Path(arg).parent for arg in argv
                                   if arg.endswith("haproxy.cfg") and "/once-galera-" in arg),
                                  None)
        if root is not None and proc.name.isdigit():
            roots.setdefault(root, []).append(int(proc.name))
    for root, pids in roots.items():
        owner = root / "session.pid"
        with suppress(OSError, ValueError):
            if _running(int(owner.read_text())):
                continue  # its session is alive
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda ps=pids: not any(map(_running, ps)),  # type: ignore[misc]
                 timeout=30, what=f"the abandoned cluster in {root} to stop")
        shutil.rmtree(root, ignore_errors=True)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap what it inherits)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


_cluster: GaleraCluster | None = None


def cluster() -> GaleraCluster:
    """The session's cluster, started on first use (tests/conftest.py's session start)."""
    global _cluster
    if _cluster is None:
        started = GaleraCluster()
        try:
            started.start()
        except BaseException:
            started.stop()
            raise
        atexit.register(stop_cluster)  # the session's end stops it too; this, if it died
        _cluster = started
    return _cluster


def current() -> GaleraCluster | None:
    """The session's cluster if this process started or attached to it."""
    return _cluster


def attach(root: Path) -> None:
    """This process (an xdist worker) uses the cluster that the controller started in root;
    stop_cluster() leaves its nodes to the controller."""
    global _cluster
    _cluster = GaleraCluster(root)


def stop_cluster() -> None:
    global _cluster
    if _cluster is not None:
        _cluster.stop()
        _cluster = None


@pytest.fixture
def galera() -> Iterator[GaleraCluster]:
    """The cluster, all three nodes synced (a node an earlier test killed is back)."""
    from conftest import BACKENDS

    if "galera" not in BACKENDS:
        pytest.skip("name galera in ONCE_TEST_BACKENDS for the Galera cluster's tests")
    started = cluster()
    started.heal()
    yield started


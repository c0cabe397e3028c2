"""No output of `once` ever holds the ledger's password (docs/concepts/ledger.md), whatever
the password holds and whatever the driver says about it.

Hostile passwords (a raw %, spaces, quotes, @ and :, / ? #, non-ASCII, a common word) are
given every way once takes one (in --db as typed and percent-encoded, ONCE_DATABASE_URL,
ONCE_DATABASE_URL_FILE, --db-password-file) to every command, against servers that fail in
the ways that quote the most: a PostgreSQL URL on a port where nothing listens (libpq quotes
a token it cannot decode before it connects), a MySQL one alike, the suite's MariaDB when it
runs (it refuses the wrong password), and a SQLite ledger that answers (the reports' captions,
JSON documents, hooks and pings). Then stdout and stderr are searched for the password as
typed, percent-encoded and decoded, and as JSON writes it.

A password that is a common word (`ledger`, `error`) is replaced wherever the word appears
(docs/concepts/ledger.md): once's own lines then read `***` in its place. `once serve`'s pages
are HTML whose words no scrubber rewrites, so they are searched for the other passwords.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, urlsplit

import pytest

from conftest import BACKENDS, _server
from helpers import run_here, run_once
from serving import Served

PASSWORDS = ["my50%offSecret", "two words  here", "it's-mine", 'say"cheese"', "p@ss@word",
             "a:b:c", "a/b?c#d", "pässwörd", "ledger", "error"]
COMMON_WORDS = {"ledger", "error"}
DAY = ["--every", "day"]
# Every command that opens the ledger, in this process (helpers.run_here): their reads,
# their JSON documents, their refusals.
REPORTS = [["status"], ["status", "--json"], ["status", "j"], ["status", "j", "--timeline"],
           ["check"], ["check", "--json"], ["history"], ["history", "j"],
           ["history", "--json"], ["logs", "j"], ["logs", "j", "--json"], ["metrics"],
           ["state", "j"], ["state", "j", "--set", "w"], ["doctor"], ["doctor", "--json"],
           ["schema"], ["schema", "--sql"], ["prune", "--older-than", "30d"],
           ["prune", "--older-than", "30d", "--dry-run"],
           ["periods", *DAY, "--from", "2026-01-01", "--to", "2026-01-03"],
           ["catchup", "--job", "j", *DAY, "--since", "2026-01-01", "--dry-run", "--",
            "true"]]


def forms(password: str) -> set[str]:
    """The password as typed, percent-encoded (either way), decoded, and as JSON writes it."""
    found = {password, quote(password, safe=""), quote(password), quote_plus(password),
             unquote(password), json.dumps(password)[1:-1],
             json.dumps(password, ensure_ascii=False)[1:-1]}
    return {f for f in found if f}


def leaks(output: str, password: str) -> list[str]:
    return sorted(f for f in forms(password) if f in output)


class HangsUp:
    """A loopback port whose every connection is closed at once, before a word: a server
    that fails each connection for good (a refused port would be retried as a restarting
    server, for seconds), before the driver could learn anything of the password."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closing.is_set():
            conn, _ = self.sock.accept()
            conn.close()

    def close(self) -> None:
        self.closing.set()
        socket.create_connection(("127.0.0.1", self.port), timeout=5).close()  # wakes accept
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def hangs_up() -> Iterator[HangsUp]:
    server = HangsUp()
    yield server
    server.close()


def _mariadb_refusing() -> Callable[[str], str] | None:
    """The suite's MariaDB, with a password it refuses (its test user has another, or none)."""
    if "mariadb" not in BACKENDS or not os.environ.get("ONCE_TEST_MARIADB_URL"):
        return None
    parts = urlsplit(os.environ["ONCE_TEST_MARIADB_URL"])
    where = f"{parts.hostname}:{parts.port or 3306}"
    return lambda secret: f"mysql://{parts.username or 'root'}:{secret}@{where}/test"


def _postgres_refusing() -> Callable[[str], str] | None:
    """One of the suite's PostgreSQL servers, asked for a database it does not have (or
    with a password it refuses, where it asks for one)."""
    found = [b for b in ("postgres", "embedded-postgres") if b in BACKENDS]
    if not found:
        return None
    parts = urlsplit(_server(found[0]).admin_url)
    where = f"{parts.hostname}:{parts.port or 5432}"
    user = parts.username or "postgres"
    return lambda secret: f"postgresql://{user}:{secret}@{where}/once_no_such_database"


# Each server: the URL of a password (in its user part; in its query for SQLite and where
# the query's key is percent-encoded).
Server = Callable[[str], str]
SERVERS: dict[str, Callable[[HangsUp, Path], Server | None]] = {
    "postgresql-hangs-up": lambda fake, _: (
        lambda secret: f"postgresql://u:{secret}@127.0.0.1:{fake.port}/db"),
    "mysql-hangs-up": lambda fake, _: (
        lambda secret: f"mysql://u:{secret}@127.0.0.1:{fake.port}/db"),
    "postgresql-refuses": lambda *_: _postgres_refusing(),
    "mariadb-refuses": lambda *_: _mariadb_refusing(),
    "sqlite-answers": lambda _, tmp: (
        lambda secret: f"sqlite:///{tmp}/ledger.db?password={secret}"),
    # libpq reads a query's key percent-decoded: pass%77ord is password
    "postgresql-hangs-up-key-encoded": lambda fake, _: (
        lambda secret: f"postgresql://u@127.0.0.1:{fake.port}/db?pass%77ord={secret}"),
}


def server_of(name: str, fake: HangsUp, tmp_path: Path) -> Server:
    url_of = SERVERS[name](fake, tmp_path)
    if url_of is None:
        pytest.skip(f"{name}: its server is not among ONCE_TEST_BACKENDS")
    return url_of


def deliveries(url_of: Server, password: str, tmp_path: Path,
               env: dict[str, str]) -> list[tuple[str, list[str], dict[str, str]]]:
    """Every way once is given the password: (name, options, environment)."""
    url_file = tmp_path / "url"
    url_file.write_text(url_of(password) + "\n")
    password_file = tmp_path / "password"
    password_file.write_text(password + "\n")
    bare = url_of("").replace(":@", "@").replace("password=", "x=").replace("pass%77ord=",
                                                                             "x=")
    return [("--db as typed", ["--db", url_of(password)], env),
            ("--db percent-encoded", ["--db", url_of(quote(password, safe=""))], env),
            ("ONCE_DATABASE_URL", [], {**env, "ONCE_DATABASE_URL": url_of(password)}),
            ("ONCE_DATABASE_URL_FILE", [], {**env, "ONCE_DATABASE_URL_FILE": str(url_file)}),
            ("--db-password-file", ["--db", bare, "--db-password-file", str(password_file)],
             env),
            ("ONCE_DB_PASSWORD_FILE", ["--db", bare],
             {**env, "ONCE_DB_PASSWORD_FILE": str(password_file)})]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    clean = {k: v for k, v in os.environ.items()  # PYTEST_CURRENT_TEST names the password
             if not k.startswith(("ONCE_", "PYTEST_")) and "proxy" not in k.lower()}
    yield {**clean, "XDG_STATE_HOME": str(tmp_path / "state"), "no_proxy": "*"}
    from once import secrets

    secrets.forget()  # what a Python API call of the test remembered


def _checked(result: subprocess.CompletedProcess[str], password: str, what: str) -> None:
    output = result.stdout + result.stderr
    assert not leaks(output, password), (what, leaks(output, password), output)
    assert "Traceback" not in output, (what, output)
    for line in result.stderr.splitlines():
        if line.startswith("{"):  # --log-format json: each line one JSON object
            json.loads(line)
    if "--json" in what and result.returncode in (0, 1, 2) and result.stdout.strip():
        json.loads(result.stdout)


def _seed(url_of: Server, env: dict[str, str]) -> None:
    """A run of job j on the SQLite ledger, so that the reports have rows to draw."""
    done = run_once("run", "--job", "j", *DAY, "--db", url_of("seed"), "--", "echo", "out",
                    env=env)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("server", list(SERVERS))
def test_no_report_shows_the_password(server: str, password: str, tmp_path: Path,
                                      hangs_up: HangsUp, env: dict[str, str]) -> None:
    # Every command, each given the password another way in turn (every way, every time).
    url_of = server_of(server, hangs_up, tmp_path)
    if server.startswith("sqlite"):
        _seed(url_of, env)
    ways = deliveries(url_of, password, tmp_path, env)
    for number, command in enumerate(REPORTS):
        way, options, given = ways[number % len(ways)]
        result = run_here(*command[:1], *options, *command[1:], env=given)
        _checked(result, password, f"{server}, {way}: once {' '.join(command)}")
        if not server.startswith("sqlite") and command[0] != "periods" \
                and command[:2] != ["schema", "--sql"]:
            assert result.returncode in (2, 75), (way, command, result.stderr)


@pytest.mark.parametrize("password", PASSWORDS)
def test_once_run_never_shows_the_password(password: str, tmp_path: Path, hangs_up: HangsUp,
                                           env: dict[str, str]) -> None:
    # The real `once` processes (the hot path's own lines, its JSON log, a traceback if
    # any): each way the password is given, on a server that fails in its own way.
    servers = [name for name in ("postgresql-hangs-up", "mysql-hangs-up",
                                 "postgresql-refuses", "mariadb-refuses")
               if SERVERS[name](hangs_up, tmp_path) is not None]
    commands = [["run", "--job", "j", *DAY],
                ["run", "--job", "j", *DAY, "--log-format", "json"],
                ["catchup", "--job", "j", *DAY, "--since", "2026-01-01"],
                ["rerun", "--job", "j", "--period", "2026-01-01", "--log-format", "json"]]
    for number in range(6):
        server = servers[number % len(servers)]
        url_of = server_of(server, hangs_up, tmp_path)
        way, options, given = deliveries(url_of, password, tmp_path, env)[number]
        command = commands[number % len(commands)]
        result = run_once(*command, *options, "--", "true", env=given)
        _checked(result, password, f"{server}, {way}: once {' '.join(command)}")
        assert result.returncode in (2, 75), (way, command, result.stderr)
        assert result.stderr.startswith(("once: ", "{")), result.stderr


@pytest.mark.parametrize("password", [p for p in PASSWORDS if p not in COMMON_WORDS])
@pytest.mark.parametrize("where", ["user part", "?sslpassword="])
def test_once_serve_never_shows_the_password(where: str, password: str, tmp_path: Path,
                                             hangs_up: HangsUp, env: dict[str, str]) -> None:
    # As typed, so that libpq quotes what it cannot decode (its error is the page's).
    url = (f"postgresql://u:{password}@127.0.0.1:{hangs_up.port}/db" if where == "user part"
           else f"postgresql://u@127.0.0.1:{hangs_up.port}/db?sslpassword={password}")
    if "@" in password or "/" in password:
        url = url.replace(password, quote(password, safe=""))  # else refused at the start
    served = Served("--db", url, "--read-timeout", "2s", env=env)
    try:
        pages = {path: served.get(path) for path in
                 ("/", "/job/j", "/logs/j", "/api/status", "/metrics", "/healthz")}
    finally:
        status, stderr = served.stop()
    assert status == 0, stderr
    assert pages["/healthz"].status == 503, pages["/healthz"].text
    for path, answer in pages.items():
        assert not leaks(answer.text, password), (path, answer.text)
        if path == "/api/status":
            json.loads(answer.text)
    assert not leaks(stderr, password), stderr


@pytest.mark.parametrize("password", PASSWORDS)
def test_hooks_and_pings_are_handed_no_password(password: str, tmp_path: Path,
                                                env: dict[str, str]) -> None:
    # A run that wins, on a ledger that answers: the hook's environment and the ping's
    # request hold nothing of the password (given apart from the URL, and in its query).
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    seen: list[str] = []

    class Ping(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen.append(self.path + str(self.headers) + body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET  # the success ping's body: the command's output

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Ping)
    Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        password_file = tmp_path / "password"
        password_file.write_text(password)
        url = f"sqlite:///{tmp_path}/ledger.db?password={quote(password, safe='')}"
        hook = tmp_path / "hook.env"
        result = run_once("run", "--job", "j", *DAY, "--db", url, "--db-password-file",
                          str(password_file), "--ping",
                          f"http://127.0.0.1:{httpd.server_address[1]}/p",
                          "--on-success", f"env > {hook}", "-v", "--log-format", "json",
                          "--", "true", env=env)
    finally:
        httpd.shutdown()
        httpd.server_close()
    _checked(result, password, "once run with a hook and a ping")
    assert result.returncode == 0, result.stderr
    assert seen and hook.exists()
    assert not leaks(hook.read_text() + "".join(seen), password), hook.read_text()


@pytest.mark.parametrize("url", [
    "host=127.0.0.1 password=Hunter2secret dbname=d",  # libpq's key=value form
    "host=127.0.0.1 password='Hunter2 secret' dbname=d",
    "postgresql:/u:Hunter2secret@127.0.0.1/db",  # a slash short
    "postgres//u:Hunter2secret@127.0.0.1/db",
    "host=h password=Hunter2secret://x",  # :// in it, after no scheme
    "postgresql://u:Hunter2secret@127.0.0.1/db\x1b[2J",  # a control character
])
@pytest.mark.parametrize("given", ["--db", "ONCE_DATABASE_URL", "ONCE_DATABASE_URL_FILE"])
def test_a_malformed_url_is_refused_unshown(url: str, given: str, tmp_path: Path,
                                            env: dict[str, str]) -> None:
    options: list[str] = []
    if given == "--db":
        options = ["--db", url]
    elif given == "ONCE_DATABASE_URL":
        env = {**env, "ONCE_DATABASE_URL": url}
    else:
        (tmp_path / "url").write_text(url + "\n")
        env = {**env, "ONCE_DATABASE_URL_FILE": str(tmp_path / "url")}
    for command in (["status"], ["check", "--json"], ["doctor"]):
        result = run_here(*command, *options, env=env)
        assert result.returncode == 2, result.stderr
        assert "Hunter2" not in result.stdout + result.stderr, result.stderr
        assert result.stderr.startswith("once: bad --db URL"), result.stderr
        assert "not shown, as it may hold a password" in result.stderr
    if given == "--db":  # the same line from the hot path, in a process of its own
        result = run_once("run", "--job", "j", *DAY, "--db", url, "--", "true", env=env)
        assert result.returncode == 2 and "Hunter2" not in result.stderr, result.stderr


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_python_api_raises_no_password(password: str, hangs_up: HangsUp,
                                           env: dict[str, str]) -> None:
    import once
    from once.ledger import LedgerError

    url = f"postgresql://u:{password}@127.0.0.1:{hangs_up.port}/db"
    with pytest.raises((LedgerError, ValueError)) as raised, \
            once.claim("j", every="day", db=url):
        pass
    assert not leaks(str(raised.value), password), str(raised.value)

"""`once serve` on every backend: real HTTP requests to its server in this process (its options
read by the real command line), ledgers built by real `once run` and `once catchup` processes;
a real `once serve` process where the process is the point (its first line, SIGTERM, the
ledger gone).

The outage tests stop (and freeze) a private embedded PostgreSQL of their own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from html import escape
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from helpers import run_here, run_once, wait_for
from private_postgres import PrivatePostgres
from procs import start_once
from serving import Answer, Served, ServedHere, families, samples

pytestmark = pytest.mark.tables_made  # but where a test says otherwise

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
METRICS = "text/plain; version=0.0.4; charset=utf-8"


def day(n: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=n)).isoformat()


def once(env: dict[str, str], *args: str) -> None:
    result = run_once(*args, env=env)
    assert result.returncode not in (2, 69, 70, 75), result.stderr


@pytest.fixture
def serve_process() -> Iterator[Callable[..., Served]]:
    """Start a real `once serve ARGS` process with env; each one must stop cleanly on SIGTERM:
    for what only the process shows (its first line, its stop, its ledger gone)."""
    started: list[Served] = []

    def start(*args: str, env: dict[str, str]) -> Served:
        server = Served(*args, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        status, err = server.stop()
        assert status == 0, err
        assert err.rstrip().endswith("once: stopped"), err


def row_of(page: str, job: str) -> str:
    """The overview's table row of a job."""
    link = f'href="/job/{escape(quote(job, safe=""))}"'
    rows = [r for r in page.split("<tr ")[1:] if link in r]
    assert len(rows) == 1, (job, page)
    return rows[0].split("</tr>")[0]


def job_order(page: str) -> list[str]:
    return re.findall(r'<tr class="\w+"><td><a href="/job/([^"]+)"', page)


# -- endpoints ---------------------------------------------------------------------------------


def test_each_endpoint_answers_with_its_status_and_content_type(
        once_env: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    once(once_env, "run", "--job", "nightly", "--every", "day", "--", "true")
    server = serve(env=once_env)
    expected = {"/": (200, HTML), "/healthz": (200, TEXT), "/metrics": (200, METRICS),
                "/api/status": (200, "application/json"), "/job/nightly": (200, HTML),
                "/job/nightly?x=1": (200, HTML), "/job/unknown": (404, HTML),
                "/elsewhere": (404, HTML), "/job/": (404, HTML)}
    for path, (status, content_type) in expected.items():
        answer = server.get(path)
        assert (answer.status, answer.type) == (status, content_type), path
        assert answer.headers["Cache-Control"] == "no-store"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
    page = server.get("/")
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "http://" not in page.text.replace(server.url, "") and "https://" not in page.text
    head = server.get("/", method="HEAD")
    assert (head.status, head.body) == (200, b"")
    assert int(head.headers["Content-Length"]) > 1000
    for method in ("POST", "PUT", "DELETE"):
        refused = server.get("/", method=method)
        assert refused.status == 405 and refused.headers["Allow"] == "GET, HEAD", method
    assert server.get("/healthz").text == "ok\n"


@pytest.mark.tables_made(False)  # an empty ledger
def test_an_empty_ledger_is_an_empty_fleet(once_env: dict[str, str],
                                           serve: Callable[..., ServedHere]) -> None:
    server = serve(env=once_env)  # nothing has run: no tables (SQLite: no file); none made
    assert server.get("/healthz").status == 200
    page = server.get("/")
    assert page.status == 200 and "No job has run" in page.text
    assert json.loads(server.get("/api/status").body) == []
    assert samples(server.get("/metrics").text) == set()
    printed = run_here("status", env=once_env)
    assert "no jobs in the ledger" in printed.stderr  # the ledger was left as it was


def test_the_page_shows_missing_failed_out_and_stale_periods_first(
        once_env: dict[str, str], serve: Callable[..., ServedHere], tmp_path: Path) -> None:
    # gappy: done three days ago and today; the two days between are missing.
    once(once_env, "catchup", "--job", "gappy", "--every", "day", "--since", day(-3),
         "--until", day(-3), "--", "true")
    once(once_env, "run", "--job", "gappy", "--every", "day", "--", "true")
    # flaky: today's period failed with no attempts left.
    once(once_env, "run", "--job", "flaky", "--every", "day", "--max-attempts", "1", "--",
         "false")
    # stuck: its owner was killed mid-run; the row is left running and goes stale.
    owner = start_once("run", "--job", "stuck", "--every", "day", "--stale-after", "1s", "--",
                       "sh", "-c", f'touch {tmp_path}/claimed; exec sleep 60', env=once_env)
    wait_for(lambda: (tmp_path / "claimed").exists(), what="the claim")
    owner.kill()
    owner.wait()
    once(once_env, "run", "--job", "fine", "--every", "day", "--", "true")
    server = serve(env=once_env)

    def stale_shown() -> str | None:
        page = server.get("/").text
        return page if "STALE" in row_of(page, "stuck") else None

    page = wait_for(stale_shown, what="the stale runner on the page")
    order = job_order(page)
    assert order[-1] == "fine" and set(order[:3]) == {"gappy", "flaky", "stuck"}, order
    gappy = row_of(page, "gappy")
    assert gappy.startswith('class="critical"')
    assert day(-2) in gappy and day(-1) in gappy and ">2<" in gappy
    assert gappy.count("cell s-missing") == 2 and gappy.count("cell s-done") == 2
    flaky = row_of(page, "flaky")
    assert "failed-out" in flaky and day(0) in flaky and "cell s-failed" in flaky
    stuck = row_of(page, "stuck")
    assert "#1" in stuck and "STALE" in stuck and "cell s-stale" in stuck
    assert "CRITICAL" in row_of(page, "flaky") and "OK" in row_of(page, "fine")
    # The job's page: the check verdict, the timeline and the history.
    job = server.get("/job/gappy").text
    assert f"{day(-2)}</code> missing" in job and f"{day(-1)}</code> missing" in job
    assert 'class="timeline"' in job and "g-missing" in job
    assert job.split("<tbody>")[1].count("<tr>") == 2  # two attempts
    flaky_page = server.get("/job/flaky").text
    assert "failed-out (attempt 1 of 1, exit 1, no attempts left)" in flaky_page
    stuck_page = server.get("/job/stuck").text
    assert "stale" in stuck_page and "WARNING" in stuck_page


def test_metrics_parse_and_agree_with_once_metrics_and_status_json(
        once_env: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    once(once_env, "catchup", "--job", "report", "--every", "day", "--since", day(-4),
         "--until", day(-2), "--", "true")
    once(once_env, "run", "--job", "report", "--every", "day", "--", "false")
    once(once_env, "run", "--job", "sync", "--every", "hour", "--", "true")
    once(once_env, "run", "--job", "sync", "--every", "hour", "--", "true")  # a skip
    server = serve(env=once_env)
    scraped = server.get("/metrics")
    assert scraped.status == 200 and scraped.type == METRICS
    printed = run_here("metrics", env=once_env)
    assert printed.returncode == 0, printed.stderr
    assert samples(scraped.text) == samples(printed.stdout)
    assert scraped.text == printed.stdout
    kinds = families(scraped.text)
    assert kinds["once_runs"] == "counter" and kinds["once_missing_periods"] == "gauge"
    found = {(name, dict(labels).get("once_job")): value
             for name, labels, value in samples(scraped.text)}
    assert found[("once_missing_periods", "report")] == 1  # yesterday
    assert found[("once_fires_total", "sync")] == 2
    status = json.loads(server.get("/api/status").body)
    assert status == json.loads(run_here("status", "--json", env=once_env).stdout)


def test_a_namespace_shows_its_own_jobs_only(once_env: dict[str, str],
                                             serve: Callable[..., ServedHere]) -> None:
    for namespace in ("prod", "staging"):
        once(once_env, "run", "--namespace", namespace, "--job", "invoices", "--every", "day",
             "--", "true")
    server = serve("--namespace", "prod", env=once_env)
    assert job_order(server.get("/").text) == [quote("prod:invoices", safe="")]
    assert [o["job"] for o in json.loads(server.get("/api/status").body)] == ["prod:invoices"]
    assert "staging" not in server.get("/metrics").text
    assert server.get("/job/" + quote("prod:invoices", safe="")).status == 200
    assert server.get("/job/" + quote("staging:invoices", safe="")).status == 404


def test_a_token_is_required_everywhere_but_healthz(once_env: dict[str, str], tmp_path: Path,
                                                     serve: Callable[..., ServedHere]) -> None:
    once(once_env, "run", "--job", "nightly", "--every", "day", "--", "true")
    (tmp_path / "token").write_text("s3cret-token-value\n")
    server = serve("--token-file", str(tmp_path / "token"), env=once_env)
    bearer = {"Authorization": "Bearer s3cret-token-value"}
    basic = {"Authorization": "Basic " + base64.b64encode(b"me:s3cret-token-value").decode()}
    for path in ("/", "/metrics", "/api/status", "/job/nightly", "/job/unknown", "/elsewhere",
                 "/logs/nightly", "/logs/nightly?attempt=1", "/?state=failed"):
        refused = server.get(path)
        assert refused.status == 401, path
        assert "Basic" in refused.headers["WWW-Authenticate"]
        assert b"nightly" not in refused.body
        for wrong in ("Bearer s3cret-token-valu", "Bearer s3cret-token-value2", "Bearer ",
                      "Basic " + base64.b64encode(b"s3cret-token-value:x").decode(),
                      "Basic !!!", "s3cret-token-value"):
            assert server.get(path, {"Authorization": wrong}).status == 401, (path, wrong)
        assert server.get(path, bearer).status in (200, 404), path
        assert server.get(path, basic).status in (200, 404), path
    assert server.get("/", bearer).status == 200
    assert server.get("/healthz").status == 200


def test_bad_options_are_usage_errors(once_env: dict[str, str], tmp_path: Path,
                                      serve: Callable[..., ServedHere]) -> None:
    (tmp_path / "empty").write_text("\n")
    cases = {("--token-file", str(tmp_path / "absent")): "cannot read --token-file",
             ("--token-file", str(tmp_path / "empty")): "holds no token",
             ("--listen", "nonsense"): "bad --listen",
             ("--listen", "127.0.0.1:99999"): "bad --listen",
             ("--refresh", "soon"): "--refresh"}
    for args, message in cases.items():
        result = run_once("serve", *args, env=once_env, timeout=30)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("once: ") and message in lines[0], args
    server = serve(env=once_env)
    taken = run_once("serve", "--listen", f"127.0.0.1:{server.port}", env=once_env, timeout=30)
    assert taken.returncode == 2 and "cannot listen on" in taken.stderr, taken.stderr


def test_hostile_job_names_are_text(once_env: dict[str, str],
                                    serve: Callable[..., ServedHere]) -> None:
    names = ["<script>alert(1)</script>", '"><img/src=x/onerror=alert(2)>', "a&b'c/d?e#f%2F"]
    for name in names:
        once(once_env, "run", "--job", name, "--every", "day", "--max-attempts", "1", "--",
             "false")
    server = serve(env=once_env)
    page = server.get("/").text
    for name in names:
        assert escape(name) in page
    assert "<script>alert" not in page and "<img" not in page
    for name in names:
        job = server.get("/job/" + quote(name, safe=""))
        assert job.status == 200, name
        assert escape(name) in job.text
        assert "<script>alert" not in job.text and "<img" not in job.text
    assert {o["job"] for o in json.loads(server.get("/api/status").body)} == set(names)
    unknown = server.get("/job/" + quote("<b>nope</b>", safe=""))
    assert unknown.status == 404 and "<b>nope" not in unknown.text


def test_the_ledgers_password_is_never_shown(once_env: dict[str, str], ledger_url: str,
                                             tmp_path: Path,
                                             serve_process: Callable[..., Served]) -> None:
    once(once_env, "run", "--job", "nightly", "--every", "day", "--", "true")
    password = "pa55-w0rd-XYZ"
    (tmp_path / "pw").write_text(password + "\n")
    servers = [serve_process("--db-password-file", str(tmp_path / "pw"), env=once_env)]
    parts = urlsplit(ledger_url)
    if parts.netloc:  # a server: the password in the URL too (trust auth ignores it)
        user = parts.username or "root"
        netloc = f"{user}:{password}@{parts.netloc.rpartition('@')[2]}"
        servers.append(serve_process(env={**once_env,
                                  "ONCE_DATABASE_URL": parts._replace(netloc=netloc).geturl()}))
    for server in servers:
        assert password not in server.first_line
        for path in ("/", "/healthz", "/metrics", "/api/status", "/job/nightly", "/nope"):
            assert password not in server.get(path).text, path


def test_many_clients_at_once_are_served(once_env: dict[str, str],
                                         serve: Callable[..., ServedHere]) -> None:
    for job in ("a", "b", "c"):
        once(once_env, "run", "--job", job, "--every", "day", "--", "true")
    server = serve(env=once_env)
    paths = ["/", "/metrics", "/api/status", "/job/a", "/healthz"] * 20
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(server.get, paths))
    assert [a.status for a in answers] == [200] * len(paths)


def test_sigterm_stops_it_cleanly_even_with_an_idle_client(
        once_env: dict[str, str], serve_process: Callable[..., Served]) -> None:
    import socket

    server = serve_process(env=once_env)
    idle = socket.create_connection(("127.0.0.1", server.port))  # connects, says nothing
    try:
        assert server.get("/healthz").status == 200
        began = time.monotonic()
        status, err = server.stop()
        assert status == 0 and err.rstrip().endswith("once: stopped"), err
        assert time.monotonic() - began < 12
    finally:
        idle.close()


# -- the ledger down, frozen or slow (a private embedded PostgreSQL) ---------------------------


READ_TIMEOUT = 2.0
BOUND = READ_TIMEOUT + 6  # an answer's bound on a loaded machine: the read's time plus slack


def timed(server: Served | ServedHere, path: str) -> tuple[Answer, float]:
    began = time.monotonic()
    answer = server.get(path)
    return answer, time.monotonic() - began


@pytest.mark.slow
def test_a_stopped_database_makes_healthz_503_and_pages_say_so_until_it_is_back(
        private_pg: PrivatePostgres, pg_env: dict[str, str],
        serve_process: Callable[..., Served]) -> None:
    once(pg_env, "run", "--job", "nightly", "--every", "day", "--", "true")
    server = serve_process("--read-timeout", f"{READ_TIMEOUT:g}s", env=pg_env)
    assert server.get("/healthz").status == 200
    private_pg.stop()
    try:
        time.sleep(1.1)  # past the time a read's answer is shared
        for path, content_type in (("/healthz", TEXT), ("/", HTML), ("/job/nightly", HTML),
                                   ("/metrics", TEXT), ("/api/status", "application/json")):
            answer, took = timed(server, path)
            assert (answer.status, answer.type) == (503, content_type), path
            assert "ledger unreachable" in answer.text, (path, answer.text)
            assert took < BOUND, (path, took)
    finally:
        private_pg.start()
    wait_for(lambda: server.get("/healthz").status == 200, what="recovery")
    page = server.get("/")
    assert page.status == 200 and "nightly" in page.text
    assert "ledger unreachable" not in page.text


@pytest.mark.slow
def test_a_frozen_database_does_not_hang_the_server(
        private_pg: PrivatePostgres, pg_env: dict[str, str],
        serve_process: Callable[..., Served]) -> None:
    once(pg_env, "run", "--job", "nightly", "--every", "day", "--", "true")
    server = serve_process("--read-timeout", f"{READ_TIMEOUT:g}s", env=pg_env)
    assert server.get("/").status == 200
    with private_pg.frozen():
        time.sleep(1.1)
        paths = ["/healthz", "/", "/metrics", "/job/nightly", "/api/status"] * 4
        with ThreadPoolExecutor(len(paths)) as pool:
            answers = list(pool.map(lambda p: timed(server, p), paths))
        for path, (answer, took) in zip(paths, answers, strict=True):
            assert answer.status == 503 and "ledger unreachable" in answer.text, path
            assert took < BOUND, (path, took)
    # Reads under way when it thawed may still fail: the next ones succeed.
    wait_for(lambda: server.get("/healthz").status == 200, what="recovery")
    wait_for(lambda: server.get("/").status == 200, timeout=BOUND, what="the page's recovery")


@pytest.mark.slow
def test_a_slow_ledger_is_given_up_on_and_healthz_still_answers(
        private_pg: PrivatePostgres, pg_env: dict[str, str],
        serve_process: Callable[..., Served]) -> None:
    import psycopg

    once(pg_env, "run", "--job", "nightly", "--every", "day", "--", "true")
    server = serve_process("--read-timeout", f"{READ_TIMEOUT:g}s", env=pg_env)
    conninfo = pg_env["ONCE_DATABASE_URL"]
    with psycopg.connect(conninfo) as blocker:  # holds the table: every read of it waits
        blocker.execute("LOCK TABLE once_runs IN ACCESS EXCLUSIVE MODE")
        time.sleep(1.1)
        page, took = timed(server, "/")
        assert page.status == 503 and "ledger unreachable" in page.text
        # The server's statement timeout names itself; on a loaded machine the request's own
        # bound (the read's time and 2 s) may come first, and says that no answer came.
        assert ("statement timeout" in page.text
                or "ledger unreachable: no answer within 2s" in page.text), page.text
        assert took < BOUND, took
        assert server.get("/healthz").status == 200  # the ledger answers what it can
        blocker.rollback()
    time.sleep(1.1)
    assert server.get("/").status == 200


@pytest.mark.slow
def test_trickling_clients_are_cut_off_and_cannot_hold_the_others_back(
        once_env: dict[str, str], serve_process: Callable[..., Served]) -> None:
    import socket

    from once.serve.handler import REQUEST_DEADLINE
    from once.serve.server import MAX_CLIENTS

    once(once_env, "run", "--job", "j", "--every", "day", "--", "true")
    server = serve_process(env=once_env)
    # Both answered once before the tricklers come: what is timed below is their hold on the
    # others, not a cold process's first read (imports, the pool's first connection), which
    # took more than 10 s beside a whole CI's load.
    for path in ("/healthz", "/metrics"):
        assert server.get(path, timeout=60).status == 200
    tricklers = []
    for _ in range(MAX_CLIENTS + 8):  # more than the requests it serves at once
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        tricklers.append(sock)
    began = time.monotonic()
    assert server.get("/healthz", timeout=10).status == 200  # not held at 503 by them
    assert server.get("/metrics", timeout=10).status == 200
    for sock in tricklers:  # a header byte every second: each read is well within 15 s
        with contextlib.suppress(OSError):
            sock.sendall(b"X")
    cut = []
    deadline = time.monotonic() + REQUEST_DEADLINE + 20
    for sock in tricklers:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        while True:
            try:
                if not sock.recv(1024):
                    break
            except (TimeoutError, ConnectionResetError):
                break
            with contextlib.suppress(OSError):
                sock.sendall(b"X")
        cut.append(time.monotonic() - began)
        sock.close()
    assert max(cut) < REQUEST_DEADLINE + 15, cut  # a whole-request deadline, not a per-read one


def test_a_name_no_ledger_can_hold_is_not_found_on_every_backend(
        once_env: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    once(once_env, "run", "--job", "j", "--every", "day", "--", "true")
    server = serve(env=once_env)
    for path in ("/job/a%00b", "/job/a%20b", "/job/" + "x" * 300, "/job/%E2%80%8Bx%0A",
                 "/logs/a%00b", "/logs/j?period=2026%00", "/logs/j?period=" + "x" * 300):
        assert server.get(path).status == 404, path

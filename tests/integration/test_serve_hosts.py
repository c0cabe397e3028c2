"""`once serve` answers only the names it is served under (once.serve.hosts): a page that
rebinds its own name to 127.0.0.1 gets a 421 with nothing of the ledger in it, on every path
and method, token or not; the loopback names, the --listen host and --allow-host names get
their pages. Raw requests on a socket, so that the Host is exactly what the test says; a
ledger built by a real `once run` whose output holds a secret.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import run_once
from serving import Answer, ServedHere, sent

pytestmark = pytest.mark.tables_made  # none is about a first use

JOB = "rebind-target"
SECRET = "tok-7f3a9c"  # in the job's output tail: what a rebinding page is after
PATHS = ("/", "/api/status", "/api/status?limit=1", f"/logs/{JOB}", f"/job/{JOB}", "/metrics",
         "/healthz", "/nowhere")


@pytest.fixture
def ledger(once_env: dict[str, str]) -> dict[str, str]:
    done = run_once("run", "--job", JOB, "--every", "day", "--max-attempts", "1", "--", "sh",
                    "-c", f"echo token={SECRET}; exit 3", env=once_env)
    assert done.returncode == 3, done.stderr
    return once_env


def ask(server: ServedHere, host: str | None, path: str = "/api/status", method: str = "GET",
        extra: str = "", version: str = "HTTP/1.1") -> Answer:
    field = "" if host is None else f"Host: {host}\r\n"
    request = f"{method} {path} {version}\r\n{field}{extra}Connection: close\r\n\r\n"
    return sent(server.port, request.encode("latin-1"))


def assert_refused(answer: Answer, status: int = 421) -> None:
    assert answer.status == status, (answer.status, answer.body)
    assert JOB.encode() not in answer.body and SECRET.encode() not in answer.body, answer.body
    assert answer.type == "text/plain; charset=utf-8"


def foreign(port: int) -> list[str]:
    """Names a rebinding page's request could carry, and addresses that are not this one's."""
    names = ["evil.example", "127.0.0.1.evil.com", "localhost.evil", "evil.example.",
             "10.1.2.3", "127.0.0.2", "127.1", "2130706433", "0.0.0.0", "[::2]",
             "[::ffff:10.1.2.3]", "once-serve", "xn--lcalhost-9za", "local_host"]
    return names + [f"{name}:{port}" for name in names] + ["evil.example:80"]


def test_a_foreign_host_is_refused_before_anything_is_read(
        ledger: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    server = serve(env=ledger)
    assert SECRET in ask(server, f"127.0.0.1:{server.port}", f"/logs/{JOB}").text
    for host in foreign(server.port):
        for path in PATHS:
            assert_refused(ask(server, host, path))
        head = ask(server, host, f"/logs/{JOB}", method="HEAD")
        assert head.status == 421 and head.body == b"", host
    refused = ask(server, "evil.example:8321")
    assert "--allow-host" in refused.text and "evil.example" in refused.text, refused.text


def test_the_loopback_names_and_the_listen_host_are_served(
        ledger: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    server = serve(env=ledger)
    port = server.port
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"localhost:{port}",
                 "LocalHost:9000", "localhost.", f"localhost.:{port}", "127.0.0.1.",
                 "[::1]", f"[::1]:{port}", "[0:0:0:0:0:0:0:1]:1", "[::ffff:127.0.0.1]",
                 "localhost:"):
        answer = ask(server, host)
        assert answer.status == 200 and JOB in answer.text, (host, answer.body)
    assert ask(server, "localhost", f"/logs/{JOB}", method="HEAD").status == 200


@pytest.mark.parametrize(("host", "why"), [
    ("", "bad Host"), ("user@localhost", "bad Host"), ("user:pw@127.0.0.1", "bad Host"),
    ("localhost evil.example", "bad Host"), ("[::1", "bad Host"), ("[127.0.0.1]", "bad Host"),
    ("::1", "bad Host"), ("localhost/x", "bad Host"), ("http://localhost", "bad Host"),
    (".", "bad Host"), ("localhost..", "bad Host"), ("localhost:80:80", "bad Host"),
    ("localhost:123456", "bad Host"),
    (None, "no Host")])
def test_a_host_that_is_no_host_or_none_is_a_bad_request(
        ledger: dict[str, str], serve: Callable[..., ServedHere], host: str | None,
        why: str) -> None:
    server = serve(env=ledger)
    for path in ("/api/status", f"/logs/{JOB}", "/healthz"):
        answer = ask(server, host, path)
        assert_refused(answer, 400)
        assert why in answer.text, answer.text
    assert_refused(ask(server, host, version="HTTP/1.0"), 400)


def test_two_hosts_folded_hosts_and_absolute_targets_are_refused(
        ledger: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    server = serve(env=ledger)
    twice = ask(server, "localhost", extra="Host: evil.example\r\n")
    assert_refused(twice, 400)
    assert "more than one Host" in twice.text
    assert_refused(ask(server, "evil.example", extra="host: localhost\r\n"), 400)
    assert_refused(ask(server, "localhost\r\n evil.example"), 400)
    for target in ("http://evil.example/api/status", "http://evil.example:80/logs/" + JOB,
                   "HTTP://EVIL.EXAMPLE/api/status", "https://127.0.0.1.evil.com/api/status"):
        assert_refused(ask(server, "localhost", target))
    assert_refused(ask(server, "localhost", "http://user@localhost/api/status"), 400)
    # The target's authority and the Host must both be served; then the target's path is.
    assert_refused(ask(server, "evil.example", f"http://localhost:{server.port}/api/status"))
    absolute = ask(server, "localhost", f"http://127.0.0.1:{server.port}/api/status?limit=1")
    assert absolute.status == 200 and JOB in absolute.text, absolute.body


def test_allow_host_names_a_service_or_a_domain(
        ledger: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    server = serve("--allow-host", "once-serve", "--allow-host", "Dash.Corp.Example.",
                   "--allow-host", ".svc.example", "--allow-host", "[FD00::1]",
                   env=ledger)
    for host in ("once-serve", "once-serve:8321", "ONCE-SERVE.", "dash.corp.example:443",
                 "dash.corp.example.", "svc.example", "once.ops.svc.example:8321",
                 "[fd00:0::1]:8321", "localhost:9000", f"127.0.0.1:{server.port}"):
        answer = ask(server, host)
        assert answer.status == 200 and JOB in answer.text, (host, answer.body)
    for host in ("evilsvc.example", "svc.example.evil", "corp.example", "x.dash.corp.example",
                 "once-serve.evil", "evil.example"):
        assert_refused(ask(server, host))
    named = serve(env={**ledger, "ONCE_SERVE_ALLOW_HOST": "once-serve .svc.example"})
    assert ask(named, "a.svc.example").status == ask(named, "once-serve:80").status == 200
    assert_refused(ask(named, "evil.example"))


def test_allow_host_star_answers_any_name_but_never_no_host(
        ledger: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    server = serve("--allow-host", "*", env=ledger)
    for host in ("evil.example", "evil.example:8321", "10.1.2.3", "localhost"):
        answer = ask(server, host)
        assert answer.status == 200 and JOB in answer.text, host
    assert_refused(ask(server, None), 400)
    assert_refused(ask(server, "localhost", extra="Host: evil.example\r\n"), 400)
    assert_refused(ask(server, "user@evil.example"), 400)


def test_a_foreign_host_is_refused_before_the_token_is_asked_for(
        ledger: dict[str, str], serve: Callable[..., ServedHere], tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret-token-value\n")
    server = serve("--token-file", str(tmp_path / "token"), env=ledger)
    bearer = "Authorization: Bearer s3cret-token-value\r\n"
    for path in PATHS:
        assert_refused(ask(server, "evil.example", path, extra=bearer))
        assert_refused(ask(server, "evil.example", path))
    assert ask(server, "localhost", "/api/status").status == 401
    answer = ask(server, "localhost", "/api/status", extra=bearer)
    assert answer.status == 200 and JOB in answer.text


@pytest.mark.parametrize(("value", "message"), [
    ("once.example:8321", "without a port"), ("*.example.com", ".example.com"),
    ("", "a host name"), ("http://once.example", "a host name"), ("user@once", "a host name"),
    (".", "a host name"), ("once example", "a host name")])
def test_a_bad_allow_host_is_a_usage_error(once_env: dict[str, str], value: str,
                                            message: str) -> None:
    result = run_once("serve", "--allow-host", value, env=once_env, timeout=30)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("once: ") and message in lines[0], lines

"""once.serve.hosts: the names `once serve` answers under (its guard against DNS rebinding),
as rules; and, on a real server whose ledger reads are replaced with ones that count
themselves, that a refused request reads nothing. The pages themselves, on a real ledger:
tests/integration/test_serve_hosts.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from once.ledger import parse_url
from once.serve import data as serve_data
from once.serve.hosts import Hosts, allow_host, origin_form
from once.serve.options import ServeOptions
from once.serve.server import Server
from serving import in_process, sent

LOCAL = "127.0.0.1"  # the address a test's connection reached


def verdict(hosts: Hosts, host: str | None, target: str = "/", local: str = LOCAL) -> int:
    """200 for a request that is answered, else the refusal's status."""
    refused = hosts.refusal([] if host is None else [host], target, local)
    return 200 if refused is None else int(refused.status)


@pytest.mark.parametrize("host", [
    "localhost", "LOCALHOST", "localhost.", "localhost:8321", "localhost.:1", "127.0.0.1",
    "127.0.0.1:8321", "127.0.0.1.", "[::1]", "[::1]:8321", "[0::1]:8321", "[::ffff:127.0.0.1]"])
def test_the_loopback_names_are_served_whatever_the_listen_host(host: str) -> None:
    for listen in ("127.0.0.1", "0.0.0.0", "::", "10.0.0.5", "once.example"):
        assert verdict(Hosts.of(listen, ()), host) == 200, listen


@pytest.mark.parametrize("host", [
    "evil.example", "127.0.0.1.evil.com", "localhost.evil", "10.1.2.3", "127.0.0.2",
    "127.1", "2130706433", "0x7f000001", "0.0.0.0", "[::]", "[::2]", "[::ffff:10.1.2.3]",
    "localhost.evil:8321", "evil.example.", "a.localhost"])
def test_any_other_name_is_misdirected(host: str) -> None:
    assert verdict(Hosts.of("127.0.0.1", ()), host) == 421
    assert verdict(Hosts.of("0.0.0.0", ()), host) == 421


@pytest.mark.parametrize("host", [
    "", " ", "user@localhost", "localhost evil", "[::1", "::1", "[127.0.0.1]", "localhost/x",
    "http://localhost", ".", "localhost..", "a..b", "localhost:80:80", "localhost:123456",
    "[fe80::1%25eth0]", "localhost\r\n evil", "l\u043ecalhost"])  # a Cyrillic o
def test_what_is_no_host_is_a_bad_request(host: str) -> None:
    assert verdict(Hosts.of("127.0.0.1", ("*",)), host) == 400


def test_no_host_and_two_hosts_are_bad_requests_even_with_a_star() -> None:
    for hosts in (Hosts.of("127.0.0.1", ()), Hosts.of("127.0.0.1", ("*",))):
        assert verdict(hosts, None) == 400
        refused = hosts.refusal(["localhost", "localhost"], "/", LOCAL)
        assert refused is not None and int(refused.status) == 400
        assert "more than one Host" in refused.reason


def test_the_listen_host_is_served_unless_it_is_every_interface() -> None:
    assert verdict(Hosts.of("10.0.0.5", ()), "10.0.0.5:8321") == 200
    assert verdict(Hosts.of("once.example.", ()), "ONCE.example") == 200
    assert verdict(Hosts.of("fd00::5", ()), "[fd00:0::5]:8321") == 200
    for every, named in (("0.0.0.0", "0.0.0.0:8321"), ("::", "[::]:8321")):
        assert verdict(Hosts.of(every, ()), named) == 421


def test_the_address_a_connection_reached_is_served_as_an_address_only() -> None:
    """A kubelet probe or a Prometheus scrape of a pod sends its address as Host."""
    hosts = Hosts.of("0.0.0.0", ())
    assert verdict(hosts, "10.244.1.7:8321", local="10.244.1.7") == 200
    assert verdict(hosts, "10.244.1.7:8321", local="::ffff:10.244.1.7") == 200  # on [::]
    assert verdict(hosts, "[fd00::7]:8321", local="fd00:0:0::7") == 200
    assert verdict(hosts, "10.244.1.8:8321", local="10.244.1.7") == 421
    assert verdict(hosts, "once-serve:8321", local="10.244.1.7") == 421
    assert verdict(hosts, "10.244.1.7", local="") == 421


def test_allow_host_names_a_name_an_address_a_domain_or_anything() -> None:
    hosts = Hosts.of("0.0.0.0", ("once-serve", "Dash.Corp.Example.", ".svc.example",
                                 "[FD00::1]", "10.9.9.9"))
    for host in ("once-serve", "ONCE-SERVE.:80", "dash.corp.example", "svc.example",
                 "a.b.svc.example:8321", "[fd00::1]", "10.9.9.9:1"):
        assert verdict(hosts, host) == 200, host
    for host in ("evilsvc.example", "svc.example.evil", "corp.example", "x.dash.corp.example",
                 "once-serve.evil", "[fd00::2]", "10.9.9.8"):
        assert verdict(hosts, host) == 421, host
    anything = Hosts.of("127.0.0.1", ("*",))
    assert verdict(anything, "evil.example:8321") == 200
    assert verdict(anything, "user@evil.example") == 400


@pytest.mark.parametrize(("text", "message"), [
    ("once.example:8321", "without a port"), ("[fd00::1]:8321", "without a port"),
    ("localhost:", "without a port"), ("*.example.com", "'.example.com'"),
    ("**", "'*' alone"), ("", "a host name"), (".", "a host name"), ("..x", "a host name"),
    ("http://once.example", "a host name"), ("user@once", "a host name"),
    ("once example", "a host name"), (".10.0.0.1", "a host name"), ("once/x", "a host name")])
def test_a_bad_allow_host_says_what_it_takes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="bad --allow-host") as raised:
        allow_host(text)
    assert message in str(raised.value)


def test_an_absolute_target_names_a_host_too_and_is_served_as_its_path() -> None:
    hosts = Hosts.of("127.0.0.1", ())
    assert verdict(hosts, "localhost", "http://evil.example/api/status") == 421
    assert verdict(hosts, "localhost", "HTTPS://EVIL.EXAMPLE:443/") == 421
    assert verdict(hosts, "localhost", "http://user@localhost/") == 400
    assert verdict(hosts, "localhost", "http:///api/status") == 400
    assert verdict(hosts, "localhost", "http://[::1/api/status") == 400
    assert verdict(hosts, "localhost", "http://[::1]:999999/") == 400
    assert verdict(hosts, "evil.example", "http://localhost/api/status") == 421
    assert verdict(hosts, "localhost", "http://127.0.0.1:8321/api/status") == 200
    assert origin_form("http://127.0.0.1:8321/api/status?limit=1") == "/api/status?limit=1"
    assert origin_form("http://127.0.0.1:8321") == "/"
    assert origin_form("/job/x?y") == "/job/x?y"
    assert origin_form("*") == "*"


# -- nothing is read for a refused request -------------------------------------------------


@pytest.fixture
def counted(tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, list[str]]]:
    """A server whose every ledger read is replaced with one that notes its name and fails."""
    reads: list[str] = []
    for name in ("ping", "read_fleet", "read_metrics", "read_job", "read_output"):
        def noted(*_args: object, _name: str = name, **_kwargs: object) -> None:
            reads.append(_name)
            raise RuntimeError("read")

        monkeypatch.setattr(serve_data, name, noted)
    settings = ServeOptions(parse_url(f"sqlite:///{tmp_path}/ledger.db"), None, 0, 2.0, None,
                            Hosts.of("127.0.0.1", ()))
    with in_process(settings) as httpd:
        yield httpd, reads


def test_a_refused_request_reads_nothing(counted: tuple[Server, list[str]]) -> None:
    httpd, reads = counted
    port = httpd.server_address[1]
    for method in ("GET", "HEAD", "POST"):
        for path in ("/", "/healthz", "/metrics", "/api/status", "/job/j", "/logs/j"):
            for field in ("Host: evil.example\r\n", "", "Host: a@b\r\n"):
                request = f"{method} {path} HTTP/1.1\r\n{field}\r\n".encode()
                assert sent(port, request).status in (400, 421), (method, path, field)
    assert reads == []
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    assert sent(port, request).status == 503 and reads == ["ping"]  # the count counts


def test_on_every_interface_the_address_reached_is_served_on_a_real_socket(
        counted: tuple[Server, list[str]], tmp_path: Path) -> None:
    """--listen 0.0.0.0 as a pod has it, on a loopback address of its own (127.0.0.7) so that
    nothing listens beyond this machine: the address the connection reached is served (a
    kubelet probe's Host), another is not, nor is 0.0.0.0."""
    reads = counted[1]
    settings = ServeOptions(parse_url(f"sqlite:///{tmp_path}/ledger.db"), None, 0, 2.0, None,
                            Hosts.of("0.0.0.0", ()))
    httpd = Server(("127.0.0.7", 0), settings)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        port = httpd.server_address[1]
        for host, status in ((f"127.0.0.7:{port}", 503), ("127.0.0.8", 421),
                             (f"0.0.0.0:{port}", 421), ("localhost", 503)):
            request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            assert sent(port, request, address="127.0.0.7").status == status, host
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()
    assert set(reads) == {"ping"}  # the two served (within a second: one shared read)

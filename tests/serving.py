"""`once serve` on an ephemeral port, as a real process (Served) or in this process
(ServedHere, in_process), and plain HTTP requests to it."""

from __future__ import annotations

import http.client
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from helpers import ONCE

if TYPE_CHECKING:
    from once.serve.options import ServeOptions
    from once.serve.server import Server


@contextmanager
def in_process(settings: ServeOptions) -> Iterator[Server]:
    """once serve's Server in a thread of this process, on an ephemeral port."""
    from once.serve.server import Server

    httpd = Server(("127.0.0.1", 0), settings)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


def get_from(httpd: Server, path: str, timeout: float) -> tuple[int, str]:
    """A GET of `path` from an in-process server: its status and its body."""
    conn = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=timeout)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def type(self) -> str:
        return self.headers.get("Content-Type", "")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


class ServedHere:
    """`once serve --listen 127.0.0.1:0 ARGS` with once.serve's Server in a thread of this
    process: its options read by the real command line (settings_of), its pages by
    the real server; what only the process shows (its stderr, SIGTERM) is Served's."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self._running = in_process(settings_of(*args, env=env))
        self.httpd = self._running.__enter__()
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET",
            timeout: float = 30.0) -> Answer:
        return _ask(self.port, path, headers, method, timeout)

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:
        """Shut the server down (its drain aside, which is serve()'s); 0 and no stderr."""
        self._running.__exit__(None, None, None)
        return 0, ""


@pytest.fixture
def serve() -> Iterator[Callable[..., ServedHere]]:
    """`once serve ARGS` with env, in this process, stopped after the test: what its pages
    answer needs no process of its own."""
    started: list[ServedHere] = []

    def start(*args: str, env: dict[str, str]) -> ServedHere:
        started.append(ServedHere(*args, env=env))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def settings_of(*args: str, env: dict[str, str]) -> ServeOptions:
    """The ServeOptions `once serve --listen 127.0.0.1:0 ARGS` would serve with `env`: the real
    command line, in this process (helpers.run_here), stopped where it would start serving."""
    import once.serve
    from helpers import run_here

    taken: list[ServeOptions] = []

    def take(settings: ServeOptions, host: str, port: int) -> int:
        taken.append(settings)
        return 0

    real, once.serve.serve = once.serve.serve, take
    try:
        result = run_here("serve", "--listen", "127.0.0.1:0", *args, env=env)
    finally:
        once.serve.serve = real
    assert result.returncode == 0 and taken, result.stderr
    return taken[0]


def _ask(port: int, path: str, headers: dict[str, str] | None, method: str,
         timeout: float) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return Answer(response.status, response.headers, response.read())
    finally:
        conn.close()


class Served:
    """`once serve --listen 127.0.0.1:0 ARGS`: the port is read from its first stderr line."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([ONCE, "serve", "--listen", "127.0.0.1:0", *args],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stderr is not None
        self.first_line = self.proc.stderr.readline()  # printed once it listens
        assert "serving http://127.0.0.1:" in self.first_line, (
            self.first_line + self.proc.stderr.read())
        self.port = int(self.first_line.split("http://127.0.0.1:")[1].split("/")[0])
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET",
            timeout: float = 30.0) -> Answer:
        return _ask(self.port, path, headers, method, timeout)

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:
        """SIGTERM; its exit status and the rest of its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, self.first_line + err


def samples(exposition: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(exposition) for s in family.samples}


def families(exposition: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f.type for f in text_string_to_metric_families(exposition)}


def sent(port: int, request: bytes, timeout: float = 30.0, address: str = "127.0.0.1") -> Answer:
    """`request` sent as it is on a socket of its own (no client adds or fixes a header: the
    Host is exactly what the test wrote), the answer read until the server closes."""
    import socket
    from email.parser import BytesHeaderParser

    with socket.create_connection((address, port), timeout=timeout) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, _, fields = head.partition(b"\r\n")
    headers = BytesHeaderParser(_class=http.client.HTTPMessage).parsebytes(fields)
    assert isinstance(headers, http.client.HTTPMessage)
    return Answer(int(status_line.split()[1]), headers, body)

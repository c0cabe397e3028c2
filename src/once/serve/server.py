"""`once serve`: a small read-only HTTP server over the ledger.

    /            every job, problems first (HTML, refreshes itself)
    /job/NAME    a job's check verdict, timeline and history (HTML)
    /metrics     what `once metrics` prints (Prometheus text format)
    /api/status  what `once status --json` prints
    /healthz     200 when the ledger answers a read, 503 otherwise (no token needed)

Why the standard library's http.server and no web framework: nothing new may land on `once
run`'s path, the pages are read-only and small, and a framework would be one more dependency
to install, audit and keep in step in every image that runs the CronJobs. ThreadingHTTPServer
serves each connection in a thread; at most MAX_CLIENTS are served at once (the next waits a
moment, then gets a 503), each connection is dropped after CLIENT_TIMEOUT of silence, and every
answer is bounded in time whatever the ledger does. SIGTERM or SIGINT stops it: no new
connection is accepted, the answers under way get up to STOP_WAIT to finish, exit 0.

Reads go through Reads: requests that want the same data while a read is under way (or
within FRESH seconds of one) share it, so a hundred clients cost one read; at most
READ_SLOTS different reads run at once; and a request waits at most --read-timeout (plus a
little) for its read, after which its page says "ledger unreachable" and /healthz says 503.
The read itself gives up by then too (once.serve.data), so stuck reads cannot pile up.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from once import __version__
from once.ledger import LedgerError, Target

MAX_CLIENTS = 32  # connections served at once
CLIENT_TIMEOUT = 15.0  # seconds a client may stay silent
READ_SLOTS = 4  # different ledger reads under way at once
FRESH = 1.0  # seconds a read's answer is shared with later requests
STOP_WAIT = 5.0  # seconds a stop waits for the answers under way

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Busy(Exception):
    """Too many different reads are under way: try again in a moment."""


@dataclass
class Settings:
    target: Target
    namespace: str | None
    refresh: float  # seconds between the pages' refreshes; 0: never
    read_timeout: float
    token: bytes | None  # required of every request but /healthz when set


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets, [::1]:8321); ValueError when it is not one."""
    parts = urlsplit("//" + text.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname
    if port is None or not host or parts.path or parts.username is not None:
        raise ValueError(f"bad --listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8321 "
                         "or [::]:8321")
    return host, port


# -- reads -----------------------------------------------------------------------------------


class Reads:
    """Shared, bounded ledger reads (see the module's docstring)."""

    def __init__(self, timeout: float, slots: int = READ_SLOTS, fresh: float = FRESH) -> None:
        self.timeout, self.slots, self.fresh = timeout, slots, fresh
        self.lock = threading.Lock()
        self.running: dict[Any, Future[Any]] = {}
        self.recent: dict[Any, tuple[float, Future[Any]]] = {}

    def get(self, key: Any, read: Callable[[], Any]) -> Any:
        """The read's result; LedgerError when it failed or took too long; Busy."""
        with self.lock:
            now = time.monotonic()
            self.recent = {k: v for k, v in self.recent.items() if now - v[0] < self.fresh}
            if key in self.recent:
                future = self.recent[key][1]
            elif key in self.running:
                future = self.running[key]
            elif len(self.running) >= self.slots:
                raise Busy
            else:
                future = Future()
                self.running[key] = future
                threading.Thread(target=self._run, args=(key, future, read), daemon=True,
                                 name="once-serve-read").start()
        try:
            return future.result(timeout=self.timeout + 2.0)
        except FutureTimeout:
            raise LedgerError(f"no answer within {self.timeout:g}s") from None

    def _run(self, key: Any, future: Future[Any], read: Callable[[], Any]) -> None:
        try:
            future.set_result(read())
        except BaseException as exc:  # handed to every waiting request
            future.set_exception(exc)
        finally:
            with self.lock:
                self.running.pop(key, None)
                self.recent[key] = (time.monotonic(), future)


# -- the server ------------------------------------------------------------------------------


class Server(ThreadingHTTPServer):
    """At most MAX_CLIENTS connections at once; the others get a 503 after a moment."""

    daemon_threads = True  # a stop waits for the answers under way, up to STOP_WAIT (drain)
    block_on_close = False
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], settings: Settings) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.settings = settings
        self.reads = Reads(settings.read_timeout)
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self.secrets = _secrets(settings.target)
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(timeout=2.0):
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def drain(self, seconds: float) -> None:
        """Wait up to `seconds` for the connections being served (an idle one waits for its
        request up to CLIENT_TIMEOUT: it is not worth keeping a stop waiting for)."""
        deadline = time.monotonic() + seconds
        for _ in range(MAX_CLIENTS):
            if not self.slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return

    def scrub(self, text: str) -> str:
        """An error message without any of the ledger's secrets in it."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def _refuse_busy(request: socket.socket) -> None:
    body = b"once serve: too many clients at once; try again\n"
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    try:
        request.settimeout(1.0)
        request.sendall(head.encode() + body)
    except OSError:
        pass


def _secrets(target: Target) -> list[str]:
    """The ledger's password, wherever the URL or --db-password-file put it."""
    from urllib.parse import parse_qsl

    found = [str(target.connect_args.get("password") or "")]
    parts = urlsplit(target.url)
    found.append(unquote(parts.password or ""))
    found += [v for k, v in parse_qsl(parts.query) if k == "password"]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


class Handler(BaseHTTPRequestHandler):
    server: Server
    timeout = CLIENT_TIMEOUT
    server_version = f"once/{__version__}"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: the pages are read-only, and stderr is for trouble

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                   "read-only: GET and HEAD only\n", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _route(self) -> None:
        path = self.path.partition("?")[0].partition("#")[0]
        if path == "/healthz":
            return self._healthz()
        if not self._authorised():
            return self._send(HTTPStatus.UNAUTHORIZED, "text/plain; charset=utf-8",
                              "a token is required\n", {"WWW-Authenticate": 'Basic realm="once"'})
        if path == "/":
            return self._overview()
        if path == "/metrics":
            return self._metrics()
        if path == "/api/status":
            return self._status()
        if path.startswith("/job/") and len(path) > len("/job/"):
            return self._job(unquote(path[len("/job/"):]))
        from once.serve import pages as serve_pages

        return self._send(HTTPStatus.NOT_FOUND, "text/html; charset=utf-8",
                          serve_pages.not_found(f"no page {path}", self._ledger(), _now()))

    def _authorised(self) -> bool:
        """A bearer token, or HTTP Basic with the token as password (for browsers); compared
        in constant time."""
        token = self.server.settings.token
        if token is None:
            return True
        scheme, _, value = self.headers.get("Authorization", "").strip().partition(" ")
        given = b""
        if scheme.lower() == "bearer":
            given = value.strip().encode("utf-8", "replace")
        elif scheme.lower() == "basic":
            try:
                given = base64.b64decode(value.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                given = b""
        return hmac.compare_digest(given, token)

    # -- endpoints -------------------------------------------------------------------------

    def _healthz(self) -> None:
        from once.serve import data as serve_data

        s = self.server.settings
        try:
            self.server.reads.get(("health",), lambda: serve_data.ping(s.target,
                                                                       s.read_timeout))
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                              f"ledger unreachable: {self._why(exc)}\n")
        self._send(HTTPStatus.OK, "text/plain; charset=utf-8", "ok\n")

    def _fleet(self, key: str) -> Any:
        from once.serve import data as serve_data

        s = self.server.settings
        return self.server.reads.get((key,), lambda: serve_data.read_fleet(
            s.target, s.namespace, s.read_timeout, strips=key == "page",
            metrics=key == "data"))

    def _overview(self) -> None:
        from once.serve import pages as serve_pages

        s = self.server.settings
        try:
            fleet = self._fleet("page")
        except (LedgerError, Busy) as exc:
            return self._unreachable(exc)
        self._send(HTTPStatus.OK, "text/html; charset=utf-8",
                   serve_pages.overview(fleet, self._ledger(), s.namespace, s.refresh))

    def _metrics(self) -> None:
        try:
            fleet = self._fleet("data")
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                              f"ledger unreachable: {self._why(exc)}\n")
        self._send(HTTPStatus.OK, METRICS_TYPE, fleet.metrics)

    def _status(self) -> None:
        from once import report

        try:
            fleet = self._fleet("data")
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, "application/json",
                              json.dumps({"error": f"ledger unreachable: {self._why(exc)}"})
                              + "\n")
        self._send(HTTPStatus.OK, "application/json",
                   json.dumps(report.status_objects(fleet.states, ledger=self._ledger()),
                              indent=2) + "\n")

    def _job(self, name: str) -> None:
        from once.serve import data as serve_data
        from once.serve import pages as serve_pages

        s = self.server.settings
        outside = bool(s.namespace) and not name.startswith(f"{s.namespace}:")
        try:
            page = None if outside else self.server.reads.get(
                ("job", name), lambda: serve_data.read_job(s.target, name, s.read_timeout))
        except (LedgerError, Busy) as exc:
            return self._unreachable(exc)
        if page is None:  # never run, or not of --namespace (whose jobs alone are shown)
            return self._send(HTTPStatus.NOT_FOUND, "text/html; charset=utf-8",
                              serve_pages.not_found(f"no job {name!r} in the ledger",
                                                    self._ledger(), _now()))
        self._send(HTTPStatus.OK, "text/html; charset=utf-8",
                   serve_pages.job_page(page, self._ledger(), s.refresh))

    # -- answers ---------------------------------------------------------------------------

    def _ledger(self) -> str:
        return self.server.scrub(self.server.settings.target.redacted)

    def _why(self, exc: Exception) -> str:
        if isinstance(exc, Busy):
            return "too many reads under way; try again"
        return self.server.scrub(str(exc))

    def _unreachable(self, exc: Exception) -> None:
        from once.serve import pages as serve_pages

        s = self.server.settings
        self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/html; charset=utf-8",
                   serve_pages.unreachable("once", self._ledger(), self._why(exc), s.refresh,
                                           _now()))

    def _send(self, status: HTTPStatus, content_type: str, body: str,
              headers: dict[str, str] | None = None) -> None:
        from once.serve.pages import CSP

        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if content_type.startswith("text/html"):
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Frame-Options", "DENY")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _now() -> datetime:
    return datetime.now(UTC)


# -- running it ------------------------------------------------------------------------------


def serve(settings: Settings, host: str, port: int) -> int:
    """Serve until SIGTERM or SIGINT; 0 then. OSError when the address cannot be bound."""
    server = Server((host, port), settings)
    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()  # shutdown() waits for serve_forever: not from its own thread
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    shown = f"[{host}]" if ":" in host else host
    bound = server.server_address[1]
    print(f"once: serving http://{shown}:{bound}/ for the ledger "
          f"{server.scrub(settings.target.redacted)}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()  # no new connections
        server.drain(STOP_WAIT)
    print("once: stopped", file=sys.stderr, flush=True)
    return 0

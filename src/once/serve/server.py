"""`once serve`: a small read-only HTTP server over the ledger.

    /            every job, problems first, ?state=&name=&sort=&page= (HTML, refreshes itself)
    /job/NAME    a job's check verdict, timeline and history (HTML)
    /logs/NAME   an attempt's output, ?period=P&attempt=N as `once logs` takes them (HTML)
    /metrics     what `once metrics` prints (Prometheus text format)
    /api/status  what `once status --json` prints, ?state=&name=&limit=&offset= a page of it
    /healthz     200 when the ledger answers a read, 503 otherwise (no token needed)

Why the standard library's http.server (a thread a connection) and no web framework: nothing
new may land on `once run`'s path, the pages are read-only and small, and a framework would be
one more dependency to install, audit and keep in step in every image that runs the CronJobs.
A connection has REQUEST_DEADLINE for its request line and headers together (a trickle is cut
off then), and counts against MAX_CLIENTS only once they are read: slow clients cannot hold
the others back. At most MAX_CLIENTS requests are served at once (the next waits a moment,
then gets a 503), and every answer is bounded in time whatever the ledger does. SIGTERM or
SIGINT stops it: no new connection is accepted, the answers under way get STOP_WAIT, exit 0.

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
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from once import __version__
from once.ledger import LedgerError, Target, describe
from once.limits import KEY_MAX
from once.messages import say

MAX_CLIENTS = 32  # requests served at once (their request line and headers read)
MAX_READERS = 256  # connections whose request line and headers are still being read
CLIENT_TIMEOUT = 15.0  # seconds a client may stay silent
REQUEST_DEADLINE = 10.0  # seconds for the request line and the headers, all of them
READ_SLOTS = 4  # different ledger reads under way at once
FRESH = 1.0  # seconds a read's answer is shared with later requests
STOP_WAIT = 5.0  # seconds a stop waits for the answers under way

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Busy(Exception):
    """Too many different reads are under way: try again in a moment."""


@dataclass
class ServeOptions:
    """What `once serve` serves and how: its options, read once at its start."""

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

    def __init__(self, address: tuple[str, int], settings: ServeOptions) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.settings = settings
        self.reads = Reads(settings.read_timeout)
        self.readers = threading.BoundedSemaphore(MAX_READERS)
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self.secrets = _secrets(settings.target)
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.readers.acquire(timeout=2.0):
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.readers.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.readers.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is no error of ours: no traceback for it."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def drain(self, seconds: float) -> None:
        """Wait up to `seconds` for the requests being served (a connection still sending its
        request has REQUEST_DEADLINE: it is not worth keeping a stop waiting for)."""
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
    answered = False  # whether this request's answer has begun (_send)
    timeout = CLIENT_TIMEOUT
    server_version = f"once/{__version__}"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: the pages are read-only, and stderr is for trouble

    def handle_one_request(self) -> None:
        # The request line and the headers must all arrive by the deadline, however they
        # trickle in (the socket's timeout is per read); then the request takes a slot.
        cut = threading.Timer(REQUEST_DEADLINE, self._cut_off)
        cut.daemon = True
        self._read_cut, self._slot, self._was_cut = cut, False, False
        cut.start()
        try:
            super().handle_one_request()
        finally:
            cut.cancel()
            if self._slot:
                self.server.slots.release()

    def _cut_off(self) -> None:
        self._was_cut = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self._read_cut.cancel()
        if self._was_cut:  # what came before the cut is not a request to answer
            self.close_connection = True
            return False
        if parsed and not self.server.slots.acquire(timeout=2.0):
            self.close_connection = True
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                       "once serve: too many clients at once; try again\n",
                       {"Retry-After": "1"})
            return False
        self._slot = parsed
        return parsed

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                   "read-only: GET and HEAD only\n", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _route(self) -> None:
        path, _, query = self.path.partition("#")[0].partition("?")
        self.answered = False
        try:
            self._answer(path, query)
        except Exception as exc:
            if self.answered:  # the client went away while it was being answered
                raise
            self._failed(path, exc)

    def _answer(self, path: str, query: str) -> None:
        if path == "/healthz":
            return self._healthz()
        if not self._authorised():
            return self._send(HTTPStatus.UNAUTHORIZED, "text/plain; charset=utf-8",
                              "a token is required\n", {"WWW-Authenticate": 'Basic realm="once"'})
        if path == "/":
            return self._overview(query)
        if path == "/metrics":
            return self._metrics()
        if path == "/api/status":
            return self._status(query)
        page, _, rest = path[1:].partition("/")
        if page in ("job", "logs") and rest and _storable(name := unquote(rest)):
            return self._job(name) if page == "job" else self._logs(name, query)
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
            self.server.reads.get(("health",), lambda: serve_data.ping(s.target, s.read_timeout))
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                              f"ledger unreachable: {self._why(exc)}\n")
        self._send(HTTPStatus.OK, "text/plain; charset=utf-8", "ok\n")

    def _fleet(self, key: str, listing: Any = None) -> Any:
        from once.serve import data as serve_data

        s = self.server.settings
        return self.server.reads.get((key, listing), lambda: serve_data.read_fleet(
            s.target, s.namespace, s.read_timeout, strips=key == "page",
            metrics=key == "data", pick=listing.pick if listing is not None else None))

    def _overview(self, query: str) -> None:
        from once.serve import overview

        s = self.server.settings
        listing = overview.Listing.parse(query)
        try:
            fleet = self._fleet("page", listing)
        except (LedgerError, Busy) as exc:
            return self._unreachable(exc)
        self._send(HTTPStatus.OK, "text/html; charset=utf-8",
                   overview.overview(fleet, self._ledger(), s.namespace, s.refresh, listing))

    def _metrics(self) -> None:
        try:
            fleet = self._fleet("data")
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                              f"ledger unreachable: {self._why(exc)}\n")
        self._send(HTTPStatus.OK, METRICS_TYPE, fleet.metrics)

    def _status(self, query: str) -> None:
        """Every job in full; or, asked, a page of those that match (once.serve.status)."""
        from once.serve import status as api

        s = self.server.settings
        try:
            wanted = api.Wanted.parse(query)
            page = api.whole(self._fleet("data")) if wanted is None else self.server.reads.get(
                ("status", wanted), lambda: api.read_page(s, wanted))
        except api.BadQuery as exc:
            return self._send(HTTPStatus.BAD_REQUEST, api.JSON, api.error(str(exc)))
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, api.JSON,
                              api.error(f"ledger unreachable: {self._why(exc)}"))
        self._send(HTTPStatus.OK, api.JSON, api.body(page, self._ledger()),
                   api.headers(page, wanted))

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

    def _logs(self, name: str, query: str) -> None:
        """An attempt's output: /logs/NAME?period=P&attempt=N, as `once logs` finds it."""
        from once.serve import data as serve_data
        from once.serve import pages as serve_pages

        s = self.server.settings
        period, attempt, refused = serve_data.output_wanted(query)
        found: Any = refused
        if s.namespace and not name.startswith(f"{s.namespace}:"):
            found = f"no job {name!r} in the ledger"
        try:
            found = found or self.server.reads.get(
                ("logs", name, period, attempt),
                lambda: serve_data.read_output(s.target, name, period, attempt, s.read_timeout))
        except (LedgerError, Busy) as exc:
            return self._unreachable(exc)
        if isinstance(found, str):
            return self._send(HTTPStatus.NOT_FOUND, "text/html; charset=utf-8",
                              serve_pages.not_found(found, self._ledger(), _now()))
        self._send(HTTPStatus.OK, "text/html; charset=utf-8",
                   serve_pages.output_page(found, self._ledger()))

    # -- answers ---------------------------------------------------------------------------

    def _ledger(self) -> str:
        return self.server.scrub(self.server.settings.target.redacted)

    def _why(self, exc: Exception) -> str:
        if isinstance(exc, Busy):
            return "too many reads under way; try again"
        return self.server.scrub(str(exc))

    def _failed(self, path: str, exc: Exception) -> None:
        """What no endpoint expected (a bug, a driver's surprise) is answered all the same,
        with its reason, and said on stderr: never a dropped connection. /healthz: 503."""
        why = self._why(exc) if isinstance(exc, LedgerError) else self.server.scrub(
            f"{type(exc).__name__}: {describe(exc)}")
        say(f"serve: cannot answer {path}: {why}")
        status = (HTTPStatus.SERVICE_UNAVAILABLE if path == "/healthz"
                  else HTTPStatus.INTERNAL_SERVER_ERROR)
        self._send(status, "text/plain; charset=utf-8", f"once serve: cannot answer: {why}\n")

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
        self.answered = True
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


def _storable(name: str) -> bool:
    """A name once_runs could hold (once.limits: printable, no whitespace, KEY_MAX long):
    no database holds another, so none is asked (404)."""
    return len(name) <= KEY_MAX and name.isprintable() and not any(c.isspace() for c in name)


def _now() -> datetime:
    return datetime.now(UTC)


# -- running it ------------------------------------------------------------------------------


def serve(settings: ServeOptions, host: str, port: int) -> int:
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
    say(f"serving http://{shown}:{bound}/ for the ledger "
        f"{server.scrub(settings.target.redacted)}")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()  # no new connections
        server.drain(STOP_WAIT)
    say("stopped")
    return 0

"""One request to `once serve`: the Host it names, its deadline and slot, the token, its route
and its answer.

    /            every job, problems first, ?state=&name=&sort=&page= (HTML, refreshes itself)
    /job/NAME    a job's check verdict, timeline and history (HTML)
    /logs/NAME   an attempt's output, ?period=P&attempt=N as `once logs` takes them (HTML)
    /metrics     what `once metrics` prints (Prometheus text format)
    /api/status  what `once status --json` prints, ?state=&name=&limit=&offset= a page of it
    /api/leads   what `once status --leads --json` prints: the lead names of `once lead`
    /healthz     200 when the ledger answers a read, 503 otherwise (no token needed)

A request whose Host is not one of the server's names is refused first (once.serve.hosts: a
page that rebinds its own name to this address must read nothing), on every path. Its request
line and headers have REQUEST_DEADLINE together (a trickle is cut off then); only then does it
take one of the server's slots (a 503 when none frees in a moment). Reads go through the
server's Reads (once.serve.reads): a read that fails or takes too long makes the page say
"ledger unreachable" and /healthz 503.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import socket
import threading
from contextlib import suppress
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from once import __version__
from once.ledger import LedgerError, describe
from once.limits import KEY_MAX
from once.messages import say
from once.serve import hosts
from once.serve.options import ServeOptions
from once.serve.reads import Busy, Reads

CLIENT_TIMEOUT = 15.0  # seconds a client may stay silent
REQUEST_DEADLINE = 10.0  # seconds for the request line and the headers, all of them
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"


class Serving(ThreadingHTTPServer):
    """What a Handler reads of its server; once.serve.server.Server is the one (a base here,
    so that the request's side need not import the server, which is made with Handler)."""

    settings: ServeOptions
    reads: Reads
    slots: threading.BoundedSemaphore

    def scrub(self, text: str) -> str:
        """An error message without any of the ledger's secrets in it."""
        raise NotImplementedError


class Handler(BaseHTTPRequestHandler):
    server: Serving
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
        if parsed and (refused := self._refusal()) is not None:
            self.close_connection = True
            self._send(refused.status, TEXT, refused.reason)
            return False
        if parsed and not self.server.slots.acquire(timeout=2.0):
            self.close_connection = True
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, TEXT,
                       "once serve: too many clients at once; try again\n",
                       {"Retry-After": "1"})
            return False
        self._slot = parsed
        return parsed

    def _refusal(self) -> hosts.Refused | None:
        """Why this request is not for this server (its Host), before anything is read."""
        try:
            local = self.connection.getsockname()[0]
        except OSError:
            local = ""
        return self.server.settings.hosts.refusal(self.headers.get_all("Host") or [],
                                                  self.path, local)

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, TEXT,
                   "read-only: GET and HEAD only\n", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _route(self) -> None:
        path, _, query = hosts.origin_form(self.path).partition("#")[0].partition("?")
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
            return self._send(HTTPStatus.UNAUTHORIZED, TEXT,
                              "a token is required\n", {"WWW-Authenticate": 'Basic realm="once"'})
        if path == "/":
            return self._overview(query)
        if path == "/metrics":
            return self._metrics()
        if path == "/api/status":
            return self._status(query)
        if path == "/api/leads":
            return self._leads()
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
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, TEXT,
                              f"ledger unreachable: {self._why(exc)}\n")
        self._send(HTTPStatus.OK, TEXT, "ok\n")

    def _fleet(self, key: str, listing: Any = None) -> Any:
        from once.serve import data as serve_data

        s = self.server.settings
        return self.server.reads.get((key, listing), lambda: serve_data.read_fleet(
            s.target, s.namespace, s.read_timeout, strips=key == "page",
            pick=listing.pick if listing is not None else None))

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
        from once.serve import data as serve_data

        s = self.server.settings
        try:
            text = self.server.reads.get(("metrics",), lambda: serve_data.read_metrics(
                s.target, s.namespace, s.read_timeout))
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, TEXT,
                              f"ledger unreachable: {self._why(exc)}\n")
        self._send(HTTPStatus.OK, METRICS_TYPE, text)

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

    def _leads(self) -> None:
        """The lead names, as `once status --leads --json` prints them."""
        from once import report
        from once.serve import data as serve_data
        from once.serve import status as api

        s = self.server.settings
        try:
            leads, standby = self.server.reads.get(("leads",), lambda: serve_data.read_leads(
                s.target, s.namespace, s.read_timeout))
        except (LedgerError, Busy) as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, api.JSON,
                              api.error(f"ledger unreachable: {self._why(exc)}"))
        self._send(HTTPStatus.OK, api.JSON, json.dumps(
            report.lead_objects(leads, self._ledger(), standby), indent=2) + "\n")

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
        self._send(status, TEXT, f"once serve: cannot answer: {why}\n")

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



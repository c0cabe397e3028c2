"""`once serve`: a small read-only HTTP server over the ledger: its connections (a 503 when
busy), the ledger's secrets kept out of every answer, its start and its stop. What a request
gets is once.serve.handler's.

Why the standard library's http.server (a thread a connection) and no web framework: nothing
new may land on `once run`'s path, the pages are read-only and small, and a framework would be
one more dependency to install, audit and keep in step in every image that runs the CronJobs.
A connection has REQUEST_DEADLINE (once.serve.handler) for its request line and headers
together (a trickle is cut off then), and counts against MAX_CLIENTS only once they are read:
slow clients cannot hold the others back. At most MAX_CLIENTS requests are served at once
(the next waits a moment, then gets a 503), and every answer is bounded in time whatever the
ledger does. SIGTERM or SIGINT stops it: no new connection is accepted, the answers under way
get STOP_WAIT, exit 0.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from typing import Any

from once import secrets
from once.ledger import Target
from once.messages import say
from once.serve.handler import Handler, Serving
from once.serve.options import ServeOptions
from once.serve.reads import Reads

MAX_CLIENTS = 32  # requests served at once (their request line and headers read)
MAX_READERS = 256  # connections whose request line and headers are still being read
STOP_WAIT = 5.0  # seconds a stop waits for the answers under way


class Server(Serving):
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
        """An error message without any of the ledger's secrets in it: once.secrets's one
        scrubber, with this server's own (a command run later in its process forgets its)."""
        return secrets.scrub(text, self.secrets)


def _refuse_busy(request: socket.socket) -> None:
    body = b"once serve: too many clients at once; try again\n"
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    try:
        request.settimeout(1.0)
        request.sendall(head.encode() + body)
    except OSError:
        pass


def _secrets(target: Target) -> tuple[str, ...]:
    """The ledger's password, wherever the URL or --db-password-file put it, in every form."""
    return secrets.forms(target.url, str(target.connect_args.get("password") or ""))


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
    if settings.hosts.anything:
        say("serve: --allow-host '*': any Host is answered, so a web page that rebinds its "
            "name to this address can read these pages (DNS rebinding)")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()  # no new connections
        server.drain(STOP_WAIT)
    say("stopped")
    return 0

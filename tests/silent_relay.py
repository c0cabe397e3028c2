"""A TCP relay on loopback that can fall silent: it stops forwarding in both directions and
closes nothing, as a network that drops a host's packets does (the client's writes still
land in socket buffers; no answer ever comes back). For the tests of a leader cut off from
its ledger.

keep_server_side: a client's close is not passed on (the server's side stays open until the
relay closes), as a network that lost the client's FIN: a statement the client gave up on
stays in the server and goes on, as after a lost answer (MariaDB ends a waiting COMMIT
within a second of its client's close)."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit


class SilentRelay:
    def __init__(self, upstream: tuple[str, int], keep_server_side: bool = False) -> None:
        self.upstream = upstream
        self.keep_server_side = keep_server_side
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.silent = threading.Event()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url_for(self, url: str) -> str:
        """`url` with its host and port replaced by the relay's."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        return parts._replace(netloc=f"{user}@127.0.0.1:{self.port}").geturl()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self.sockets += [client, server]
            for a, b, from_client in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(a, b, from_client),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        while not self.closed.is_set():
            if self.silent.is_set():  # hold what arrives: read nothing, send nothing
                self.closed.wait(0.05)
                continue
            try:
                source.settimeout(0.05)
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self.silent.is_set():  # fell silent meanwhile: this chunk is dropped
                continue
            try:
                sink.sendall(data)
            except OSError:
                break
        if from_client and self.keep_server_side:
            return  # the server hears nothing of the client's close
        if not self.silent.is_set():
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.server.close()
        for sock in self.sockets:
            sock.close()


def tcp_upstream(url: str) -> tuple[str, int] | None:
    """The host and port a URL reaches over TCP; None for a socket or a file."""
    parts = urlsplit(url)
    if parts.scheme.startswith("sqlite") or not parts.hostname or "," in parts.netloc:
        return None
    default = 3306 if parts.scheme.startswith(("mysql", "mariadb")) else 5432
    return parts.hostname, parts.port or default

"""What `once serve` serves and how: its options, read once at its start."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from once.ledger import Target
from once.serve.hosts import Hosts


@dataclass
class ServeOptions:
    """What `once serve` serves and how: its options, read once at its start."""

    target: Target
    namespace: str | None
    refresh: float  # seconds between the pages' refreshes; 0: never
    read_timeout: float
    token: bytes | None  # required of every request but /healthz when set
    hosts: Hosts = field(default_factory=Hosts)  # the names it answers under (once.serve.hosts)


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

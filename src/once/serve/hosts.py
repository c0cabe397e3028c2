"""The names `once serve` answers under: its guard against DNS rebinding.

A page loaded from an attacker's name can have that name resolve to 127.0.0.1 (or to the end
of a `kubectl port-forward`) and read what it fetches there: for the browser it is still the
attacker's site. What the browser does not change is the Host header, which names that site.
So a request is answered only when its Host is one of the server's own names, before anything
else is looked at (the token, the path, the ledger):

- the loopback names: localhost, 127.0.0.1, [::1];
- the host of --listen, unless it is every interface (0.0.0.0, ::), which is no name;
- the address the connection reached, as an IP address: what a kubelet probe and a Prometheus
  scrape send for a pod. A browser sends an address only for a page loaded from that address,
  that is from this server itself: no rebound name is an address;
- each --allow-host NAME (a Service's or an ingress's name): `.example.com` for that name and
  every name under it; `*` for any name, the check off.

Names are compared without case and without one trailing dot, addresses as addresses; the
port is not compared (a port-forward's local port, an ingress's 443: the port a client used
says nothing of the page that sent it), so --allow-host takes none. A request with no Host
(HTTP/1.0), two, or one that is no host[:port] (a user@, a path) is a 400 whatever
--allow-host says; an absolute-form target (`GET http://name/ HTTP/1.1`) must name a served
host too, and is then served as its path.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import SplitResult, urlsplit

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
# host[:port] as a Host header carries it: a name or an IPv4 address, or an IPv6 one in brackets.
AUTHORITY = re.compile(r"(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]"
                       r"|(?P<name>[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?))"
                       r"(?::(?P<port>[0-9]{0,5}))?")
SHOWN_MAX = 100  # characters of a refused Host said back


@dataclass(frozen=True)
class Refused:
    """Why a request is not answered, and its status (400: no host; 421: not one of ours)."""

    status: HTTPStatus
    reason: str


@dataclass(frozen=True)
class Hosts:
    """The names a server answers under (see the module's docstring)."""

    names: frozenset[str] = LOOPBACK  # canonical: lower case, no trailing dot, addresses as such
    domains: tuple[str, ...] = ()  # ".example.com": that name and every name under it
    anything: bool = False  # --allow-host '*'

    @classmethod
    def of(cls, listen: str, allowed: Iterable[str]) -> Hosts:
        """The loopback names, the --listen host (unless every interface) and the --allow-host
        names; ValueError naming an --allow-host that is none."""
        names, domains, anything = set(LOOPBACK), [], False
        listening = canonical(listen)
        if listening and not _every_interface(listening):
            names.add(listening)
        for text in allowed:
            kind, name = allow_host(text)
            if kind == "*":
                anything = True
            elif kind == ".":
                domains.append(name)
            else:
                names.add(name)
        return cls(frozenset(names), tuple(domains), anything)

    def refusal(self, fields: list[str], target: str, local: str) -> Refused | None:
        """None when a request with these Host fields and this request target, reaching the
        address `local`, is to be answered; else why not."""
        if len(fields) != 1:
            why = "no Host header" if not fields else "more than one Host header"
            return Refused(HTTPStatus.BAD_REQUEST, f"once serve: {why}\n")
        named = [fields[0].strip(" \t")]
        if _absolute(target):
            named.append(_split(target).netloc)
        for host in named:
            name = host_of(host)
            if name is None:
                return Refused(HTTPStatus.BAD_REQUEST, f"once serve: bad Host {_shown(host)}: "
                               "expected a name or an address, with or without a port\n")
            if not self.serves(name, local):
                return Refused(HTTPStatus.MISDIRECTED_REQUEST, _misdirected(host))
        return None

    def serves(self, name: str, local: str) -> bool:
        """Whether the canonical `name` is one of ours on a connection that reached `local`."""
        reached = _address(local)
        return (self.anything or name in self.names
                or (reached is not None and name == str(reached))
                or any(name == d or name.endswith("." + d) for d in self.domains))


def allow_host(text: str) -> tuple[str, str]:
    """An --allow-host: ("*", "") for any name, (".", NAME) for a domain, ("=", NAME) for one
    name or address; ValueError saying what it takes."""
    text = text.strip()
    if text == "*":
        return "*", ""
    if text.startswith("*"):
        raise ValueError(f"bad --allow-host {text!r}: for a domain and every name under it "
                         f"write {text.lstrip('*')!r}; '*' alone serves any name")
    domain = text.startswith(".")
    bare = text.removeprefix(".")
    address = _address(bare.removeprefix("[").removesuffix("]"))
    if address is not None and not domain:
        return "=", str(address)
    found = AUTHORITY.fullmatch(bare)
    if found is not None and found["port"] is not None:
        raise ValueError(f"bad --allow-host {text!r}: give it without a port (every port is "
                         "served)")
    name = host_of(bare)
    if name is None or address is not None:
        raise ValueError(f"bad --allow-host {text!r}: expected a host name (once.example.com), "
                         "a domain (.example.com), an address, or '*'")
    return ("." if domain else "="), name


def host_of(authority: str) -> str | None:
    """The canonical host of a host[:port], or None when it is not one."""
    found = AUTHORITY.fullmatch(authority)
    if found is None:
        return None
    if found["ip6"] is not None:
        ip6 = _address(found["ip6"])
        return str(ip6) if ip6 is not None and ":" in found["ip6"] else None
    return canonical(found["name"]) or None


def canonical(host: str) -> str:
    """A name in lower case without its trailing dot; an address as Python writes it (an IPv6
    one without brackets, an IPv4 one mapped into IPv6 as IPv4)."""
    address = _address(host.strip("[]"))
    if address is not None:
        return str(address)
    return host.lower().removesuffix(".")


def origin_form(target: str) -> str:
    """The path and query of a request target: an absolute-form one's (http://name/path)."""
    if not _absolute(target):
        return target
    parts = _split(target)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _absolute(target: str) -> bool:
    return not target.startswith("/") and _split(target).scheme in ("http", "https")


def _split(target: str) -> SplitResult:
    """The parts of a request target; a target urlsplit refuses (http://[::1/) names no host
    (a 400)."""
    try:
        return urlsplit(target)
    except ValueError:
        return SplitResult("http", "", "", "", "")


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.partition("%")[0])  # no zone of a link-local one
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _every_interface(host: str) -> bool:
    address = _address(host)
    return address is not None and address.is_unspecified


def _shown(host: str) -> str:
    return ascii(host[:SHOWN_MAX])


def _misdirected(host: str) -> str:
    return (f"once serve: not served under the name {_shown(host)} (the Host header). It "
            "answers to localhost, 127.0.0.1, [::1], its --listen address and the names of "
            "--allow-host: a Service, an ingress or a proxy that sends its own Host needs "
            "--allow-host NAME (kubectl port-forward sends Host: localhost:PORT, served)\n")

"""Where the ledger lives: a --db URL read into a `Target`, its secrets redacted, and the
embedded default (a private SQLite file under $XDG_STATE_HOME/once/).

Imports only the stdlib, once.limits and once.frozen: parse_url runs on every fire, and a bad
URL is a usage error (exit 2) before any driver is loaded. urllib.parse (and the ipaddress
module it loads) is imported only for a URL with a host: a SQLite path has none to check.
"""

from __future__ import annotations

import os
import re
from contextlib import suppress
from typing import Any, Literal

from once import limits
from once.frozen import Frozen

Dialect = Literal["sqlite", "postgresql", "mysql"]


class UrlError(limits.InputError):
    """A --db URL that names no ledger once can use (a usage error, exit 2)."""


class Target(Frozen):
    """A parsed --db URL: which driver, how to connect, and how to name it in messages."""

    dialect: Dialect
    url: str
    redacted: str
    connect_args: dict[str, Any]
    path: str  # SQLite only

    def __init__(self, dialect: Dialect, url: str, redacted: str,
                 connect_args: dict[str, Any] | None = None, path: str = "") -> None:
        self._set(dialect=dialect, url=url, redacted=redacted,
                  connect_args={} if connect_args is None else connect_args, path=path)

    @property
    def sqlalchemy_url(self) -> str:
        """The same ledger as a SQLAlchemy URL with the driver once uses."""
        scheme, _, rest = self.url.partition("://")
        driver = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}
        if scheme.split("+")[0] == "mariadb":
            driver["mysql"] = "mariadb+pymysql"
        return f"{driver[self.dialect]}://{rest}"


def default_url() -> str:
    """The embedded default: a SQLite file under $XDG_STATE_HOME/once/."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return "sqlite:///" + os.path.join(state, "once", "ledger.db")


def create_private(target: Target) -> None:
    """Create the default SQLite ledger's directory (0700) and file (0600), the user's alone:
    they hold job names, owners and watermarks. What already exists keeps its mode; SQLite
    gives the -wal and -shm files, and once the .locks file, the ledger's mode."""
    if target.dialect != "sqlite" or target.url != default_url():
        return
    os.makedirs(os.path.dirname(target.path), mode=0o700, exist_ok=True)
    with suppress(FileExistsError):
        os.close(os.open(target.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o600))


def parse_url(url: str, password: str | None = None) -> Target:
    """Read a SQLAlchemy-style URL; `password` (from --db-password-file) overrides the URL's."""
    scheme = url.partition("://")[0].lower()
    base = scheme.split("+")[0]
    if not url.isprintable():  # a control character, or bytes that are not UTF-8
        raise UrlError(f"bad --db URL {redact(url)!r}: it holds a control character or "
                       f"bytes that are not UTF-8")
    if "://" not in url:
        raise UrlError(f"bad --db URL '{url}': expected sqlite:///PATH, postgresql://… or mysql://…")
    if base == "sqlite" and url.partition("://")[2].startswith("/"):
        return _sqlite_target(url)  # sqlite:///PATH: no host that urlsplit could refuse
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # [::1 without its bracket, [zz]: the host is malformed
        raise UrlError(f"bad host in --db URL {redact(url)}: {exc}") from None
    if base == "sqlite":
        return _sqlite_target(url)
    _check_port(parts.netloc.rpartition("@")[2], url)
    if base in ("postgresql", "postgres"):
        return _postgres_target(url, password)
    if base in ("mysql", "mariadb"):
        return _mysql_target(url, password)
    raise UrlError(
        f"unsupported --db URL scheme '{scheme}': use sqlite, postgresql, mysql or mariadb"
    )


def _check_port(hostinfo: str, url: str) -> None:
    """A port, when the URL gives one, is a number from 1 to 65535: the reports' SQLAlchemy
    reads the URL too, and fails on `host:` or `host:port` with a traceback."""
    if hostinfo.startswith("["):  # [::1]:5432
        hostinfo = hostinfo.partition("]")[2]
    if ":" not in hostinfo:
        return
    port = hostinfo.rpartition(":")[2]
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise UrlError(f"bad port {port!r} in --db URL {redact(url)}: give a number from 1 "
                       f"to 65535")


def redact(url: str) -> str:
    """The URL with its password replaced by ***, in the user part and in the query
    (`?password=`, as libpq and PyMySQL take it); safe for any output, even a URL that
    urlsplit cannot read."""
    from urllib.parse import urlsplit

    # The query's secrets, whatever else the URL holds (before and after a fragment alike).
    url = re.sub(_QUERY_SECRET, r"\1***", url, flags=re.IGNORECASE)
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"(://[^/?#@:]*):[^/?#@]*@", r"\1:***@", url)
    if not parts.password:  # none, or empty: nothing to hide, and *** would claim one
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostinfo}").geturl()


# A secret given as a query parameter: libpq's password and sslpassword, PyMySQL's passwd
# (compiled by re on first use: a SQLite URL never needs it).
_QUERY_SECRET = r"([?&](?:password|passwd|sslpassword)=)[^&#]*"


def _sqlite_target(url: str) -> Target:
    path = url.partition("://")[2]
    if not path.startswith("/"):
        raise UrlError(f"bad SQLite URL '{url}': write sqlite:///relative/path or sqlite:////abs")
    path = path[1:].partition("?")[0]
    if "%" in path:  # else unquote would hand it back as it is
        from urllib.parse import unquote

        path = unquote(path)
    if not path:
        raise UrlError(f"bad SQLite URL '{url}': no file named")
    return Target("sqlite", url, url, path=path)


def _postgres_target(url: str, password: str | None) -> Target:
    # libpq reads the URL itself (host=/socket, sslmode=… and friends keep working); only the
    # SQLAlchemy driver suffix has to go.
    conninfo = "postgresql://" + url.partition("://")[2]
    args: dict[str, Any] = {"conninfo": conninfo}
    if password is not None:
        args["password"] = password
    return Target("postgresql", url, redact(url), args)


_MYSQL_PARAMS = {"unix_socket", "charset", "ssl_ca", "ssl_cert", "ssl_key", "connect_timeout"}


def _check_mysql_query(query: dict[str, str], url: str) -> None:
    """?connect_timeout= a whole number of seconds, ?ssl_ca= (cert, key) a readable file:
    else PyMySQL fails inside the reports' driver with a traceback, not at connect time."""
    timeout = query.get("connect_timeout")
    if timeout is not None and not (timeout.isascii() and timeout.isdigit()
                                    and 1 <= int(timeout) <= 31_536_000):
        raise UrlError(f"?connect_timeout={timeout} in {redact(url)}: give whole seconds, "
                       f"1 or more")
    for key in ("ssl_ca", "ssl_cert", "ssl_key"):
        if key in query and not os.access(query[key], os.R_OK):
            raise UrlError(f"?{key}={query[key]} in {redact(url)}: no readable file there")


def _mysql_target(url: str, password: str | None) -> Target:
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    unknown = set(query) - _MYSQL_PARAMS
    if unknown:
        raise UrlError(f"unknown MySQL URL parameter '{sorted(unknown)[0]}' in {redact(url)}")
    try:
        port = parts.port or 3306
    except ValueError:
        raise UrlError(f"bad port in --db URL {redact(url)}") from None
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise UrlError(f"no database named in --db URL {redact(url)}")
    args: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": port,
        "user": unquote(parts.username or "root"),
        "password": password if password is not None else unquote(parts.password or ""),
        "database": database,
    }
    # The tables are utf8mb4 with binary keys: a narrower connection charset could turn two
    # job names into one, so ?charset= may only say what once uses anyway.
    if query.get("charset", "utf8mb4").lower() != "utf8mb4":
        raise UrlError(f"?charset={query['charset']} in {redact(url)}: once speaks utf8mb4 "
                       f"(its tables' charset); leave it out or write charset=utf8mb4")
    args["charset"] = "utf8mb4"
    _check_mysql_query(query, url)
    if "unix_socket" in query:
        args["unix_socket"] = query["unix_socket"]
    ssl = {k[4:]: v for k, v in query.items() if k.startswith("ssl_")}
    if ssl:
        args["ssl"] = ssl
    return Target("mysql", url, redact(url), args)

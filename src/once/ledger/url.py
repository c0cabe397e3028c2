"""Where the ledger lives: a --db URL read into a `Target`, its secrets redacted, and the
embedded default (a private SQLite file under $XDG_STATE_HOME/once/), which is refused in a
container, where it would be the container's own.

The parsers here read the rest of a URL once its scheme has named the backend (the registry,
once.ledger.dialects.parse_url, picks it), and the Target they make holds that backend.
Imports only the stdlib, once.limits and once.frozen: a URL is read on every fire, and a bad
URL is a usage error (exit 2) before any driver is loaded. urllib.parse (and the ipaddress
module it loads) is imported only for a URL with a host: a SQLite path has none to check.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Literal, cast

from once import limits
from once.frozen import Frozen
from once.secrets import query_secrets

if TYPE_CHECKING:
    from once.ledger.dialect import Dialect as Backend

Dialect = Literal["sqlite", "postgresql", "mysql"]


class UrlError(limits.InputError):
    """A --db URL that names no ledger once can use (a usage error, exit 2)."""


class Target(Frozen):
    """A parsed --db URL: which backend speaks it, how to connect, and how to name it in
    messages.

    backend: the once.ledger.dialect.Dialect of its scheme, the one every part that connects,
    binds an instant or reads an error asks (it is the registry's, once.ledger.dialects).
    connect_args: PostgreSQL, libpq's conninfo (the URL, host list and all) and the password
    of --db-password-file; MySQL/MariaDB, PyMySQL's arguments for the first of `hosts`, the
    servers to try in order (once.ledger.connect opens every connection).
    """

    backend: Backend
    url: str
    redacted: str
    connect_args: dict[str, Any]
    path: str  # SQLite only
    hosts: tuple[tuple[str, int], ...]  # MySQL/MariaDB only

    def __init__(self, backend: Backend, url: str, redacted: str,
                 connect_args: dict[str, Any] | None = None, path: str = "",
                 hosts: tuple[tuple[str, int], ...] = ()) -> None:
        self._set(backend=backend, url=url, redacted=redacted,
                  connect_args={} if connect_args is None else connect_args, path=path,
                  hosts=hosts)

    @property
    def dialect(self) -> Dialect:
        """The backend's name: sqlite, postgresql or mysql."""
        return cast(Dialect, self.backend.name)

    @property
    def sqlalchemy_dialect(self) -> str:
        """SQLAlchemy's name of the dialect and driver once uses (Dialect.sqlalchemy_url)."""
        return self.backend.sqlalchemy_url(self)


def default_url() -> str:
    """The embedded default: a SQLite file under $XDG_STATE_HOME/once/."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return "sqlite:///" + os.path.join(state, "once", "ledger.db")


def unnamed_url(how_to_name: str = "set ONCE_DATABASE_URL (or ONCE_DATABASE_URL_FILE) to "
                "the shared ledger, or name one on purpose with --db (a file of this "
                "container's own: --db ./once.db)") -> str:
    """The ledger where none is named: the default SQLite file, but in a container, where it
    would be the container's own (every pod of a CronJob would keep a ledger of its own and
    run the job): there a UrlError that says how to name one."""
    where = container()
    if where:
        raise UrlError(f"no ledger named in {where}: the default SQLite ledger would be this "
                       f"container's own, and every container would run the job; "
                       f"{how_to_name}")
    return default_url()


# What shows a container: Kubernetes sets KUBERNETES_SERVICE_HOST in every pod, whatever
# its runtime; Docker creates /.dockerenv, Podman /run/.containerenv; on cgroup v1, PID 1's
# cgroup names the runtime. _ONCE_SYSTEM_ROOT moves / elsewhere (a knob of the test suite).
_CONTAINER_FILES = (".dockerenv", "run/.containerenv")
_CONTAINER_CGROUPS = ("kubepods", "docker", "containerd", "libpod", "crio")


def container() -> str:
    """What shows that this process runs in a container ('' where nothing does): a stat or
    two and a short read, paid only by a fire that names no ledger."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "a Kubernetes pod (KUBERNETES_SERVICE_HOST is set)"
    root = os.environ.get("_ONCE_SYSTEM_ROOT") or "/"
    for name in _CONTAINER_FILES:
        if os.path.exists(os.path.join(root, name)):
            return f"a container (/{name} exists)"
    try:
        with open(os.path.join(root, "proc/1/cgroup"), encoding="utf-8",
                  errors="replace") as cgroups:
            found = cgroups.read(65536)
    except OSError:
        return ""
    runtime = next((word for word in _CONTAINER_CGROUPS if word in found), "")
    return f"a container (/proc/1/cgroup names {runtime})" if runtime else ""


def create_private(target: Target) -> bool:
    """Create the default SQLite ledger's directory (0700) and file (0600), the user's alone:
    they hold job names, owners and watermarks. What already exists keeps its mode; SQLite
    gives the -wal and -shm files, and once the .locks file, the ledger's mode. True when
    this call created the file (one of many first uses at once)."""
    if target.url != default_url():  # a sqlite:/// URL: no other dialect's is
        return False
    os.makedirs(os.path.dirname(target.path), mode=0o700, exist_ok=True)
    try:
        os.close(os.open(target.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o600))
    except FileExistsError:
        return False
    return True


def check_port(hostinfo: str, url: str) -> None:
    """A port, when the URL gives one, is a number from 1 to 65535 (each host's, in a list):
    else the driver fails on `host:` with a traceback, or takes `host:x` for a host name."""
    if hostinfo.startswith("["):  # [::1]:5432
        hostinfo = hostinfo.partition("]")[2]
    if ":" not in hostinfo:
        return
    port = hostinfo.rpartition(":")[2]
    number = port.isascii() and port.isdigit()
    if not (number and 1 <= int(port) <= 65535):
        # Not a number: it may be the start of a password with a raw / ? or # in it.
        shown = repr(port) if number or not port else "(not a number)"
        raise UrlError(f"bad port {shown} in --db URL {redact(url)}: give a number from 1 "
                       f"to 65535 (percent-encode a password's / ? # @ or :)")


def redact(url: str) -> str:
    """The URL with its password replaced by ***, in the user part and in the query
    (`?password=`, as libpq and PyMySQL take it); safe for any output, even a URL that
    urlsplit cannot read."""
    from urllib.parse import urlsplit

    # The query's secrets, whatever else the URL holds (before and after a fragment alike).
    shown, at = [], 0
    for start, end, _ in query_secrets(url):
        if start >= at:  # else inside a value hidden already (?password=a?password=b)
            shown += [url[at:start], "***"]
            at = end
    url = "".join(shown) + url[at:]
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"(://[^/?#@:]*):[^/?#@]*@", r"\1:***@", url)
    if not parts.password:  # none, or empty: nothing to hide, and *** would claim one
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostinfo}").geturl()


def path_url(path: str) -> str:
    """The sqlite:/// URL of a plain path: ~ expanded, made absolute (cron's working directory
    is the home directory, a shell's anything)."""
    return "sqlite:///" + os.path.abspath(os.path.expanduser(path))


def sqlite_target(url: str, backend: Backend) -> Target:
    path = url.partition("://")[2]
    if not path.startswith("/"):
        raise UrlError(f"bad SQLite URL '{redact(url)}': write sqlite:///relative/path or "
                       f"sqlite:////abs")
    path = path[1:].partition("?")[0]
    if "%" in path:  # else unquote would hand it back as it is
        from urllib.parse import unquote

        path = unquote(path)
    if not path:
        raise UrlError(f"bad SQLite URL '{redact(url)}': no file named")
    if os.path.isdir(path):  # SQLite's own word would be "unable to open database file"
        raise UrlError(f"--db {path}: a directory, not a SQLite file; name a file in it "
                       f"({os.path.join(path, 'once.db')})")
    return Target(backend, url, url, path=path)


def postgres_target(url: str, password: str | None, backend: Backend) -> Target:
    # libpq reads the URL itself (host=/socket, sslmode=…, a host list and friends keep
    # working); only the SQLAlchemy driver suffix has to go.
    from urllib.parse import urlsplit

    _check_one_host_list(url)
    if urlsplit(url).netloc.count("@") > 1:  # libpq ends the user part at the first @
        raise UrlError(f"a raw '@' in the user part of --db URL {redact(url)}: libpq would "
                       f"read what follows it as the host; percent-encode it (%40)")
    conninfo = "postgresql://" + url.partition("://")[2]
    args: dict[str, Any] = {"conninfo": conninfo}
    if password is not None:
        args["password"] = password
    return Target(backend, url, redact(url), args)


def _check_one_host_list(url: str) -> None:
    """libpq keeps the last of a repeated ?host= (SQLAlchemy's multi-host form, host=a:p&
    host=b:p): the other hosts would be dropped without a word, and `a:p` read as a name."""
    from urllib.parse import parse_qsl, urlsplit

    keys = [k.lower() for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)]
    for key in ("host", "hostaddr", "port"):
        if keys.count(key) > 1:
            raise UrlError(f"?{key}= given {keys.count(key)} times in {redact(url)}: libpq "
                           f"keeps only the last; name several hosts as "
                           f"postgresql://h1:5432,h2:5432/db or ?host=h1,h2&port=5432,5432")


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


def mysql_target(url: str, password: str | None, backend: Backend) -> Target:
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    unknown = set(query) - _MYSQL_PARAMS
    if unknown:
        raise UrlError(f"unknown MySQL URL parameter '{sorted(unknown)[0]}' in {redact(url)}")
    hosts = _mysql_hosts(parts.netloc.rpartition("@")[2], url)
    if len(hosts) > 1 and "unix_socket" in query:
        raise UrlError(f"?unix_socket= and several hosts in {redact(url)}: the socket names "
                       f"one server; give the one or the other")
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise UrlError(f"no database named in --db URL {redact(url)}")
    args: dict[str, Any] = {
        "host": hosts[0][0],
        "port": hosts[0][1],
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
    return Target(backend, url, redact(url), args, hosts=hosts)


def _mysql_hosts(hostinfo: str, url: str) -> tuple[tuple[str, int], ...]:
    """The URL's servers in order, `h1:3311,[::1]:3312,h3` (port 3306 where none is given;
    localhost for a URL that names none). Each port was checked by check_port."""
    entries = hostinfo.split(",")
    hosts = []
    for entry in entries:
        if entry.startswith("["):  # [::1]:3306
            host, _, rest = entry[1:].partition("]")
            port = rest[1:]
        else:
            host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        if ":" in host and not entry.startswith("["):
            raise UrlError(f"bad host {entry!r} in --db URL {redact(url)}: write an IPv6 "
                           f"address in brackets, [::1]:3306")
        if not host and len(entries) > 1:
            raise UrlError(f"an empty host in the list {hostinfo!r} of {redact(url)}")
        hosts.append((host.lower() or "localhost", int(port) if port else 3306))
    return tuple(hosts)

"""The ledger's password, kept out of every text `once` shows: one scrubber for every way
out (`once:` lines, JSON logs, reports, doctor, `once serve`'s errors, tracebacks).

remember_url() and remember_password() are called where a URL or a password is read (the
command line's --db, ONCE_DATABASE_URL_FILE and --db-password-file; once.ledger.parse_url,
hence the Python API too); scrub() replaces every form of what was remembered with ***,
whatever quoted it: the password as written in the URL and percent-decoded, encoded again,
escaped as libpq, Python or JSON quote it, a `password=`, `passwd=` or `sslpassword=` value
in a query or in libpq's `key=value` form (quoted or not), and a URL that could not be read
at all, whole. Every occurrence goes, even of a password that is a common word (`ledger`,
`error`): the messages then read `***` in its place, which is no secret to whoever reads
them, but no password is printed. scrub_json() does the same inside a JSON document's
strings alone (keys too), so that the document stays JSON; its numbers stay numbers.

Standard library only, and once.escape. A SQLite path remembers nothing, and then scrub()
returns its text at once: `once run` (the hot path) pays for no urllib and no pattern.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

MASK = "***"
_remembered: tuple[str, ...] = ()  # every form of every secret, longest first
# A password given as a query parameter (libpq's password and sslpassword, PyMySQL's
# passwd: query_secrets), and in libpq's key=value form: password=s, password = 's \' t'.
_QUERY_KEYS = ("password", "passwd", "sslpassword", "sslpasswd")
_KEYWORD = r"(?<![\w.])(?:ssl)?pass(?:word|wd)\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)"
_URL_PASSWORD = r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#@]+@"
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def remember_url(url: str) -> None:
    """Keep the password a --db URL holds, in each of its forms; the whole URL where it has
    no `scheme://` or is not printable (once.ledger.parse_url refuses it, and nothing in it
    can be told from a password)."""
    _keep(url_forms(url))


def remember_password(password: str) -> None:
    """Keep a password given apart from the URL (--db-password-file), in each of its forms."""
    _keep(password_forms(password))


def remember_text(text: str) -> None:
    """Keep a text whole (a secret's file that holds no URL once can read)."""
    _keep(password_forms(text.strip()))


def forget() -> None:
    """Drop what was remembered (kept(), and the tests after a Python API's call)."""
    global _remembered
    _remembered = ()


def forms(url: str | None = None, password: str | None = None) -> tuple[str, ...]:
    """Every form of the secrets of this URL and password, longest first, for a caller that
    keeps its own (once serve: a server's, whatever later commands remember)."""
    found = url_forms(url) if url else set()
    if password:
        found |= password_forms(password)
    return _ordered(found)


def scrub(text: str, also: Iterable[str] = ()) -> str:
    """text with every form of every remembered secret (and of `also`) replaced by ***."""
    return _replaced(text, _remembered if not also else _ordered({*_remembered, *also}))


def _replaced(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:  # longest first: a form that holds another goes whole
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_json(text: str, also: Iterable[str] = ()) -> str:
    """A JSON document with every string (keys too) scrubbed, and nothing else touched: the
    answer is JSON still, whatever the secret holds (a quote, a backslash, a comma). A
    document that holds no secret, as JSON writes one, is handed back at once."""
    secrets = _remembered if not also else _ordered({*_remembered, *also})
    if not secrets:
        return text
    import json
    import re

    written = {json.dumps(s, ensure_ascii=ascii_only)[1:-1] for s in secrets
               for ascii_only in (True, False)}
    if not any(form in text for form in written):
        return text

    def scrubbed(found: re.Match[str]) -> str:
        literal = found.group()
        value = json.loads(literal) if "\\" in literal else literal[1:-1]
        clean = _replaced(value, secrets)
        return literal if clean == value else json.dumps(clean,
                                                         ensure_ascii=literal.isascii())

    return re.sub(r'"(?:[^"\\]|\\.)*"', scrubbed, text)


def scrub_line(text: str) -> str:
    """One of once's own lines (`once:`, a usage error), scrubbed, and any password in a
    URL it quotes (scheme://user:PASSWORD@) replaced too, remembered or not: a usage error
    may quote a URL given where none was expected, before any was read."""
    text = scrub(text)
    if "://" not in text or "@" not in text:
        return text
    import re

    return re.sub(_URL_PASSWORD, r"\1***@", text)


@contextlib.contextmanager
def kept(for_the_process: bool) -> Iterator[None]:
    """Around a command of the command line (once.cli.main): for the `once` script, its
    tracebacks (a bug's: every error a user can cause is one `once:` line) are scrubbed too,
    as the driver's text may sit in an exception's message; a command run in its caller's
    process (the tests' run_here) starts with nothing remembered and forgets what it
    remembered when it ends, leaving no secret behind to scrub the next one's output."""
    if for_the_process:
        import threading  # loaded by click already

        sys.excepthook = _scrubbed_excepthook
        threading.excepthook = _scrubbed_thread_excepthook
        yield
        return
    forget()
    try:
        yield
    finally:
        forget()


def _scrubbed_excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    import traceback

    sys.stderr.write(scrub("".join(traceback.format_exception(kind, exc, tb))))
    sys.stderr.flush()


def _scrubbed_thread_excepthook(args: Any) -> None:
    if args.exc_type is SystemExit:
        return
    import traceback

    name = getattr(args.thread, "name", "?")
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value,
                                              args.exc_traceback))
    if sys.stderr is not None:
        sys.stderr.write(scrub(f"Exception in thread {name}:\n{text}"))
        sys.stderr.flush()


# -- the forms ------------------------------------------------------------------------------


# A plain path names a SQLite file (`--db ./once.db`, once.ledger.url) and holds no secret:
# one that starts as a path does, or ends as a SQLite file's name does. A libpq `key=value`
# string never is one (it has an `=`), nor a URL whose `://` was mistyped (`postgres:/h/db`).
_PATH_STARTS = ("/", "./", "../", "~/")
_FILE_ENDS = (".db", ".sqlite", ".sqlite3")


def plain_path(value: str) -> bool:
    if "=" in value or value != value.strip() or "://" in value or not value.isprintable():
        return False
    if value.startswith(_PATH_STARTS):
        return True
    return value.endswith(_FILE_ENDS) and ":" not in value.partition("/")[0]


def url_forms(url: str) -> set[str]:
    """The forms of a URL's secrets: its user part's password as written (read as urlsplit
    reads it, and as far as the last @, for a password with a raw / ? or #), the query's and
    libpq key=value passwords; the URL whole when it is no URL once can read."""
    scheme, sep, rest = url.partition("://")
    found: set[str] = set()
    if plain_path(url):
        return found
    if not sep or not url.isprintable() or not is_scheme(scheme):
        found |= password_forms(url.strip())
    authority = rest
    for stop in "/?#":
        authority = authority.partition(stop)[0]
    for userinfo in (authority.rpartition("@")[0], rest.rpartition("@")[0]):
        password = userinfo.partition(":")[2]
        if password:
            found |= _written_forms(password)
    for start, end, whole in query_secrets(url):
        value = url[start:end]
        if whole:  # key=value encoded as one: the parameter as written, its value decoded
            key = value.partition("=")[0]  # to a raw `=` (the driver quotes the key alone)
            found |= password_forms(value) | password_forms(_unquoted(value).partition("=")[2])
            found |= password_forms(_unquoted(key).partition("=")[2])
        else:
            found |= _written_forms(value, plus=True) | _written_forms(
                value.partition("#")[0], plus=True)
    if "pass" in url.lower():
        import re

        for value in re.findall(_KEYWORD, url, flags=re.IGNORECASE):
            found |= _keyword_forms(value)
    return found


def query_secrets(url: str) -> list[tuple[int, int, bool]]:
    """Where a URL's query holds a secret, as (start, end, whole) spans of it: the value of
    each password parameter (to the next &: a # in it is the password's, a ledger's URL has
    no fragment), its key read as libpq reads one, percent-decoded (`?pass%77ord=s` is a
    password); and the whole of a parameter whose `=` is encoded too (`?password%3Ds`, which
    no driver takes: the URL is refused, and quoted). Every ? and & starts a parameter: a
    password with a raw ? in it is the user part's, and the query may follow it."""
    if "pass" not in url.lower() and "%" not in url:
        return []
    spans = []
    for start, mark in enumerate(url):
        if mark not in "?&":
            continue
        end = url.find("&", start + 1)
        end = len(url) if end < 0 else end
        key, equals, _ = url[start + 1:end].partition("=")
        name, encoded, _ = _unquoted(key).partition("=")
        if name.strip().lower() not in _QUERY_KEYS:
            continue
        if encoded:  # its `=` encoded (`password%3Ds`, `password%3Ds=x`): the whole of it
            spans.append((start + 1, end, True))
        elif equals:
            spans.append((start + 1 + len(key) + 1, end, False))
    return spans


def _unquoted(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text) if "%" in text else text


def password_forms(password: str) -> set[str]:
    """A password as text, and as a driver, a URL, a message or a JSON document may quote
    it: percent-encoded (either case of hex), libpq's quoting, Python's repr, JSON's
    escapes, once.escape.shown's."""
    if not password:
        return set()
    found = {password}
    if not set(password) <= _UNRESERVED:
        from urllib.parse import quote, quote_plus

        # surrogatepass: a lone surrogate (bytes of a command line that are not UTF-8)
        encoded = {quote(password, safe="", errors="surrogatepass"),
                   quote(password, errors="surrogatepass"),
                   quote_plus(password, safe="", errors="surrogatepass")}
        found |= encoded | {_lower_hex(e) for e in encoded}
    if "\\" in password or "'" in password:
        found.add(password.replace("\\", "\\\\").replace("'", "\\'"))
    if not (password.isascii() and password.isprintable()) or set("\\'\"") & set(password):
        import json

        from once.escape import shown

        found |= {repr(password)[1:-1], ascii(password)[1:-1], json.dumps(password)[1:-1],
                  json.dumps(password, ensure_ascii=False)[1:-1], shown(password)}
    found.discard("")
    return found


def _written_forms(token: str, plus: bool = False) -> set[str]:
    """A password as written in a URL (percent-encoded or not), and decoded: each as text."""
    found = password_forms(token)
    if "%" in token or (plus and "+" in token):
        from urllib.parse import unquote, unquote_plus

        found |= password_forms(unquote(token))
        if plus:
            found |= password_forms(unquote_plus(token))
    return found


def _keyword_forms(value: str) -> set[str]:
    """A libpq key=value password: as written, and as libpq reads it (quotes and
    backslashes off)."""
    inner = value[1:-1] if value.startswith("'") and value.endswith("'") else value
    import re

    return (password_forms(value) | password_forms(inner)
            | password_forms(re.sub(r"\\(.)", r"\1", inner)))


def is_scheme(scheme: str) -> bool:
    """A URL scheme as RFC 3986 spells it (postgresql+psycopg): else what comes before :// is
    no scheme (libpq's `host=h password=s://…`), may hold a secret, and is not shown."""
    return bool(scheme) and scheme.isascii() and scheme[0].isalpha() and all(
        ch.isalnum() or ch in "+-." for ch in scheme)


def _lower_hex(encoded: str) -> str:
    import re

    return re.sub(r"%[0-9A-F]{2}", lambda found: found.group().lower(), encoded)


def _keep(found: set[str]) -> None:
    global _remembered
    if found:
        _remembered = _ordered({*_remembered, *found})


def _ordered(found: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({s for s in found if s}, key=lambda s: (-len(s), s)))

"""once.secrets, the one scrubber: what it remembers of a URL or a password, every form it
replaces, JSON kept JSON, and nothing paid when nothing was remembered (the hot path).
tests/integration/test_secrets.py drives every command with hostile passwords."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from once import secrets


@pytest.fixture(autouse=True)
def nothing_remembered() -> Iterator[None]:
    secrets.forget()
    yield
    secrets.forget()


def test_nothing_remembered_changes_nothing() -> None:
    text = "once: cannot connect to the ledger postgresql://u:***@h/db"
    assert secrets.scrub(text) is text
    assert secrets.scrub_json('{"a": "b"}') == '{"a": "b"}'


@pytest.mark.parametrize("url, password", [
    ("postgresql://u:my50%offSecret@h/db", "my50%offSecret"),  # not percent-encoding
    ("postgresql://u:p%C3%A4ss%20w%27d@h/db", "päss w'd"),  # decoded
    ("mysql://u:a%40b@h1:3306,h2/db", "a@b"),
    ("postgresql://u@h/db?sslmode=require&PASSWORD=two+words", "two words"),
    ("postgresql://u@h/db?sslpassword=key%2Fpass", "key/pass"),
    ("mysql://u@h/db?passwd=Secret123", "Secret123"),
    ("postgresql://u:a/b?c#d@h/db", "a/b?c#d"),  # a raw / ? # (refused: bad port)
    ("sqlite:///x.db?password=a/b?c#d", "a/b?c#d"),
    ("host=h password=Hunter2 dbname=d", "Hunter2"),  # libpq's key=value form
    ("postgresql://u@h/db?pass%77ord=Top%53ecret", "TopSecret"),  # a key percent-encoded
    ("postgresql://u@h/db?%73slpassword=TopSecret", "TopSecret"),
    ("mysql://u@h/db?pass%77d=TopSecret", "TopSecret"),
    ("postgresql://u@h/db?password%3DTop%53ecret", "TopSecret"),  # its = too
    ("postgresql://u@h/db?password%3DTopSecret=x", "TopSecret"),  # and another = after it
    ("mysql://u@h/db?pass%77d%3DTopSecret=1", "TopSecret"),
    ("host=h password='two \\'quoted\\' words' dbname=d", "two 'quoted' words"),
])
def test_a_urls_password_goes_in_every_form(url: str, password: str) -> None:
    import re
    from urllib.parse import quote, quote_plus

    secrets.remember_url(url)
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda hexed: hexed.group().lower(),
                       quote(password, safe=""))
    for form in (password, quote(password, safe=""), lower_hex,
                 quote_plus(password, safe=""), json.dumps(password)[1:-1]):
        assert password not in secrets.scrub(f"driver: {form!r} and {form}")
        assert form not in secrets.scrub(f"driver: {form}."), form


@pytest.mark.parametrize("url", ["host=h password=s dbname=d", "postgres//u:pw@h/db",
                                 "postgresql://u:pw@h/db\x1b[2J", "a b://u:pw@h/db"])
def test_a_text_that_is_no_url_is_remembered_whole(url: str) -> None:
    secrets.remember_url(url)
    assert secrets.scrub(f"bad {url}!") == "bad ***!"


def test_a_url_without_password_remembers_nothing() -> None:
    for url in ("sqlite:////var/lib/once/ledger.db", "postgresql://app@db1:5432,db2/ops",
                "mysql://root@127.0.0.1:3306/test?ssl_ca=/ca.pem", "postgresql://u:@/db"):
        secrets.remember_url(url)
        assert secrets.scrub(url) == url


def test_a_password_files_content_goes_too() -> None:
    secrets.remember_password("c0rrect horse\\battery 'staple'")
    assert secrets.scrub("x c0rrect horse\\battery 'staple' y") == "x *** y"
    assert secrets.scrub("c0rrect%20horse%5Cbattery%20%27staple%27") == "***"
    assert secrets.scrub(r"password='c0rrect horse\\battery \'staple\''") == "password='***'"


def test_every_occurrence_goes_even_of_a_word() -> None:
    secrets.remember_url("postgresql://u:ledger@h/db")
    assert secrets.scrub("cannot read the ledger postgresql://u:ledger@h/db") == (
        "cannot read the *** postgresql://u:***@h/db")


@pytest.mark.parametrize("password", ['", "', "\\", "1, 2", 'a": "b', "ledger", "pässwörd",
                                      "}]"])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_json_stays_json(password: str, ascii_only: bool) -> None:
    secrets.remember_password(password)
    document = {"ledger": f"postgresql://u:{password}@h/db", "n": [1, 2], password: "k",
                "list": [password, f"x{password}y"], "attempt": 12}
    text = json.dumps(document, indent=2, ensure_ascii=ascii_only)
    clean = json.loads(secrets.scrub_json(text))
    assert not [s for s in _strings(clean) if password in s], clean
    assert clean["n"] == [1, 2] and clean["attempt"] == 12
    assert clean["list"] == ["***", "x***y"]


def _strings(value: object) -> list[str]:
    """Every string of a JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_a_servers_own_forms_are_not_remembered() -> None:
    forms = secrets.forms("postgresql://u:s%20w@h/db", "file-pw")
    assert "s w" in forms and "file-pw" in forms
    assert secrets.scrub("s w file-pw") == "s w file-pw"
    assert secrets.scrub("s w file-pw", forms) == "*** ***"


def test_a_url_quoted_in_a_usage_error_loses_its_password() -> None:
    # Before any URL was read: `once doctor postgresql://u:pw@h/db` (no --db).
    line = "once: Got unexpected extra argument (postgresql://u:pw@h/db)"
    assert secrets.scrub_line(line) == "once: Got unexpected extra argument (" \
                                       "postgresql://u:***@h/db)"
    assert secrets.scrub_line("once: ledger postgresql://u:***@h/db") == (
        "once: ledger postgresql://u:***@h/db")


def test_a_command_run_in_its_callers_process_forgets(capsys: pytest.CaptureFixture[str]) -> None:
    secrets.remember_password("before")
    with secrets.kept(for_the_process=False):
        assert secrets.scrub("before") == "before"
        secrets.remember_password("during")
        assert secrets.scrub("during") == "***"
    assert secrets.scrub("during") == "during"


def test_a_crash_of_the_script_is_scrubbed(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    with secrets.kept(for_the_process=True):
        secrets.remember_password("Hunter2")
        try:
            raise RuntimeError('invalid percent-encoded token: "Hunter2"')
        except RuntimeError as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        thread = threading.Thread(target=lambda: 1 / 0 if True else None, name="t")
        thread.run = lambda: (_ for _ in ()).throw(ValueError("Hunter2"))  # type: ignore
        thread.start()
        thread.join()
    err = capsys.readouterr().err
    assert "RuntimeError" in err and "ValueError" in err
    assert "Hunter2" not in err and '"***"' in err


def test_a_sqlite_path_costs_no_import() -> None:
    # `once run` against a SQLite path: nothing remembered, no urllib and no pattern.
    code = ("import sys; from once import secrets; "
            "secrets.remember_url('sqlite:////var/lib/once/ledger.db'); "
            "secrets.scrub('once: x'); secrets.scrub_line('once: x'); "
            "print(secrets._remembered, 'urllib.parse' in sys.modules, 'json' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["()", "False", "False"]


def test_a_character_no_encoding_takes_is_not_quoted() -> None:
    # PyMySQL sends a password as latin-1: the error would quote its character, and where.
    from once.ledger.records import describe

    try:
        "ab\u20accd".encode("latin-1")
    except UnicodeEncodeError as exc:
        said = describe(exc)
    assert "\u20ac" not in said and "\\u20ac" not in said and "position" not in said, said
    assert said.startswith("'latin-1' codec can't encode a character"), said

"""once.limits and the URL checks: what the CLI and the Python API refuse, without a ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from once import limits
from once.ledger import UrlError, parse_url, redact
from once.limits import InputError


@pytest.mark.parametrize("job, namespace, stored", [
    ("j", None, "j"), ("j" * 200, None, "j" * 200),
    ("j" * 54, "n" * 200, "n" * 200 + ":" + "j" * 54),
    ("ü€😀", "ns", "ns:ü€😀"),
])
def test_stored_names_that_fit(job: str, namespace: str | None, stored: str) -> None:
    assert limits.stored_name(job, namespace) == stored


@pytest.mark.parametrize("job, namespace", [
    ("", None), ("a b", None), ("x" * 201, None), ("\x1b[2J", None), ("zw\u200bsp", None),
    ("bad\udcff", None), ("j" * 55, "n" * 200), ("j", ""), ("j", "a b"),
])
def test_stored_names_refused(job: str, namespace: str | None) -> None:
    with pytest.raises(InputError):
        limits.stored_name(job, namespace)


@pytest.mark.parametrize("owner", ["", "x" * 256, "a\nb", "\x1b]0;t\x07", "bad\udcff", "n\0"])
def test_owner_refused(owner: str) -> None:
    with pytest.raises(InputError):
        limits.owner(owner)


def test_owner_fits() -> None:
    assert limits.owner("pod-7f9c:12 ü") == "pod-7f9c:12 ü"
    assert limits.owner("ö" * 255) == "ö" * 255


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 1e12, "x", True])
def test_stale_after_refused(value: object) -> None:
    with pytest.raises(InputError):
        limits.seconds("stale_after", value)  # type: ignore[arg-type]


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe", "not UTF-8"), (b"", "empty"), (b"\n", "empty"), (b"x" * 70000, "64 KiB"),
    (b"pw\0x", "NUL"),
])
def test_bad_secret_files(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "secret"
    path.write_bytes(content)
    with pytest.raises(InputError, match=why) as caught:
        limits.read_secret(str(path), "--db-password-file")
    assert content[:4].decode("latin-1") not in str(caught.value) or not content


def test_a_secret_file_loses_its_trailing_line_breaks(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes("pässword\r\n".encode())
    assert limits.read_secret(str(path), "x") == "pässword"
    with pytest.raises(InputError, match="cannot read"):
        limits.read_secret(str(tmp_path / "missing"), "x")


@pytest.mark.parametrize("url", [
    "postgresql://[::1/x", "postgresql://[zz]/x", "mysql://u:p@[::1/x", "mariadb://[zz]/x",
    "postgresql://u@h/db\n", "sqlite:///x\x1b.db", "postgresql://u@h/d\udcff",
    "mysql://root@h/db?charset=latin1",
])
def test_urls_refused(url: str) -> None:
    with pytest.raises(UrlError):
        parse_url(url)


def test_mysql_charset_utf8mb4_is_accepted_once() -> None:
    target = parse_url("mariadb://root@h:3306/db?charset=utf8mb4")
    assert target.connect_args["charset"] == "utf8mb4"
    assert parse_url("mariadb://root@h:3306/db").connect_args["charset"] == "utf8mb4"


def test_redact_never_fails_and_never_shows_the_password() -> None:
    for url in ("postgresql://u:secret@[::1/x", "postgresql://u:secret@[zz]/x",
                "mysql://u:secret@h/db"):
        assert "secret" not in redact(url) and "u:***@" in redact(url)


def test_redact_hides_a_password_given_in_the_query() -> None:
    for url in ("postgresql://u@h/db?password=secret&sslmode=require",
                "postgresql://u@h/db?sslmode=require&PASSWORD=secret",
                "postgresql://u@h/db?sslpassword=secret", "mysql://u@h/db?passwd=secret",
                "postgresql://u:secret@h/db?password=secret", "postgresql://[::1/x?password=secret",
                # libpq decodes a key as it decodes a value: pass%77ord is password
                "postgresql://u@h/db?pass%77ord=secret", "postgresql://u@h/db?%70assword=secret",
                "postgresql://u@h/db?%73slpassword=secret&sslmode=require",
                "mysql://u@h/db?pass%77d=secret", "postgresql://u:a?b@h/db?pass%77ord=secret",
                "postgresql://u@h/db?password%3Dsecret",  # not a parameter libpq can read
                "postgresql://u@h/db?password%3Dsecret=x", "mysql://u@h/db?passwd%3Dsecret=1",
                "postgresql://u@h/db?password=a?password=secret"):
        assert "secret" not in redact(url), redact(url)
    assert redact("postgresql://u@h/db?pass%77ord=s&sslmode=require") == \
        "postgresql://u@h/db?pass%77ord=***&sslmode=require"
    assert redact("postgresql://u@h/db?sslmode=require") == "postgresql://u@h/db?sslmode=require"


def test_redact_leaves_an_empty_password_as_it_is() -> None:
    # Nothing to hide, and `***` would tell the reader there is a password.
    assert redact("postgresql://u:@/db?host=/tmp") == "postgresql://u:@/db?host=/tmp"

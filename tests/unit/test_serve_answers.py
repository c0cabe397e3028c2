"""`once serve` answers every request, whatever its read raised: an error no endpoint expected
(a bug, a driver's surprise) is a 503 on /healthz and a 500 elsewhere, with its reason and a
line on stderr, never a dropped connection. A real server on a real socket; only the read
fails, by being replaced with one that raises."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from once.ledger import parse_url
from once.serve import data as serve_data
from once.serve.options import ServeOptions
from once.serve.server import Server
from serving import get_from, in_process


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    def surprise(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a surprise\nand a second line")

    monkeypatch.setattr(serve_data, "ping", surprise)
    monkeypatch.setattr(serve_data, "read_fleet", surprise)
    monkeypatch.setattr(serve_data, "read_metrics", surprise)
    settings = ServeOptions(parse_url(f"sqlite:///{tmp_path}/ledger.db"), None, 0, 2.0, None)
    with in_process(settings) as httpd:
        yield httpd


def _get(httpd: Server, path: str) -> tuple[int, str]:
    return get_from(httpd, path, timeout=10)


def test_an_unexpected_error_is_answered_with_its_reason(
        server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert _get(server, "/healthz") == (
        503, "once serve: cannot answer: RuntimeError: a surprise\n")
    status, body = _get(server, "/")
    assert status == 500 and "RuntimeError: a surprise" in body
    assert _get(server, "/metrics")[0] == 500
    err = capsys.readouterr().err
    assert "once: serve: cannot answer /healthz: RuntimeError: a surprise" in err
    assert "Traceback" not in err

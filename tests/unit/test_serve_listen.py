"""`once serve --listen`: HOST:PORT, IPv6 in brackets; anything else is a usage error."""

from __future__ import annotations

import pytest

from once.serve import parse_listen


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:8321", ("127.0.0.1", 8321)),
    ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("localhost:0", ("localhost", 0)),
    ("[::]:8321", ("::", 8321)),
    ("[::1]:9000", ("::1", 9000)),
    (" 127.0.0.1:8321 ", ("127.0.0.1", 8321)),
])
def test_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["", "8321", ":8321", "127.0.0.1", "127.0.0.1:", "host:port",
                                  "127.0.0.1:65536", "127.0.0.1:-1", "::1:8321",
                                  "user@127.0.0.1:8321", "127.0.0.1:8321/path"])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad --listen"):
        parse_listen(text)

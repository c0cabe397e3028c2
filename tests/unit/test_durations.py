"""parse_duration: the durations of --stale-after, --kill-after, --timeout, --grace and more."""

from __future__ import annotations

import pytest

from once.periods import SpecError, parse_duration

# fmt: off
DURATIONS = [
    # n, text, seconds
    (1, "90", 90.0),
    (2, "90s", 90.0),
    (3, "5m", 300.0),
    (4, "2h", 7200.0),
    (5, "1d", 86400.0),
    (6, "1h30m", 5400.0),
    (7, "1m30s", 90.0),
    (8, "1d2h3m4s", 93784.0),
    (9, "1", 1.0),
    (10, "0m30s", 30.0),
    (11, "36h", 129600.0),
    (12, "007", 7.0),
]

USE = "use 90, 90s, 5m, 2h, 1d or 1h30m"
REJECTED = [
    # n, text, message
    (1, "", f"bad duration '': {USE}"),
    (2, "0", "bad duration '0': it must be more than zero"),
    (3, "0s", "bad duration '0s': it must be more than zero"),
    (4, "0h0m", "bad duration '0h0m': it must be more than zero"),
    (5, "-5", f"bad duration '-5': {USE}"),
    (6, "5x", f"bad duration '5x': {USE}"),
    (7, "1h1h", f"bad duration '1h1h': {USE}"),
    (8, "m", f"bad duration 'm': {USE}"),
    (9, "30m1h", f"bad duration '30m1h': {USE}"),  # largest unit first
    (10, "1.5h", f"bad duration '1.5h': {USE}"),
    (11, "5 m", f"bad duration '5 m': {USE}"),
    (12, " 5m", f"bad duration ' 5m': {USE}"),
    (13, "5M", f"bad duration '5M': {USE}"),
    (14, "1w", f"bad duration '1w': {USE}"),
    (15, "90ss", f"bad duration '90ss': {USE}"),
    (16, "５m", f"bad duration '５m': {USE}"),
    (17, "5m\n", f"bad duration '5m\\n': {USE}"),
]
# fmt: on


@pytest.mark.parametrize(("n", "text", "seconds"), DURATIONS)
def test_parse_duration(n: int, text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds, f"case {n}"
    assert isinstance(parse_duration(text), float)


@pytest.mark.parametrize(("n", "text", "message"), REJECTED)
def test_parse_duration_rejects(n: int, text: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_duration(text)
    assert str(caught.value) == message, f"case {n}"
    assert "\n" not in str(caught.value)

"""docs/concepts/periods.md "The cron dialect", line by line: each accepted form fires at the
times its row says, each refused one is refused (exit 2's SpecError) for the reason it gives.
The test reads the page itself, so that the table cannot drift from the code."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from once.periods import SpecError
from once.schedules import schedule

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "periods.md"
START = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


def _tables() -> tuple[list[list[str]], list[list[str]]]:
    text = PAGE.read_text().split("## The cron dialect", 1)[1]
    accepted_part, refused_part = text.split("Refused, exit 2", 1)
    def rows(part: str) -> list[list[str]]:
        found = []
        for line in part.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and len(cells) == 3 and not set(cells[0]) <= {"-", " "} \
                    and cells[0] != "form":
                found.append(cells)
        return found
    return rows(accepted_part), rows(refused_part.split("Where the")[0])


ACCEPTED, REFUSED = _tables()


def test_the_tables_are_read() -> None:
    assert len(ACCEPTED) >= 15 and len(REFUSED) >= 6


@pytest.mark.parametrize(("form", "example", "fires"), ACCEPTED, ids=[r[1] for r in ACCEPTED])
def test_an_accepted_form_fires_as_its_row_says(form: str, example: str, fires: str) -> None:
    sched = schedule(None, example.strip("`"), "UTC")
    at, found = START, []
    for _ in range(3):
        at = sched.containing(at).end
        found.append(at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"))
    assert ", ".join(found) == fires
    nickname = re.findall(r"\(`([^`]+)`\)", form)
    if nickname:  # a nickname is stored as the fields it stands for
        assert sched.spec == nickname[0]


@pytest.mark.parametrize(("form", "example", "says"), REFUSED, ids=[r[1] for r in REFUSED])
def test_a_refused_form_says_what_to_write(form: str, example: str, says: str) -> None:
    with pytest.raises(SpecError) as refused:
        schedule(None, example.strip("`"), "UTC").containing(START)
    said = str(refused.value)
    assert "\n" not in said and says in said, said

"""Every schedule draws: `once status --timeline`, `once serve`'s `/` and `/job/NAME` for a
job of each `--every` spec the period engine takes (once.periods.every_specs, so that a new
unit is drawn here without editing this test) and a cron job, on every backend.

`--every month` used to kill both drawings (`"month".endswith("h")`: int('mont')), and
`/job/NAME` answered nothing at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

import once
from helpers import run_here
from once.periods import every_specs
from serving import ServedHere

CRON = "*/7 3-5 * * *"
SPECS = every_specs(every_spelling=True)


def job_name(spec: str) -> str:
    return f"every-{spec}"


def seed(url: str, name: str, **schedule: str) -> None:
    """Three periods of the job: two back done, one back missing, the current one failed."""
    with once.claim(name, db=url, lag=2, **schedule) as run:
        assert run.won, run.skip_reason
    with pytest.raises(RuntimeError), once.claim(name, db=url, **schedule) as run:
        assert run.won, run.skip_reason
        raise RuntimeError("the command failed")


@pytest.fixture
def seeded(ledger_url: str) -> list[str]:
    names = []
    for spec in SPECS:
        seed(ledger_url, job_name(spec), every=spec, tz="Europe/Berlin")
        names.append(job_name(spec))
    seed(ledger_url, "cron-job", cron=CRON, tz="America/New_York")
    return [*names, "cron-job"]


@pytest.fixture
def server(once_env: dict[str, str], seeded: list[str]) -> Iterator[ServedHere]:
    served = ServedHere(env=once_env)
    yield served
    served.stop()


def test_the_engine_lists_every_unit() -> None:
    # What the test iterates over holds every kind of unit, so a failure here is the list's.
    assert {"minute", "hour", "day", "week", "month", "quarter", "year", "15m", "6h"} <= set(
        SPECS)


def test_status_timeline_draws_every_schedule(once_env: dict[str, str],
                                              seeded: list[str]) -> None:
    result = run_here("status", "--timeline", env=once_env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "cannot draw" not in result.stdout
    titles = [line.split()[0] for line in result.stdout.splitlines()
              if line and not line.startswith(" ") and line.split()[0] in seeded]
    assert sorted(titles) == sorted(seeded), result.stdout
    for name in seeded:
        drawing = result.stdout.split(name + "  ", 1)[1]
        assert "1 done" in drawing.splitlines()[0] and "1 failed" in drawing.splitlines()[0], (
            name, drawing[:400])


def test_serve_draws_every_schedule(server: ServedHere, seeded: list[str]) -> None:
    overview = server.get("/")
    assert overview.status == 200, overview.text
    for name in seeded:
        assert f'href="/job/{quote(name, safe="")}"' in overview.text, name
    for name in seeded:
        page = server.get(f"/job/{quote(name, safe='')}", timeout=60)
        assert page.status == 200, (name, page.text)
        assert 'class="timeline"' in page.text and "g-done" in page.text, name
        assert "g-failed" in page.text, name

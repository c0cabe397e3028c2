"""`/api/status`: what `once status --json` prints, every job by name; or a page of them, and
only those that match the dashboard's filter, when the query asks
(`/api/status?state=problems&name=sync&limit=100&offset=200`).

Without a query it reads every job in full, as it always did (10,000 jobs: seconds). With one,
it reads the fleet only as far as the query needs: with a `state`, every job's verdict (what
the dashboard's page reads), then the detail of the page's jobs alone; without, the names
alone, then the page's jobs in full. `X-Total-Count` says how many jobs match, and a `Link`
header (rel="next") where the next page is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

from once import report
from once.ledger.fleet import NoLedger, Snapshot, Standby
from once.serve.data import Fleet, read_only
from once.serve.overview import NAME_LIMIT, STATES, Listing

if TYPE_CHECKING:
    from once.serve.options import ServeOptions

JSON = "application/json"
LIMIT_MAX = 10**6  # jobs a page at most (more: a client's mistake)
PARAMETERS = ("state", "name", "limit", "offset")


class BadQuery(ValueError):
    """A query /api/status cannot answer (400): the reason."""


@dataclass(frozen=True)
class Wanted:
    """The jobs a query asks for: those of a state whose name holds a part, a page of them."""

    state: str = "all"
    name: str = ""
    limit: int | None = None  # None: every match
    offset: int = 0

    @classmethod
    def parse(cls, query: str) -> Wanted | None:
        """None for no query (every job in full, as always); BadQuery when it has an unknown
        parameter or value (a typo is said, not answered with every job)."""
        given = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if not given:
            return None
        unknown = sorted(set(given) - set(PARAMETERS))
        if unknown:
            raise BadQuery(f"unknown parameter {unknown[0]!r}: /api/status takes "
                           f"{', '.join(PARAMETERS)}")
        state = given.get("state", "all")
        if state not in STATES:
            raise BadQuery(f"unknown state {state!r}: one of {', '.join(STATES)}")
        limit = _number(given, "limit", 1) if "limit" in given else None
        return cls(state, given.get("name", "").strip()[:NAME_LIMIT], limit,
                   _number(given, "offset", 0) if "offset" in given else 0)

    def next_query(self, matched: int) -> str | None:
        """The query of the page after this one; None when this is the last."""
        if self.limit is None or self.offset + self.limit >= matched:
            return None
        query = {"state": self.state, "name": self.name, "limit": self.limit,
                 "offset": self.offset + self.limit}
        return urlencode({k: v for k, v in query.items() if v != getattr(Wanted, k)})


def _number(given: dict[str, str], name: str, least: int) -> int:
    text = given[name]
    if not (text.isascii() and text.isdigit()) or not least <= int(text) <= LIMIT_MAX:
        raise BadQuery(f"bad {name} {text!r}: a whole number from {least} to {LIMIT_MAX}")
    return int(text)


@dataclass
class Page:
    """The jobs a query asked for, and how many match it in all."""

    states: list[report.JobState]
    matched: int
    standby: Standby | None = None


def read_page(settings: ServeOptions, wanted: Wanted) -> Page:
    """The jobs of the query, each in full (as `once status --json` has them)."""
    target, namespace = settings.target, settings.namespace
    try:
        with read_only(target, settings.read_timeout) as conn:
            snap = Snapshot.over(conn, target)
            standby = snap.standby()
            end = None if wanted.limit is None else wanted.offset + wanted.limit
            if wanted.state == "all":  # no verdict needed: the names pick the page
                rows = [r for r in snap.job_rows(None, namespace)
                        if Listing(name=wanted.name).matches_name(r.job)]
                states = report.survey(snap, rows[wanted.offset:end], snap.db_now())
                return Page(states, len(rows), standby)
            listing = Listing(state=wanted.state, name=wanted.name)
            surveyed, _ = report.survey_jobs(snap, None, namespace, detail=False)
            matched = [s for s in surveyed if listing.matches(s)]
            shown = matched[wanted.offset:end]
            report.complete(snap, shown)
            return Page(shown, len(matched), standby)
    except NoLedger:
        return Page([], 0)


def whole(fleet: Fleet) -> Page:
    """Every job of the fleet (read in full: once.serve.data.read_fleet)."""
    return Page(fleet.states, len(fleet.states), fleet.standby)


def body(page: Page, ledger: str) -> str:
    return report.indented_json(report.status_objects(page.states, ledger=ledger,
                                                      standby=page.standby)) + "\n"


def error(why: str) -> str:
    return json.dumps({"error": why}) + "\n"


def headers(page: Page, wanted: Wanted | None) -> dict[str, Any]:
    """X-Total-Count, and Link to the next page where there is one."""
    found = {"X-Total-Count": str(page.matched)}
    following = wanted.next_query(page.matched) if wanted is not None else None
    if following is not None:
        found["Link"] = f'</api/status?{following}>; rel="next"'
    return found

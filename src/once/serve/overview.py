"""`once serve`'s overview (`/`): every job as a row, problems first, with a filter by state
and name, a choice of order and pages of PAGE jobs, all in the query string of a plain HTML
form (`/?state=failed&name=sync&sort=next&page=2`): no script needed, a filtered view can be
bookmarked or sent, and a fleet of thousands of jobs reads only the timelines of the page it
shows (once.serve.data.read_fleet's pick).

Cells come from once.report (status_object, the findings, the timeline's states), escaped by
html.escape; the page's frame and style are once.serve.pages'. The lead names of `once lead`
follow the jobs, in a table of their own (as `once status` has them), each with its verdict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import parse_qs, urlencode

from once import report
from once.ledger.leases import Lead
from once.periods import Period
from once.report import timeline
from once.report.leads import LEAD_HEADERS, lead_cells
from once.report.render import NOW_WORDS
from once.serve.data import Fleet
from once.serve.pages import (
    SEVERITY_CLASS,
    footer,
    header,
    job_href,
    key_html,
    output_href,
    page,
    said_html,
    schedule_text,
    severity,
)

PAGE = 100  # jobs a page
NAME_LIMIT = 200  # characters of the name filter kept

STATES = {"all": "every state", "problems": "problems", "failed": "failed",
          "missing": "missing", "stale": "stale", "overrun": "overrun",
          "running": "running", "ok": "OK"}
SORTS = {"problems": "problems first", "name": "by name", "next": "by next period"}
NOW_CLASS = {"done": "ok-text", "running": "run", "stale": "warn", "failed": "bad",
             "not-run": "dim"}


@dataclass(frozen=True)
class Listing:
    """What the overview shows: a state, a part of the name, an order, a page."""

    state: str = "all"
    name: str = ""
    sort: str = "problems"
    page: int = 1

    @classmethod
    def parse(cls, query: str) -> Listing:
        """From a query string; what it cannot read is left at its default."""
        given = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        number = given.get("page", "1")
        return cls(state=given.get("state", "all") if given.get("state") in STATES else "all",
                   name=given.get("name", "").strip()[:NAME_LIMIT],
                   sort=given.get("sort", "problems") if given.get("sort") in SORTS
                   else "problems",
                   page=int(number) if number.isascii() and number.isdigit()
                   and 0 < int(number) < 10**6 else 1)

    def matches(self, s: report.JobState) -> bool:
        return self.matches_name(s.name) and _IN_STATE[self.state](s)

    def matches_name(self, name: str) -> bool:
        return not self.name or self.name.casefold() in name.casefold()

    def ordered(self, states: Iterable[report.JobState]) -> list[report.JobState]:
        """The jobs that match, in the order asked for."""
        found = [s for s in states if self.matches(s)]
        if self.sort == "name":
            return sorted(found, key=lambda s: s.name)
        if self.sort == "next":
            return sorted(found, key=lambda s: (s.next_at is None, s.next_at or 0, s.name))
        return sorted(found, key=lambda s: (-severity(s), s.name))

    def pages(self, matched: int) -> int:
        return max(1, -(-matched // PAGE))

    def matched(self, states: Iterable[report.JobState]) -> int:
        """How many jobs match (no order needed to count them)."""
        return sum(1 for s in states if self.matches(s))

    def pick(self, states: Sequence[report.JobState]) -> list[report.JobState]:
        """The jobs of this page (the page past the last is the last)."""
        found = self.ordered(states)
        first = (min(self.page, self.pages(len(found))) - 1) * PAGE
        return found[first:first + PAGE]

    def href(self, **changes: Any) -> str:
        """This listing's address, with changes; what is at its default is left out."""
        listing = replace(self, **changes)
        query = {k: v for k, v in (("state", listing.state), ("name", listing.name),
                                   ("sort", listing.sort), ("page", listing.page))
                 if v != getattr(Listing, k)}
        return "/" + (f"?{urlencode(query)}" if query else "")


_IN_STATE: dict[str, Callable[[report.JobState], bool]] = {
    "all": lambda s: True,
    "problems": lambda s: severity(s) > report.OK,
    "ok": lambda s: severity(s) == report.OK,
    "failed": lambda s: bool(s.failed),
    "missing": lambda s: s.missing > 0,
    "stale": lambda s: any(s.is_stale(r) for r in s.running),
    "overrun": lambda s: bool(s.overrunning),
    "running": lambda s: any(not s.is_stale(r) for r in s.running),
}

HEADINGS = ("job, latest periods", "schedule", "last done", "running now", "failed",
            "missing", "now", "next")


def overview(fleet: Fleet, ledger: str, namespace: str | None, refresh: float,
             listing: Listing | None = None) -> str:
    """The jobs of the listing's page, problems first unless it says otherwise."""
    listing = listing or Listing()
    ranked = fleet.states
    counts = Counter(severity(s) for s in ranked)
    space = f", namespace <code>{escape(namespace)}</code>" if namespace else ""
    summary = ", ".join(f"{n} {report.SEVERITY[sev]}" for sev, n in
                        sorted(counts.items(), reverse=True) if n)
    heading = f"once: {len(ranked)} job{'' if len(ranked) == 1 else 's'}"
    body = [header(escape(heading), ledger, f"{space}; {escape(summary or 'no jobs yet')}")]
    if ranked:
        matched = listing.matched(ranked)
        # the page read_fleet picked, its jobs' detail read (a fleet sorted once, not twice)
        shown = fleet.shown if fleet.shown is not None else listing.pick(ranked)
        body += [_form(listing), _count(listing, matched, len(ranked))]
        if shown:
            body.append('<table class="cards jobs">\n<thead><tr>'
                        + "".join(f"<th>{h}</th>" for h in HEADINGS)
                        + "</tr></thead>\n<tbody>")
            body += [_row(s, fleet.now, fleet.strips.get(s.name, [])) for s in shown]
            body.append("</tbody>\n</table>")
        body.append(_pager(listing, matched))
    else:
        body.append("<p>No job has run against this ledger yet"
                    + (" under this namespace" if namespace else "") + ".</p>")
    if fleet.leads:
        body.append(_leads(fleet.leads))
    body.append(footer(fleet.now, refresh))
    return page(heading, "\n".join(body), refresh)


_LEADER_CLASS = {"cyan": "run", "yellow": "warn", "bold red": "bad"}


def _leads(leads: Sequence[Lead]) -> str:
    """The lead names: who leads each, since when, its last renewal and candidates; CRITICAL
    as `once check` (without --grace) says, when none has led it past its lease."""
    count = f"{len(leads)} lead name{'' if len(leads) == 1 else 's'}"
    rows = []
    for lead in leads:
        sev = report.CRITICAL if report.overdue(lead, 0.0) else report.OK
        klass = SEVERITY_CLASS[sev]
        (name, _), (leader, style), *rest = lead_cells(lead)
        cells = [f'<span class="{_LEADER_CLASS.get(style, "")}">{escape(leader)}</span>',
                 *(escape(text) for text, _ in rest)]
        rows.append(f'<tr class="{klass}"><td>{escape(name)}<span class="badge {klass}">'
                    f"{report.SEVERITY[sev]}</span></td>"
                    + "".join(f'<td data-label="{escape(h.lower())}">{c}</td>'
                              for h, c in zip(LEAD_HEADERS[1:], cells, strict=True))
                    + "</tr>")
    return (f'<h2 id="leads">{count}</h2>\n<table class="cards leads">\n<thead><tr>'
            + "".join(f"<th>{escape(h.lower())}</th>" for h in LEAD_HEADERS)
            + "</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>")


def _form(listing: Listing) -> str:
    def options(choices: dict[str, str], chosen: str) -> str:
        return "".join(f'<option value="{k}"{" selected" if k == chosen else ""}>{v}</option>'
                       for k, v in choices.items())

    return ('<form class="filter" method="get" action="/">'
            f'<label>name <input type="search" name="name" value="{escape(listing.name)}" '
            f'maxlength="{NAME_LIMIT}" placeholder="part of a job name"></label> '
            f'<label>state <select name="state">{options(STATES, listing.state)}</select>'
            f'</label> <label>order <select name="sort">{options(SORTS, listing.sort)}'
            '</select></label> <button type="submit">show</button>'
            + (' <a href="/">clear</a>' if listing != Listing() else "") + "</form>")


def _count(listing: Listing, matched: int, total: int) -> str:
    if not matched:
        return '<p class="dim">No job matches.</p>'
    first = (min(listing.page, listing.pages(matched)) - 1) * PAGE
    last = min(first + PAGE, matched)
    which = f"{first + 1}-{last} of {matched}" if matched > PAGE else f"{matched}"
    of = f" (of {total})" if matched != total else ""
    return f'<p class="dim count">{which} job{"" if matched == 1 else "s"}{of}</p>'


def _pager(listing: Listing, matched: int) -> str:
    pages = listing.pages(matched)
    if pages == 1:
        return ""
    at = min(listing.page, pages)
    links = []
    if at > 1:
        links.append(f'<a href="{escape(listing.href(page=at - 1))}">« previous</a>')
    links.append(f"page {at} of {pages}")
    if at < pages:
        links.append(f'<a href="{escape(listing.href(page=at + 1))}">next »</a>')
    return '<nav class="pager">' + " · ".join(links) + "</nav>"


def _row(s: report.JobState, now: datetime, strip: list[tuple[Period, str]]) -> str:
    sev = severity(s)
    klass = SEVERITY_CLASS[sev]
    obj = report.status_object(s)
    name = (f'<a href="{escape(job_href(s.name))}">{escape(s.name)}</a>'
            f'<span class="badge {klass}">{report.SEVERITY[sev]}</span><br>{_strip(strip)}')
    schedule = f'{escape(schedule_text(s))}<br><span class="dim">{escape(s.tz)}</span>'
    if s.sched is None:
        cells = [schedule, f'<span class="bad">cannot read the schedule: {escape(s.error)}'
                 "</span>", "", "", "", "", ""]
    else:
        cells = [schedule, _last_done(s, now), _running(s), _failed(s, obj), _missing(obj),
                 _now(s), _next(s, now)]
    return (f'<tr class="{klass}"><td>{name}</td>'
            + "".join(f'<td data-label="{h}">{c}</td>'
                      for h, c in zip(HEADINGS[1:], cells, strict=True)) + "</tr>")


def _last_done(s: report.JobState, now: datetime) -> str:
    last = s.last_done
    if last is None:
        return '<span class="warn">never</span>'
    ago = (f"finished {report.age((now - last.finished_at).total_seconds())} ago, "
           if last.finished_at else "")
    return (f"{key_html(last.period)}<br>"
            f'<span class="dim">{ago}took {escape(report.took(last.duration))}</span>')


def _running(s: report.JobState) -> str:
    out = []
    for r in s.running:
        stale = s.is_stale(r)
        text = (f'{key_html(r.period)} <span class="owner">{escape(r.owner)}</span> '
                f"#{r.attempt}, heartbeat {report.age(s.heartbeat_age(r))} ago")
        if s.overruns(r):
            text += f" OVERRUN {report.age(s.running_for(r))}"
        out.append(f'<span class="warn">{text} STALE</span>' if stale
                   else f'<span class="bad">{text}</span>' if s.overruns(r)
                   else f'<span class="run">{text}</span>')
    return "<br>".join(out) or '<span class="dim">-</span>'


def _failed(s: report.JobState, obj: dict[str, Any]) -> str:
    """The count, the first failed periods and what the latest failure said, linked to its
    output."""
    if not obj["failed"]:
        return '<span class="dim">0</span>'
    out = f" ({obj['failed_out']} failed-out)" if obj["failed_out"] else ""
    keys = ", ".join(key_html(f["period"]) for f in obj["failed_periods"][:3])
    cell = (f'<span class="bad nowrap">{obj["failed"]}{out}</span><br>'
            f'<span class="dim">{keys}</span>')
    latest = obj["last_failure"]
    if latest is not None:
        href = output_href(s.name, latest["period"], latest["attempt"])
        cell += f"<br>{said_html(latest['last_line'], href)}"
    return cell


def _missing(obj: dict[str, Any]) -> str:
    if not obj["missing"]:
        return '<span class="dim">0</span>'
    more = "+" if obj["missing_at_least"] else ""
    keys = ", ".join(key_html(k) for k in obj["missing_periods"][:3])
    last = obj["missing_last"]
    if last and last not in obj["missing_periods"][:3]:
        keys += f" … {key_html(last)}"
    return f'<span class="bad">{obj["missing"]}{more}</span><br><span class="dim">{keys}</span>'


def _now(s: report.JobState) -> str:
    """The period once run claims now, and whether it is done."""
    state = s.current_state
    if s.current is None or state is None:
        return '<span class="dim">-</span>'
    word = NOW_WORDS[state][0]
    return f'{key_html(s.current.key)}<br><span class="{NOW_CLASS[state]}">{word}</span>'


def _next(s: report.JobState, now: datetime) -> str:
    """The next period and how soon once run claims it; a lagging job's key is no time it
    happens at, so it is called a period, due in so long."""
    if s.next is None or s.next_at is None:
        return '<span class="dim">-</span>'
    period, due = ('<span class="dim">period</span> ', "due ") if s.lag else ("", "")
    return (f"{period}{key_html(s.next.key)}<br><span class=\"dim\">{due}in "
            f"{report.age((s.next_at - now).total_seconds())}</span>")


def _strip(cells: Iterable[tuple[Period, str]]) -> str:
    spans = [f'<span class="cell s-{state}" title="{escape(p.key)}: '
             f'{escape(timeline.STATES[state][3])}"></span>' for p, state in cells]
    return f'<span class="strip">{"".join(spans)}</span>'

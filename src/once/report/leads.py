"""The lead names of `once lead` in the reports, beside the jobs: `once status` (a table of
their own under the jobs', `--leads` for them alone, `--leads --json` their array), `once
history --lead NAME` (its terms), `once check` (a name without a leader past its lease plus
--grace is CRITICAL `leaderless`) and `once metrics` (the `once_lead_` metrics).

The reads are once.ledger.leases' (a row a name, a row a term: a handful of rows), sent last
in a report's snapshot: on a ledger no `once lead` has used the tables are not there, and the
read that finds so ends the snapshot's transaction (PostgreSQL's catalog is asked first, so
that its server logs no error). A name never seen is in no report; a name retired with `once
lead --retire` leaves them all but `once history --lead`, which keeps its terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from once.ledger import leases
from once.ledger.fleet import Snapshot, Standby
from once.ledger.leases import Lead, TermRow, TermTotals
from once.periods import iso
from once.report.check import CRITICAL, Finding
from once.report.model import rounded
from once.report.render import age, plain_table, tty, write_line
from once.report.screen import Cell, Fitted

# -- reading


def read_leads(snap: Snapshot, names: Sequence[str] | None = None,
               namespace: str | None = None) -> list[Lead]:
    """The lead names (those named, else those of the namespace, else all), by name; read
    last in a snapshot (the module's docstring)."""
    if not leases.leases_kept(snap.backend, snap.conn):
        return []
    found = leases.read_leads(snap.backend, snap.conn)
    if names:
        return [lead for lead in found if lead.name in set(names)]
    if namespace:
        return [lead for lead in found if lead.name.startswith(namespace + ":")]
    return found


def read_figures(snap: Snapshot, namespace: str | None = None) -> list[LeadFigures]:
    """Every lead name (of the namespace) with its terms' totals, for the metrics."""
    found = read_leads(snap, None, namespace)
    totals = leases.read_term_totals(snap.backend, snap.conn) if found else {}
    return [LeadFigures.of(lead, totals.get(lead.name)) for lead in found]


def read_terms(snap: Snapshot, name: str, limit: int) -> tuple[list[TermRow], Lead | None]:
    """The name's `limit` latest terms, newest first, and its lease (None: retired, or never
    seen)."""
    if not leases.leases_kept(snap.backend, snap.conn):
        return [], None
    terms = leases.read_recent_terms(snap.backend, snap.conn, name, limit)
    lead = next((x for x in read_leads(snap, [name]) if x.name == name), None) if terms else None
    return terms, lead


# -- what they mean


def overdue(lead: Lead, grace: float) -> bool:
    """No leader for longer than its lease plus grace: no candidate took over (once check's
    CRITICAL). Counted from when the last holder's lease ran out or was released."""
    return not lead.held and lead.leaderless_for > lead.lease_seconds + grace


@dataclass(frozen=True)
class LeadFigures:
    """A lead name as `once metrics` counts it."""

    lead: Lead
    changes: int  # terms begun
    leaderless_total: float  # seconds without a leader since its first term began

    @classmethod
    def of(cls, lead: Lead, totals: TermTotals | None) -> LeadFigures:
        if totals is None:  # no term kept (the lease alone): its present is all there is
            return cls(lead, 0, lead.leaderless_for)
        held = totals.ended_held
        if lead.owner is not None and lead.acquired_at is not None:  # its latest term lasts
            held += max(0.0, (min(lead.now, lead.expires_at) - lead.acquired_at)
                        .total_seconds())
        span = (lead.now - totals.first_started_at).total_seconds()
        return cls(lead, totals.terms, max(0.0, span - held))


# -- once status


LEAD_HEADERS = ["LEAD", "LEADER", "TERM", "SINCE (UTC)", "RENEWED", "LEASE", "CANDIDATES"]
LEAD_DROP = ("LEASE", "RENEWED", "SINCE")  # what a narrow terminal loses first


def seconds(value: float) -> str:
    """A lease as `once lead --lease` takes it: 15s, 90s, 0.5s."""
    return f"{value:g}s"


def lead_cells(lead: Lead, compact: bool = False) -> list[Cell]:
    """One row of the leads' table; compact: SINCE as an age, for a narrow terminal."""
    if lead.held:
        leader: Cell = (lead.owner or "", "cyan")
        started = lead.acquired_at or lead.now
        since = (f"{age((lead.now - started).total_seconds()).replace(' ', '')} ago" if compact
                 else started.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))
        renewed = lead.renewed_at or lead.now
        renewal = f"{age((lead.now - renewed).total_seconds())} ago"
    else:
        style = "bold red" if overdue(lead, 0.0) else "yellow"
        leader = (f"none for {age(lead.leaderless_for)}", style)
        since = renewal = "-"
    return [(lead.name, "bold"), leader, (str(lead.term), ""), (since, ""), (renewal, ""),
            (seconds(lead.lease_seconds), ""), (str(lead.candidates), "")]


def lead_table(leads: Sequence[Lead]) -> Fitted:
    """The leads' table, whole and compact, as once.report.render.render_status draws it."""
    return Fitted(LEAD_HEADERS, [lead_cells(x) for x in leads],
                  [lead_cells(x, compact=True) for x in leads], LEAD_DROP)


def lead_objects(leads: Sequence[Lead], ledger: str,
                 standby: Standby | None = None) -> list[dict[str, Any]]:
    """The array `once status --leads --json` prints (and `/api/leads`)."""
    return [{
        "lead": x.name,
        "held": x.held,
        "owner": x.owner if x.held else None,
        "term": x.term,
        "lease_s": x.lease_seconds,
        "leading_since": _at(x.acquired_at) if x.held else None,
        "renewed_at": _at(x.renewed_at) if x.held else None,
        "expires_at": _at(x.expires_at),
        "leaderless_s": rounded(x.leaderless_for),
        "candidates": x.candidates,
        "ledger": ledger,
        "standby": None if standby is None else {"replay_lag_s": standby.lag},
    } for x in leads]


def _at(instant: datetime | None) -> str | None:
    return None if instant is None else iso(instant.astimezone(UTC))


# -- once history --lead NAME


def term_entries(terms: Sequence[TermRow], lead: Lead | None) -> list[dict[str, Any]]:
    """The array `once history --lead NAME --json` prints: its terms, newest first. A term
    the table has not seen end is `expired` once nobody holds it (its lease ran out), and
    lasts (null) while its holder leads."""
    now = lead.now if lead is not None else datetime.now(UTC)
    out = []
    for t in terms:
        ended, ended_at = t.ended, t.ended_at
        if ended is None and not (lead is not None and lead.term == t.term and lead.held):
            ended = "expired"
            if lead is not None and lead.term == t.term:
                ended_at = lead.expires_at
        end = ended_at if ended is not None else now
        out.append({"lead": t.name, "term": t.term, "owner": t.owner,
                    "lease_s": t.lease_seconds, "started_at": _at(t.started_at),
                    "ended_at": _at(ended_at), "ended": ended,
                    "held_s": None if end is None else rounded(max(
                        0.0, (end - t.started_at).total_seconds()))})
    return out


TERM_HEADERS = ["TERM", "OWNER", "FROM (UTC)", "TO (UTC)", "HELD", "ENDED"]
TERM_DROP = ("HELD", "TO")
_ENDED_STYLE = {"released": "green", "lost": "bold red", "expired": "yellow", None: "cyan"}


def term_cells(e: dict[str, Any], compact: bool = False) -> list[Cell]:
    def when(text: str | None) -> str:
        if text is None:
            return "-"
        at = datetime.fromisoformat(text)
        return at.strftime("%m-%d %H:%M" if compact else "%Y-%m-%d %H:%M:%S")

    held = "-" if e["held_s"] is None else age(e["held_s"])
    return [(str(e["term"]), ""), (e["owner"], ""), (when(e["started_at"]), ""),
            (when(e["ended_at"]), ""), (held, ""),
            (e["ended"] or "leading", _ENDED_STYLE.get(e["ended"], ""))]


def render_terms(name: str, entries: list[dict[str, Any]], wide: bool = False) -> None:
    if tty():
        from once.report import screen

        screen.history_table(TERM_HEADERS, [term_cells(e) for e in entries],
                             [term_cells(e, compact=True) for e in entries], TERM_DROP, None,
                             title=name, wide=wide)
        return
    write_line(plain_table(TERM_HEADERS, [term_cells(e) for e in entries]))


# -- once check


def lead_findings(leads: Sequence[Lead], grace: float) -> list[Finding]:
    """CRITICAL `NAME - leaderless (...)` for each name without a leader past its lease plus
    grace; a name held, or in a takeover within its lease, is OK. The JSON's `job` is null
    and `lead` names it."""
    found = []
    for x in leads:
        if not overdue(x, grace):
            continue
        how = ("released" if x.owner is None
               else f"expired (its holder {x.owner} stopped renewing)")
        waiting = f"{x.candidates} candidate{'' if x.candidates == 1 else 's'} waiting"
        detail = (f"no leader for {age(x.leaderless_for)}, lease {seconds(x.lease_seconds)}; "
                  f"term {x.term} {how}; {waiting}")
        found.append(Finding(CRITICAL, x.name, "-", "leaderless", detail,
                             {"job": None, "lead": x.name, "term": x.term,
                              "leaderless_s": rounded(x.leaderless_for),
                              "lease_s": x.lease_seconds, "candidates": x.candidates}))
    return found

"""once.report.leads' rules over lead names built by hand (no ledger): when a name is
leaderless past its lease, what its terms and the metrics add up to, how a term the table has
not seen end is shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from once.ledger.leases import Lead, TermRow, TermTotals
from once.report import exposition
from once.report.leads import LeadFigures, lead_findings, overdue, term_entries

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def lead(name: str = "beat", owner: str | None = "pod-a", acquired: float = 100.0,
         expires_in: float = 10.0, lease: float = 15.0, term: int = 4,
         candidates: int = 1) -> Lead:
    """A lease read at NOW: taken `acquired` seconds ago, running out in expires_in (negative:
    ran out that long ago); owner None: released."""
    return Lead(name, owner, term, lease, ago(acquired), ago(1.0), NOW + timedelta(
        seconds=expires_in), NOW, candidates)


def test_leaderless_past_the_lease_plus_grace_and_not_a_second_before() -> None:
    assert not overdue(lead(), 0.0)  # held
    assert not overdue(lead(owner=None, expires_in=-15.0), 0.0)  # released 15 s ago: = lease
    assert overdue(lead(owner=None, expires_in=-15.5), 0.0)
    assert not overdue(lead(owner=None, expires_in=-15.5), 1.0)  # --grace 1s
    assert overdue(lead(expires_in=-20.0), 0.0)  # its holder stopped renewing


def test_a_finding_names_the_name_the_term_and_how_it_ended() -> None:
    found = lead_findings([lead(owner=None, expires_in=-60.0, candidates=0),
                           lead("stuck", expires_in=-61.0), lead("fine")], 0.0)
    assert [f.line for f in found] == [
        "CRITICAL beat - leaderless (no leader for 1m, lease 15s; term 4 released; "
        "0 candidates waiting)",
        "CRITICAL stuck - leaderless (no leader for 1m, lease 15s; term 4 expired (its holder "
        "pod-a stopped renewing); 1 candidate waiting)"]
    as_json = found[0].as_dict()
    assert (as_json["job"], as_json["lead"], as_json["status"], as_json["leaderless_s"]) == (
        None, "beat", 2, 60.0)


def test_the_time_without_a_leader_is_the_gaps_between_terms_and_the_present() -> None:
    # First term began 1000 s ago; the ended ones were held 900 s in all.
    totals = TermTotals(3, ago(1000.0), 900.0)
    # The latest term began 90 s ago and lasts: 1000 - 900 - 90 = 10 s without one.
    held = LeadFigures.of(lead(acquired=90.0), totals)
    assert (held.changes, held.leaderless_total) == (3, 10.0)
    # Its holder stopped renewing 30 s ago: those 30 s count too.
    lapsed = LeadFigures.of(lead(acquired=90.0, expires_in=-30.0), totals)
    assert lapsed.leaderless_total == 40.0 and lapsed.lead.leaderless_for == 30.0
    # Released (its term among the ended): the gaps and the present.
    gone = LeadFigures.of(lead(owner=None, expires_in=-50.0), TermTotals(3, ago(1000.0), 950.0))
    assert gone.leaderless_total == 50.0


def test_the_lead_metrics() -> None:
    text = exposition([], {}, [LeadFigures(lead(expires_in=-2.5), 7, 12.25)])
    samples = [line for line in text.splitlines() if line.startswith("once_lead_")]
    assert samples == [
        'once_lead_term{lead="beat"} 4', 'once_lead_changes_total{lead="beat"} 7',
        'once_lead_leaderless_seconds{lead="beat"} 2.5',
        'once_lead_leaderless_time_seconds_total{lead="beat"} 12.25',
        'once_lead_lease_seconds{lead="beat"} 15', 'once_lead_candidates{lead="beat"} 1']


def test_a_term_not_seen_ending_is_expired_once_nobody_holds_it() -> None:
    terms = [TermRow("beat", 4, "pod-a", 15.0, ago(100.0), None, None),
             TermRow("beat", 3, "pod-b", 15.0, ago(300.0), ago(200.0), "lost")]
    leading = term_entries(terms, lead())
    assert [(e["ended"], e["ended_at"], e["held_s"]) for e in leading] == [
        (None, None, 100.0), ("lost", "2026-12-01T11:56:40+00:00", 100.0)]
    lapsed = term_entries(terms, lead(expires_in=-5.0))
    assert (lapsed[0]["ended"], lapsed[0]["ended_at"], lapsed[0]["held_s"]) == (
        "expired", "2026-12-01T11:59:55+00:00", 95.0)
    retired = term_entries(terms, None)  # the lease's row is gone: its end was not seen
    assert (retired[0]["ended"], retired[0]["ended_at"], retired[0]["held_s"]) == (
        "expired", None, None)

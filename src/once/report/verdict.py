"""once doctor's findings: a Verdict (one line, `SEVERITY <topic> <what>`), the rules' type,
the worst severity, and the findings every dialect's host list shares (once.report.doctor,
once.report.doctor_mysql). Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from once.ledger.server import Facts
from once.report.check import CRITICAL, OK, SEVERITY, WARNING


@dataclass
class Verdict:
    severity: int
    topic: str
    message: str

    @property
    def line(self) -> str:
        return f"{SEVERITY[self.severity]} {self.topic} {self.message}"


def worst(verdicts: list[Verdict]) -> int:
    return max((v.severity for v in verdicts), default=OK)


Rule = Callable[[Facts, int], "Verdict | None"]


def one_ledger(read: list[Facts], named: str) -> Verdict | None:
    """CRITICAL when the hosts read are not all one server or cluster (`identity`, shown
    after `named`)."""
    if len({h["identity"] for h in read}) < 2:
        return None
    seen = "; ".join(f"{h['host']}: {named}{h['identity']}" for h in read)
    return Verdict(CRITICAL, "hosts", f"the URL's hosts are separate servers, not one cluster "
                   f"({seen}): while the first that answers is down, claims go to another "
                   "server's ledger, which has not seen the periods done, and they run again "
                   "(and again on the first when it is back); name one cluster's servers "
                   "only (a primary and its standbys, a Galera cluster's nodes), or a proxy "
                   "that follows the primary")


def hosts_unread(hosts: list[Facts]) -> Verdict | None:
    unread = [h for h in hosts if "error" in h]
    if not unread:
        return None
    why = "; ".join(f"{h['host']}: {h['error']}" for h in unread)
    return Verdict(WARNING, "hosts", f"{len(unread)} of the URL's {len(hosts)} hosts could not "
                   f"be read ({why}): whether they hold this ledger is not checked")


def grants(facts: Facts, _tail: int) -> Verdict | None:
    """What this user may do on once's tables (the server's facts: grants_missing, tables,
    grants_unsure); none before the first `once run` has made them."""
    if not facts.get("tables"):
        return None
    missing = facts.get("grants_missing")
    if missing:
        return Verdict(CRITICAL, "grants", f"this user lacks {missing}: the claims, results "
                       "or leads that write there are refused (exit 75); grant SELECT, INSERT "
                       "and UPDATE on once's tables, and DELETE on once_lead_candidates")
    if facts.get("grants_unsure"):
        return Verdict(WARNING, "grants", "whether this user may write once's tables could "
                       f"not be told ({facts['grants_unsure']})")
    return Verdict(OK, "grants", "this user may read and write once's tables")

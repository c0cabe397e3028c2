"""`once doctor`: can this ledger keep the promise? The server's facts (once.ledger.server)
judged one finding at a time (pure: PostgreSQL's and SQLite's rules here, MySQL's in
once.report.doctor_mysql, the findings' type in once.report.verdict), printed one line each
and as JSON.

Lines are stable, `SEVERITY <topic> <what> (<why>)`, the first two fields without spaces;
the exit status is the worst severity, as for `once check` (0 OK, 1 WARNING, 2 CRITICAL).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict

from once.ledger.server import Facts
from once.report.check import CRITICAL, OK, SEVERITY, WARNING
from once.report.doctor_mysql import MYSQL_RULES
from once.report.verdict import Rule, Verdict, grants, hosts_unread, one_ledger, worst

__all__ = ["Verdict", "judge", "render", "worst"]


def judge(dialect: str, facts: Facts, output_tail: int) -> list[Verdict]:
    """Every finding for the server's facts, in a fixed order."""
    rules = {"postgresql": POSTGRES_RULES, "mysql": MYSQL_RULES, "sqlite": SQLITE_RULES}
    found = [rule(facts, output_tail) for rule in rules[dialect]]
    return [verdict for verdict in found if verdict is not None]


def render(verdicts: list[Verdict], as_json: bool) -> str:
    if as_json:
        return json.dumps({"status": SEVERITY[worst(verdicts)],
                           "findings": [{**asdict(v), "severity": SEVERITY[v.severity]}
                                        for v in verdicts]}, indent=2)
    return "\n".join(v.line for v in sorted(verdicts, key=lambda v: -v.severity))


# -- PostgreSQL -------------------------------------------------------------------------------


def _pg_standby(facts: Facts, _tail: int) -> Verdict:
    if not facts["in_recovery"]:
        return Verdict(OK, "session", "the server is a primary")
    lag = facts.get("replay_lag")  # the reports' rule: 0 while caught up (ledger.fleet)
    behind = "" if lag is None else f", {lag:.0f}s behind its primary"
    return Verdict(CRITICAL, "session", f"the server is a standby (in recovery{behind}): no "
                   "claim can be written here, and reports read what it has replayed; point "
                   "the URL at the primary (target_session_attrs=read-write)")


def _pg_read_only(facts: Facts, _tail: int) -> Verdict | None:
    if facts.get("default_transaction_read_only") != "on" or facts["in_recovery"]:
        return None
    return Verdict(CRITICAL, "session", "default_transaction_read_only = on for this role or "
                   "database: no claim can be written in its sessions; reset it "
                   "(ALTER ROLE ... RESET default_transaction_read_only)")


def _pg_fsync(facts: Facts, _tail: int) -> Verdict:
    if facts["fsync"] != "on":
        return Verdict(CRITICAL, "durability", "fsync = off: a crash of the server can lose or "
                       "corrupt claims already acknowledged (a period may run twice)")
    if facts.get("full_page_writes", "on") != "on":
        return Verdict(WARNING, "durability", "full_page_writes = off: a crash of the machine "
                       "can leave pages half written and the ledger corrupt, unless the "
                       "filesystem never tears a page (ZFS); set it on")
    return Verdict(OK, "durability", "fsync = on")


def _pg_commit(facts: Facts, _tail: int) -> Verdict:
    mode = facts["synchronous_commit"]
    if mode == "off":
        return Verdict(WARNING, "durability", "synchronous_commit = off: a crash of the server "
                       "can lose the last claims it acknowledged (a period may run twice)")
    if facts["standbys"] and mode == "local":
        return Verdict(WARNING, "replication", "synchronous_commit = local: a claim is "
                       "acknowledged before any standby has it, so a failover can lose it")
    return Verdict(OK, "durability", f"synchronous_commit = {mode}")


# The synchronous_commit values whose commits wait for the synchronous standbys.
_WAITS_FOR_STANDBYS = ("on", "remote_write", "remote_apply")


def _pg_replication(facts: Facts, _tail: int) -> Verdict:
    standbys, names = facts["standbys"], (facts["synchronous_standby_names"] or "").strip()
    waiting = _pg_waiting(facts, names)
    if waiting is not None:
        return waiting
    if not standbys:
        return Verdict(OK, "replication", "no standby attached" + (
            f" (synchronous_standby_names = '{names}', but synchronous_commit = "
            f"{facts['synchronous_commit']}: commits do not wait)" if names else ""))
    if not names:
        return Verdict(WARNING, "replication", f"{standbys} standby(s) attached, all "
                       "asynchronous (synchronous_standby_names is empty): a failover can "
                       "lose claims already acknowledged, and their periods may run twice")
    needed, listed = _sync_quorum(names)
    if "*" in names:  # every standby is listed
        listed = max(listed, standbys)
    if listed <= needed:
        return Verdict(WARNING, "replication", f"synchronous_standby_names = '{names}' "
                       f"names no spare: while one of its {listed} standby(s) is down, every "
                       "claim waits (list one more, e.g. ANY 1 (s1, s2))")
    return Verdict(OK, "replication", f"synchronous_standby_names = '{names}' "
                   f"({facts['sync_standbys']} synchronous standby(s) connected)")


def _pg_waiting(facts: Facts, names: str) -> Verdict | None:
    """CRITICAL when the commits wait for more synchronous standbys than are connected: every
    claim waits until the statement's limit, is released and exits 75 (docs/how-to/
    high-availability.md); None when enough are, or commits do not wait."""
    if not names or facts["synchronous_commit"] not in _WAITS_FOR_STANDBYS:
        return None
    if facts.get("hidden_standbys"):
        return Verdict(WARNING, "replication", f"synchronous_standby_names = '{names}', but "
                       "which standbys are synchronous is hidden from this role: not checked "
                       "(grant it pg_read_all_stats)")
    needed, confirming = _sync_quorum(names)[0], facts["sync_standbys"]
    if confirming >= needed:
        return None
    return Verdict(CRITICAL, "replication", f"synchronous_standby_names = '{names}' waits "
                   f"for {needed} synchronous standby(s), {confirming} connected: no claim "
                   "can commit, every fire exits 75 once its statement's limit passes (15s "
                   "by default) and runs nothing; bring the standby back, or name a spare "
                   "(ANY 1 (s1, s2))")


def _sync_quorum(names: str) -> tuple[int, int]:
    """(how many standbys a commit waits for, how many are listed) in a
    synchronous_standby_names value: `s1, s2`, `FIRST 2 (s1, s2, s3)`, `ANY 1 (s1, s2)`."""
    match = re.fullmatch(r"(?:(?:FIRST|ANY)\s+)?(\d+)\s*\((.*)\)", names, re.IGNORECASE)
    if match:
        return int(match.group(1)), len([n for n in match.group(2).split(",") if n.strip()])
    return 1, len([n for n in names.split(",") if n.strip()])


def _pg_hosts(facts: Facts, _tail: int) -> Verdict | None:
    """A host list's servers: one cluster (one system_identifier), one primary."""
    hosts = facts.get("hosts")
    if not hosts:
        return None
    read = [h for h in hosts if "error" not in h]
    found = one_ledger(read, "system_identifier ")
    if found is not None:
        return found
    primaries = {h["server"] for h in read if not h["in_recovery"]}
    if len(primaries) > 1:
        names = ", ".join(h["host"] for h in read if not h["in_recovery"])
        return Verdict(CRITICAL, "hosts", f"{names} are primaries of one cluster (split "
                       "brain: an old primary back as a primary?): each takes claims of its "
                       "own, and a period done on one runs again on the other")
    idle = [h["host"] for h in read if h["in_recovery"] and not h.get("receiving", True)]
    if idle:
        return Verdict(WARNING, "hosts", f"{', '.join(idle)}: a standby that streams from no "
                       "server (no WAL receiver): promoted, it lacks what the primary wrote "
                       "since it stopped, and those periods run again")
    return hosts_unread(hosts) or Verdict(
        OK, "hosts", f"{len(hosts)} hosts, one cluster (system_identifier "
        f"{read[0]['identity']}): {len(primaries)} primary, the rest its standbys")


POSTGRES_RULES: list[Rule] = [_pg_standby, _pg_read_only, grants, _pg_fsync, _pg_commit,
                              _pg_replication, _pg_hosts]

# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_file(facts: Facts, _tail: int) -> Verdict:
    if facts["exists"]:
        return Verdict(OK, "ledger", "the SQLite file exists")
    return Verdict(OK, "ledger", "no SQLite file yet: the first once run creates it")


def _sqlite_writable(facts: Facts, _tail: int) -> Verdict | None:
    if facts.get("writable", True):
        return None
    return Verdict(CRITICAL, "ledger", f"this user may not write the SQLite file or its "
                   f"directory ({facts.get('directory')}), where the journal's files go: its "
                   "claims exit 75; run once as the ledger's owner")


def _sqlite_filesystem(facts: Facts, _tail: int) -> Verdict:
    from once.ledger.schema import NETWORK_FILESYSTEMS, VOLATILE_FILESYSTEMS

    fstype = facts["filesystem"]
    if fstype in NETWORK_FILESYSTEMS:
        return Verdict(CRITICAL, "filesystem", f"the SQLite file is on {fstype}, a network "
                       "filesystem whose locks SQLite cannot trust: two hosts can both claim "
                       "a period; use PostgreSQL or MySQL for a fleet")
    if fstype in VOLATILE_FILESYSTEMS:
        return Verdict(CRITICAL, "filesystem", f"the SQLite file is on {fstype} (memory: "
                       f"{facts.get('directory')}): a reboot empties it, and every period "
                       "done runs again; put the ledger on a disk")
    if fstype == "overlay":
        return Verdict(WARNING, "filesystem", "the SQLite file is in a container's own layer "
                       "(overlay): a new container starts with an empty ledger and runs "
                       "every period again; put it on a volume")
    if not fstype:
        return Verdict(WARNING, "filesystem", "the filesystem that holds the SQLite file "
                       "could not be told (no /proc/self/mountinfo): a network or memory "
                       "filesystem is not ruled out")
    return Verdict(OK, "filesystem", f"local filesystem ({fstype}): one host's ledger")


def _sqlite_journal(facts: Facts, _tail: int) -> Verdict | None:
    mode = facts.get("journal_mode")
    if mode is None or mode == "wal":
        return None if mode is None else Verdict(OK, "journal", "journal_mode = wal")
    return Verdict(WARNING, "journal", f"journal_mode = {mode}: readers and claims block one "
                   "another; `once schema` sets WAL")


SQLITE_RULES: list[Rule] = [_sqlite_file, _sqlite_writable, _sqlite_filesystem,
                            _sqlite_journal]

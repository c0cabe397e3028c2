"""`once doctor`: can this ledger keep the promise? The server's facts (once.ledger.server)
judged one finding at a time (pure), printed one line each and as JSON.

Lines are stable, `SEVERITY <topic> <what> (<why>)`, the first two fields without spaces;
the exit status is the worst severity, as for `once check` (0 OK, 1 WARNING, 2 CRITICAL).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from once.ledger.server import Facts
from once.report.check import CRITICAL, OK, SEVERITY, WARNING

# What a stored output tail may take of a packet beyond its bytes: the statement, the other
# values, and UTF-8's replacement characters for bytes that are not (up to three bytes each).
PACKET_HEADROOM = 64 * 1024


@dataclass
class Verdict:
    severity: int
    topic: str
    message: str

    @property
    def line(self) -> str:
        return f"{SEVERITY[self.severity]} {self.topic} {self.message}"


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


def worst(verdicts: list[Verdict]) -> int:
    return max((v.severity for v in verdicts), default=OK)


Rule = Callable[[Facts, int], "Verdict | None"]

# -- PostgreSQL -------------------------------------------------------------------------------


def _pg_standby(facts: Facts, _tail: int) -> Verdict:
    if not facts["in_recovery"]:
        return Verdict(OK, "session", "the server is a primary")
    lag = facts.get("replay_lag")
    behind = "" if lag is None else f", {lag:.0f}s behind its primary"
    return Verdict(CRITICAL, "session", f"the server is a standby (in recovery{behind}): no "
                   "claim can be written here, and reports read what it has replayed; point "
                   "the URL at the primary (target_session_attrs=read-write)")


def _pg_fsync(facts: Facts, _tail: int) -> Verdict:
    if facts["fsync"] == "on":
        return Verdict(OK, "durability", "fsync = on")
    return Verdict(CRITICAL, "durability", "fsync = off: a crash of the server can lose or "
                   "corrupt claims already acknowledged (a period may run twice)")


def _pg_commit(facts: Facts, _tail: int) -> Verdict:
    mode = facts["synchronous_commit"]
    if mode == "off":
        return Verdict(WARNING, "durability", "synchronous_commit = off: a crash of the server "
                       "can lose the last claims it acknowledged (a period may run twice)")
    if facts["standbys"] and mode == "local":
        return Verdict(WARNING, "replication", "synchronous_commit = local: a claim is "
                       "acknowledged before any standby has it, so a failover can lose it")
    return Verdict(OK, "durability", f"synchronous_commit = {mode}")


def _pg_replication(facts: Facts, _tail: int) -> Verdict:
    standbys, names = facts["standbys"], (facts["synchronous_standby_names"] or "").strip()
    if not standbys:
        return Verdict(OK, "replication", "no standby attached")
    if not names:
        return Verdict(WARNING, "replication", f"{standbys} standby(s) attached, all "
                       "asynchronous (synchronous_standby_names is empty): a failover can "
                       "lose claims already acknowledged, and their periods may run twice")
    needed, listed = _sync_quorum(names)
    if listed <= needed:
        return Verdict(WARNING, "replication", f"synchronous_standby_names = '{names}' "
                       f"names no spare: while one of its {listed} standby(s) is down, every "
                       "claim waits (list one more, e.g. ANY 1 (s1, s2))")
    return Verdict(OK, "replication", f"synchronous_standby_names = '{names}' "
                   f"({facts['sync_standbys']} synchronous standby(s) connected)")


def _sync_quorum(names: str) -> tuple[int, int]:
    """(how many standbys a commit waits for, how many are listed) in a
    synchronous_standby_names value: `s1, s2`, `FIRST 2 (s1, s2, s3)`, `ANY 1 (s1, s2)`."""
    match = re.fullmatch(r"(?:(?:FIRST|ANY)\s+)?(\d+)\s*\((.*)\)", names, re.IGNORECASE)
    if match:
        return int(match.group(1)), len([n for n in match.group(2).split(",") if n.strip()])
    return 1, len([n for n in names.split(",") if n.strip()])


POSTGRES_RULES: list[Rule] = [_pg_standby, _pg_fsync, _pg_commit, _pg_replication]

# -- MySQL / MariaDB -------------------------------------------------------------------------


def _my_read_only(facts: Facts, _tail: int) -> Verdict:
    if not int(facts["read_only"] or 0):
        return Verdict(OK, "session", "the server accepts writes")
    return Verdict(CRITICAL, "session", "the server is read-only (read_only = ON: a replica?): "
                   "no claim can be written here; point the URL at the primary")


def _my_flush(facts: Facts, _tail: int) -> Verdict:
    value = int(facts["innodb_flush_log_at_trx_commit"])
    if value == 1:
        return Verdict(OK, "durability", "innodb_flush_log_at_trx_commit = 1")
    return Verdict(WARNING, "durability", f"innodb_flush_log_at_trx_commit = {value}: a crash "
                   "can lose about a second of acknowledged claims (a period may run twice); "
                   "set it to 1")


def _my_binlog(facts: Facts, _tail: int) -> Verdict | None:
    if not int(facts["log_bin"] or 0) or int(facts["wsrep_on"] or 0):
        return None
    value = int(facts["sync_binlog"])
    if value == 1:
        return Verdict(OK, "replication", "sync_binlog = 1")
    return Verdict(WARNING, "replication", f"sync_binlog = {value} with the binary log on: a "
                   "crash can lose claims its replicas never get; set it to 1")


def _my_galera(facts: Facts, _tail: int) -> Verdict | None:
    if not int(facts["wsrep_on"] or 0):
        return None
    status, ready = facts.get("wsrep_cluster_status"), facts.get("wsrep_ready")
    if status != "Primary" or ready != "ON":
        return Verdict(CRITICAL, "galera", f"the node is not in a Primary component "
                       f"(wsrep_cluster_status = {status}, wsrep_ready = {ready}): claims "
                       "are refused here; point the URL at a healthy node or a proxy")
    size = facts.get("wsrep_cluster_size")
    return Verdict(OK, "galera", f"node of a Primary component of {size} node(s)")


def _my_sync_wait(facts: Facts, _tail: int) -> Verdict | None:
    if not int(facts["wsrep_on"] or 0):
        return None
    if int(facts["wsrep_sync_wait"] or 0) & 1:
        return Verdict(OK, "galera", f"wsrep_sync_wait = {facts['wsrep_sync_wait']}")
    return Verdict(WARNING, "galera", "wsrep_sync_wait = 0: once status and once check may "
                   "read a node that has not applied the others' latest claims (claims "
                   "themselves are certified); set it to 1 for the reports' user")


def _my_packet(facts: Facts, output_tail: int) -> Verdict:
    packet = int(facts["max_allowed_packet"])
    needed = 3 * output_tail + PACKET_HEADROOM
    if packet >= needed:
        return Verdict(OK, "limits", f"max_allowed_packet = {packet} holds an --output-tail "
                       f"of {output_tail} bytes")
    return Verdict(WARNING, "limits", f"max_allowed_packet = {packet} is below {needed}, what "
                   f"an --output-tail of {output_tail} bytes can take: such a tail is cut to "
                   "fit when it is stored")


MYSQL_RULES: list[Rule] = [_my_read_only, _my_flush, _my_binlog, _my_galera, _my_sync_wait,
                           _my_packet]

# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_file(facts: Facts, _tail: int) -> Verdict:
    if facts["exists"]:
        return Verdict(OK, "ledger", "the SQLite file exists")
    return Verdict(OK, "ledger", "no SQLite file yet: the first once run creates it")


def _sqlite_filesystem(facts: Facts, _tail: int) -> Verdict:
    from once.ledger.schema import NETWORK_FILESYSTEMS

    fstype = facts["filesystem"] or "unknown"
    if fstype in NETWORK_FILESYSTEMS:
        return Verdict(CRITICAL, "filesystem", f"the SQLite file is on {fstype}, a network "
                       "filesystem whose locks SQLite cannot trust: two hosts can both claim "
                       "a period; use PostgreSQL or MySQL for a fleet")
    return Verdict(OK, "filesystem", f"local filesystem ({fstype}): one host's ledger")


def _sqlite_journal(facts: Facts, _tail: int) -> Verdict | None:
    mode = facts.get("journal_mode")
    if mode is None or mode == "wal":
        return None if mode is None else Verdict(OK, "journal", "journal_mode = wal")
    return Verdict(WARNING, "journal", f"journal_mode = {mode}: readers and claims block one "
                   "another; `once schema` sets WAL")


SQLITE_RULES: list[Rule] = [_sqlite_file, _sqlite_filesystem, _sqlite_journal]

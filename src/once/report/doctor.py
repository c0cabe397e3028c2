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
from typing import Any

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
    found = _one_ledger(read, "system_identifier ")
    if found is not None:
        return found
    primaries = {h["server"] for h in read if not h["in_recovery"]}
    if len(primaries) > 1:
        names = ", ".join(h["host"] for h in read if not h["in_recovery"])
        return Verdict(CRITICAL, "hosts", f"{names} are primaries of one cluster (split "
                       "brain: an old primary back as a primary?): each takes claims of its "
                       "own, and a period done on one runs again on the other")
    return _hosts_unread(hosts) or Verdict(
        OK, "hosts", f"{len(hosts)} hosts, one cluster (system_identifier "
        f"{read[0]['identity']}): {len(primaries)} primary, the rest its standbys")


def _one_ledger(read: list[Facts], named: str) -> Verdict | None:
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


def _hosts_unread(hosts: list[Facts]) -> Verdict | None:
    unread = [h for h in hosts if "error" in h]
    if not unread:
        return None
    why = "; ".join(f"{h['host']}: {h['error']}" for h in unread)
    return Verdict(WARNING, "hosts", f"{len(unread)} of the URL's {len(hosts)} hosts could not "
                   f"be read ({why}): whether they hold this ledger is not checked")


POSTGRES_RULES: list[Rule] = [_pg_standby, _pg_read_only, _pg_fsync, _pg_commit,
                              _pg_replication, _pg_hosts]

# -- MySQL / MariaDB -------------------------------------------------------------------------


# What makes a MySQL session read-only, server-wide or for every new session.
_READ_ONLY = ("read_only", "super_read_only", "tx_read_only", "transaction_read_only")


def _my_read_only(facts: Facts, _tail: int) -> Verdict:
    if facts.get("offline_mode"):
        return Verdict(CRITICAL, "session", "offline_mode = ON: the server turns away every "
                       "connection of a user without SUPER or CONNECTION_ADMIN; claims exit 75")
    which = next((name for name in _READ_ONLY if facts.get(name)), None)
    if which is None:
        return Verdict(OK, "session", "the server accepts writes")
    refused = facts.get("writes_refused")
    if refused and which not in ("read_only", "super_read_only"):
        return Verdict(CRITICAL, "session", f"{which} = ON: every session begins read-only, "
                       "no claim can be written; set it OFF")
    if refused:
        return Verdict(CRITICAL, "session", "the server is read-only (read_only = ON: a "
                       "replica?): no claim can be written here; point the URL at the primary")
    if refused is None:
        return Verdict(WARNING, "session", "the server is read-only (read_only = ON), and "
                       "whether this user may write through it (SUPER, READ_ONLY ADMIN) could "
                       "not be told: claims may be refused here")
    return Verdict(WARNING, "session", "read_only = ON, but this user may write through it "
                   "(SUPER or READ_ONLY ADMIN): its claims are written here, another user's "
                   "are refused; is this the primary? (see replication)")


def _my_replica(facts: Facts, _tail: int) -> Verdict:
    """The session's server replicates from another: claims written here are not the
    primary's, and the primary's never come here (or overwrite these when they do)."""
    sources = facts.get("replica_of")
    if sources is None:
        return _my_replica_unknown(facts)
    running = [s for s in sources if _yes(s, "IO_Running") or _yes(s, "SQL_Running")]
    if running:
        return Verdict(CRITICAL, "session", f"the server is a replica of "
                       f"{_sources(running)}: claims written here are not on its primary, "
                       "where the same periods are claimed and run again; point the URL at "
                       "the primary")
    if sources:
        return Verdict(WARNING, "session", f"replication from {_sources(sources)} is set up "
                       "but stopped: if this server was promoted, remove it (RESET REPLICA "
                       "ALL); if it is still a replica, claims here are not its primary's")
    return Verdict(OK, "session", "the server replicates from no other")


def _my_replica_unknown(facts: Facts) -> Verdict:
    """SHOW REPLICA STATUS refused: MariaDB's Slaves_running still says whether it applies
    another server's changes now."""
    running = facts.get("slaves_running")
    if running:
        return Verdict(CRITICAL, "session", f"the server is a replica ({running} replication "
                       "thread(s) running): claims written here are not on its primary; point "
                       "the URL at the primary")
    if running == 0 and not facts.get("gtid_slave_pos"):
        return Verdict(OK, "session", "the server replicates from no other")
    return Verdict(WARNING, "session", "whether the server is a replica could not be told "
                   "(SHOW REPLICA STATUS refused: grant REPLICA MONITOR, or REPLICATION "
                   "CLIENT on MySQL); a replica's claims are not on its primary")


def _yes(status: dict[str, Any], thread: str) -> bool:
    value = status.get(f"Slave_{thread}") or status.get(f"Replica_{thread}")
    return str(value).lower() in ("yes", "connecting")


def _sources(sources: list[dict[str, Any]]) -> str:
    def one(s: dict[str, Any]) -> str:
        host = s.get("Master_Host") or s.get("Source_Host")
        port = s.get("Master_Port") or s.get("Source_Port")
        behind = s.get("Seconds_Behind_Master", s.get("Seconds_Behind_Source"))
        lag = "" if behind is None else f", {behind}s behind"
        return f"{host}:{port} (IO {_state(s, 'IO_Running')}, SQL {_state(s, 'SQL_Running')}" \
               f"{lag})"

    return ", ".join(one(s) for s in sources)


def _state(status: dict[str, Any], thread: str) -> str:
    return str(status.get(f"Slave_{thread}") or status.get(f"Replica_{thread}") or "?")


def _my_flush(facts: Facts, _tail: int) -> Verdict:
    value = int(facts["innodb_flush_log_at_trx_commit"])
    if value == 1 and facts.get("innodb_doublewrite", 1) == 0:
        return Verdict(WARNING, "durability", "innodb_doublewrite = OFF: a crash of the "
                       "machine can leave pages half written and the ledger corrupt, unless "
                       "the filesystem never tears a page; set it ON")
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


def _my_replicas(facts: Facts, _tail: int) -> Verdict | None:
    """The replicas this server feeds: a failover to an asynchronous one loses the claims it
    had not received (as a PostgreSQL standby's); semi-synchronous replication with the
    AFTER_SYNC wait point acknowledges a claim only once a replica has it."""
    if not int(facts["log_bin"] or 0):
        return None  # no binary log, no replica
    replicas = facts.get("replicas")
    prefix = facts.get("semi_sync_prefix") or "rpl_semi_sync_master"
    enabled, status = facts.get("semi_sync_enabled"), str(facts.get("semi_sync_status")).upper()
    if replicas is None:
        return Verdict(WARNING, "replication", "the binary log is on, and whether replicas "
                       "are attached could not be told (SHOW REPLICAS refused: grant "
                       "REPLICATION MASTER ADMIN, or REPLICATION SLAVE on MySQL): a failover "
                       "to an asynchronous one can lose acknowledged claims")
    if enabled and status != "ON":
        return Verdict(WARNING, "replication", f"{prefix}_enabled = ON, but "
                       f"{_status(prefix)} = {status}: no replica acknowledged within "
                       f"{prefix}_timeout = {facts.get('semi_sync_timeout')} ms, and the "
                       "primary went on asynchronously: a failover now can lose claims "
                       f"already acknowledged ({len(replicas)} replica(s) attached)")
    if not replicas:
        return Verdict(OK, "replication", "no replica attached")
    listed = ", ".join(f"{r.get('Host') or '?'}:{r.get('Port')}" for r in replicas)
    return _my_semi_sync(facts, prefix, f"{len(replicas)} replica(s) attached ({listed})")


# The longest once waits for a statement's answer (once.deadlines.statement_timeout).
_LONGEST_STATEMENT_MS = 10_000


def _my_semi_sync(facts: Facts, prefix: str, attached: str) -> Verdict:
    enabled, clients = facts.get("semi_sync_enabled"), facts.get("semi_sync_clients") or 0
    wait_point = str(facts.get("semi_sync_wait_point")).upper()
    timeout = int(facts.get("semi_sync_timeout") or 0)
    if not (enabled and clients):
        return Verdict(WARNING, "replication", f"{attached}, asynchronous ({prefix}_enabled "
                       f"= {'ON' if enabled else 'OFF'}, {_status(prefix)} = "
                       f"{facts.get('semi_sync_status')}): a failover to one can lose claims "
                       "already acknowledged, and their periods may run twice; set "
                       f"{prefix}_enabled = ON, {prefix}_wait_point = AFTER_SYNC")
    if wait_point != "AFTER_SYNC":
        return Verdict(WARNING, "replication", f"{attached}, semi-synchronous with "
                       f"{prefix}_wait_point = {wait_point}: other sessions see a claim or a "
                       "result before a replica has it, and a failover can lose one they "
                       "acted on; set it to AFTER_SYNC")
    if timeout >= _LONGEST_STATEMENT_MS:
        return Verdict(WARNING, "replication", f"{attached}, semi-synchronous (AFTER_SYNC), "
                       f"but {prefix}_timeout = {timeout} ms: while no replica acknowledges, "
                       "a claim's commit waits longer than once waits for its answer "
                       "(--stale-after/3, at most 10 s), so it exits 75 with its claim "
                       "committed, which holds the period until --stale-after; set it "
                       "lower (e.g. 2000)")
    return Verdict(OK, "replication", f"{attached}, semi-synchronous ({prefix}_wait_point = "
                   f"AFTER_SYNC, {clients} acknowledging); it turns asynchronous after "
                   f"{prefix}_timeout = {timeout} ms without an acknowledgement")


def _status(prefix: str) -> str:
    """The status variable of a semi-synchronous prefix: Rpl_semi_sync_master_status."""
    return f"R{prefix[1:]}_status"


def _my_galera(facts: Facts, _tail: int) -> Verdict | None:
    if not int(facts["wsrep_on"] or 0):
        return None
    status, ready = facts.get("wsrep_cluster_status"), facts.get("wsrep_ready")
    if status != "Primary" or ready != "ON":
        return Verdict(CRITICAL, "galera", f"the node is not in a Primary component "
                       f"(wsrep_cluster_status = {status}, wsrep_ready = {ready}): claims "
                       "are refused here; point the URL at a healthy node or a proxy")
    rejected = str(facts.get("wsrep_reject_queries") or "NONE").upper()
    if rejected != "NONE":
        return Verdict(CRITICAL, "galera", f"wsrep_reject_queries = {rejected}: the node "
                       "answers every query with 1047, claims are refused here; set it NONE, "
                       "or point the URL at another node")
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


def _my_hosts(facts: Facts, _tail: int) -> Verdict | None:
    """A host list's servers: the nodes of one Galera cluster. A list is tried in order, so a
    server of its own after the first is written to while the first is down, and the first
    again when it is back: two ledgers, whatever replicates between them."""
    hosts = facts.get("hosts")
    if not hosts:
        return None
    read = [h for h in hosts if "error" not in h]
    first = read[0]["identity"] if read else None
    others = [h for h in read if h["identity"] != first]
    writable = [h for h in others if not h.get("writes_refused")]
    if writable:
        return _one_ledger(read, "")
    if others:
        names = ", ".join(f"{h['host']} ({h['server']})" for h in others)
        return Verdict(WARNING, "hosts", f"{names}: not {read[0]['host']}'s server or cluster, "
                       "and read-only for this user: while the first is down, claims there "
                       "exit 75 (a host list does not fail MySQL replication over)")
    return _hosts_unread(hosts) or _hosts_not_ready(read) or Verdict(
        OK, "hosts", f"{len(hosts)} hosts, one server or cluster ({first})")


def _hosts_not_ready(read: list[Facts]) -> Verdict | None:
    """Galera nodes outside the Primary component: a host list passes over a node that is
    down, not over one that answers 1047 to every statement."""
    unready = [h["host"] for h in read if h.get("not_ready")]
    if not unready:
        return None
    return Verdict(WARNING, "hosts", f"{', '.join(unready)} outside the Primary component: "
                   "the host list does not pass over it, so claims exit 75 while it is the "
                   "first that answers")


MYSQL_RULES: list[Rule] = [_my_read_only, _my_replica, _my_flush, _my_binlog, _my_replicas,
                           _my_galera, _my_sync_wait, _my_packet, _my_hosts]

# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_file(facts: Facts, _tail: int) -> Verdict:
    if facts["exists"]:
        return Verdict(OK, "ledger", "the SQLite file exists")
    return Verdict(OK, "ledger", "no SQLite file yet: the first once run creates it")


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


SQLITE_RULES: list[Rule] = [_sqlite_file, _sqlite_filesystem, _sqlite_journal]

"""once doctor's rules for MySQL and MariaDB (once.ledger.server_mysql's facts): the session
(read-only, a replica, offline), durability, replication (the binary log, the replicas fed
and whether they acknowledge), Galera, the packet limit, a host list. Pure.
"""

from __future__ import annotations

from typing import Any

from once.ledger.server import Facts
from once.report.check import CRITICAL, OK, WARNING
from once.report.verdict import Rule, Verdict, grants, hosts_unread, one_ledger

# What a stored output tail may take of a packet beyond its bytes: the statement, the other
# values, and UTF-8's replacement characters for bytes that are not (up to three bytes each).
PACKET_HEADROOM = 64 * 1024


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
        return one_ledger(read, "")
    if others:
        names = ", ".join(f"{h['host']} ({h['server']})" for h in others)
        return Verdict(WARNING, "hosts", f"{names}: not {read[0]['host']}'s server or cluster, "
                       "and read-only for this user: while the first is down, claims there "
                       "exit 75 (a host list does not fail MySQL replication over)")
    return hosts_unread(hosts) or _hosts_not_ready(read) or Verdict(
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


MYSQL_RULES: list[Rule] = [_my_read_only, grants, _my_replica, _my_flush, _my_binlog, _my_replicas,
                           _my_galera, _my_sync_wait, _my_packet, _my_hosts]

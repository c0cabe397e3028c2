"""What a MySQL or MariaDB server says of itself, for `once doctor` (once.ledger.server reads
it on a connection of its own): its settings and status by SHOW (which a Galera node outside
the Primary component still answers, where it refuses every SELECT), whether it replicates
from another server (SHOW REPLICA STATUS), which replicas it feeds (SHOW REPLICAS) and how
(semi-synchronous replication's variables), and whether read_only keeps this user from
writing (a write that changes nothing, rolled back: SUPER or READ_ONLY ADMIN write through
read_only, and which privilege does on which version is the server's to say).

Imports only once.ledger's url and records; PyMySQL's connection comes from the caller.
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any

from once.ledger.records import describe, error_code
from once.ledger.url import Target

if TYPE_CHECKING:
    from once.ledger.dbapi import Connection, Cursor

Facts = dict[str, Any]

VARIABLES = ("innodb_flush_log_at_trx_commit", "innodb_doublewrite", "sync_binlog", "log_bin",
             "read_only", "super_read_only", "tx_read_only", "transaction_read_only",
             "offline_mode", "max_allowed_packet", "wsrep_on", "wsrep_sync_wait",
             "wsrep_reject_queries",
             "server_id", "server_uuid", "hostname", "port", "version", "gtid_slave_pos",
             # semi-synchronous replication: MariaDB's and MySQL's before 8.0.26 (master),
             # MySQL's since (source)
             *(f"rpl_semi_sync_{side}_{name}" for side in ("master", "source")
               for name in ("enabled", "wait_point", "timeout")))
STATUS = ("wsrep_cluster_status", "wsrep_ready", "wsrep_cluster_size",
          "wsrep_cluster_state_uuid", "Slaves_running",
          *(f"Rpl_semi_sync_{side}_{name}" for side in ("master", "source")
            for name in ("status", "clients")))
# Numbers and ON/OFF switches, read as whole numbers (ON 1, OFF 0).
NUMBERS = {"innodb_flush_log_at_trx_commit", "innodb_doublewrite", "sync_binlog", "log_bin",
           "read_only", "super_read_only", "tx_read_only", "transaction_read_only",
           "offline_mode", "max_allowed_packet", "wsrep_on", "wsrep_sync_wait", "server_id",
           "port", "slaves_running", "semi_sync_enabled", "semi_sync_timeout",
           "semi_sync_clients"}

# Which servers this one replicates from (MariaDB's every connection; MySQL 8.0.22's words;
# the older ones), and which replicas it feeds: the first the server knows (1064: not its
# words), a refusal (no REPLICA MONITOR, REPLICATION CLIENT, REPLICATION MASTER ADMIN) None.
REPLICA_STATUS = ("SHOW ALL SLAVES STATUS", "SHOW REPLICA STATUS", "SHOW SLAVE STATUS")
REPLICAS = ("SHOW REPLICAS", "SHOW REPLICA HOSTS", "SHOW SLAVE HOSTS")
_NOT_ITS_WORDS = 1064

# A write that changes nothing, to learn whether read_only refuses this user's writes.
WRITE_PROBE = "DELETE FROM once_meta WHERE 1 = 0"
# --read-only (or super_read_only) prevents it; MariaDB's; a read-only transaction
_READ_ONLY_CODES = {1290, 1836, 1792}
_PAST_READ_ONLY = {1146, 1142}  # no such table, no DELETE grant: checked after read_only


def mysql_facts(conn: Connection) -> Facts:
    """The server's facts: its variables and status (lower-case names), replica_of (the
    servers it replicates from, None: cannot tell), replicas (those it feeds, None: cannot
    tell) and writes_refused (read_only keeps this user out; None: cannot tell)."""
    cur = conn.cursor()
    facts = _settings(cur)
    facts["replica_of"] = _rows(cur, REPLICA_STATUS)
    facts["replicas"] = _rows(cur, REPLICAS) if facts.get("log_bin") else []
    facts["writes_refused"] = _writes_refused(cur) if _read_only(facts) else False
    return facts


def mysql_identity(conn: Connection) -> Facts:
    """Who the server is, for a host list: its Galera cluster (the state UUID every node of
    one cluster shares), else the server itself (MySQL's server_uuid; MariaDB has none: its
    server_id, host name and port), and whether this user may write there."""
    cur = conn.cursor()
    facts = _settings(cur)
    server = facts.get("server_uuid") or (f"server_id {facts.get('server_id')} on "
                                          f"{facts.get('hostname')}:{facts.get('port')}")
    galera = facts.get("wsrep_on") and facts.get("wsrep_cluster_state_uuid")
    refused = _writes_refused(cur) if _read_only(facts) else False
    return {"identity": f"Galera cluster {galera}" if galera else server, "server": server,
            "writes_refused": refused,
            "not_ready": bool(galera) and (facts.get("wsrep_cluster_status") != "Primary"
                                           or facts.get("wsrep_ready") != "ON")}


def mysql_hosts(target: Target) -> list[tuple[str, Target]]:
    """Each host of a MySQL URL's list, a target of one host."""
    if len(target.hosts) < 2:
        return []
    found = []
    for host, port in target.hosts:
        label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        found.append((label, Target(target.backend, target.url, label,
                                    {**target.connect_args, "host": host, "port": port},
                                    hosts=((host, port),))))
    return found


def _settings(cur: Cursor) -> Facts:
    facts: Facts = {}
    for show, names in (("SHOW VARIABLES", VARIABLES), ("SHOW GLOBAL STATUS", STATUS)):
        listed = ", ".join(f"'{name}'" for name in names)
        cur.execute(f"{show} WHERE Variable_name IN ({listed})")
        facts.update({str(name).lower(): value for name, value in cur.fetchall()})
    side = "source" if "rpl_semi_sync_source_enabled" in facts else "master"
    for name in ("enabled", "wait_point", "timeout", "status", "clients"):
        facts[f"semi_sync_{name}"] = facts.pop(f"rpl_semi_sync_{side}_{name}", None)
    facts["semi_sync_prefix"] = f"rpl_semi_sync_{side}"
    facts.setdefault("wsrep_on", 0)  # MySQL has no such variable
    return {name: _number(value) if name in NUMBERS else value for name, value in facts.items()}


def _number(value: Any) -> Any:
    text = str(value).strip().upper()
    if text in ("ON", "OFF"):
        return int(text == "ON")
    return int(text) if text.isdigit() else value


def _read_only(facts: Facts) -> bool:
    return any(facts.get(name) for name in ("read_only", "super_read_only", "tx_read_only",
                                            "transaction_read_only"))


def _rows(cur: Cursor, statements: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """The rows of the first statement the server knows, each by its column names; None
    when it refuses them (a privilege) or knows none."""
    for sql in statements:
        try:
            cur.execute(sql)
        except Exception as exc:
            if error_code(exc) == _NOT_ITS_WORDS:
                continue
            return None
        names = [str(d[0]) for d in getattr(cur, "description", None) or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    return None


# A statement of each kind a grant allows, on a table of once's, that changes nothing; a
# refusal by these codes is the grant missing (1142 a table's, 1143 a column's).
_PROBES = {"SELECT": "SELECT 1 FROM {t} WHERE 1 = 0",
           "INSERT": "INSERT INTO {t} SELECT * FROM {t} WHERE 1 = 0",
           "UPDATE": "UPDATE {t} SET {every} WHERE 1 = 0",  # `c` = `c`, each column
           "DELETE": "DELETE FROM {t} WHERE 1 = 0"}
_DENIED, _COLUMN_DENIED = 1142, 1143  # a table's grant missing; some column's
_NO_TABLE = 1146


def mysql_grants(conn: Connection, needed: dict[str, tuple[str, ...]]) -> Facts:
    """The grants (`needed`, by table) this user lacks on once's tables that are there
    (grants_missing: `INSERT on once_runs, ...`, None for none; grants_unsure: why it could
    not be told, a statement that failed otherwise, as a read-only server's refusal or a
    lock another session holds), learnt from statements that change nothing, rolled back
    (MySQL has no has_table_privilege); and how many are there."""
    cur = conn.cursor()
    listed = ", ".join(f"'{table}'" for table in needed)
    with suppress(Exception):  # a table another session locked: a second's wait, not ten
        cur.execute("SET SESSION lock_wait_timeout = 1, innodb_lock_wait_timeout = 1, "
                    "group_concat_max_len = 65536")
    try:
        cur.execute("SELECT table_name, GROUP_CONCAT(CONCAT('`', column_name, '` = `', "
                    "column_name, '`')) FROM information_schema.columns WHERE table_schema = "
                    f"DATABASE() AND table_name IN ({listed}) GROUP BY table_name")
    except Exception:  # a Galera node not ready, say: the session's findings say so
        return {"grants_missing": None, "tables": 0, "grants_unsure": ""}
    tables = {str(table): str(every) for table, every in cur.fetchall()}
    missing, partial, unsure = [], [], ""
    try:
        cur.execute("START TRANSACTION")
        for table in sorted(needed) if tables else ():
            # A table with no grant at all is not listed: its SELECT says whether it is there.
            every = tables.get(table)
            for grant in needed[table] if every else ("SELECT",):
                try:
                    cur.execute(_PROBES[grant].format(t=f"`{table}`", every=every))
                except Exception as exc:
                    if error_code(exc) == _NO_TABLE and not every:
                        break
                    if error_code(exc) == _COLUMN_DENIED:  # some columns': enough?
                        partial.append(f"{grant} on {table}")
                        continue
                    if error_code(exc) != _DENIED:
                        raise
                    missing += [f"{each} on {table}" for each in (
                        (grant,) if every else needed[table])]
        if partial:
            unsure = f"granted on some columns alone: {', '.join(partial)}"
    except Exception as exc:
        unsure = f"a test write failed: {describe(exc)}"
    finally:
        with suppress(Exception):  # a connection the failure closed rolled back with it
            cur.execute("ROLLBACK")
    return {"grants_missing": ", ".join(missing) or None, "tables": len(tables),
            "grants_unsure": unsure}


def _writes_refused(cur: Cursor) -> bool | None:
    """Whether read_only refuses this user's writes (WRITE_PROBE, rolled back); None when
    the server's answer does not say."""
    try:
        cur.execute("START TRANSACTION")
        try:
            cur.execute(WRITE_PROBE)
        finally:
            cur.execute("ROLLBACK")
    except Exception as exc:
        code = error_code(exc)
        if code in _READ_ONLY_CODES:
            return True
        return False if code in _PAST_READ_ONLY else None
    return False

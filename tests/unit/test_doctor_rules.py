"""once doctor's rules over the facts a server reports (pure: no database), and once check's
line for a server that cannot answer for the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from once.ledger import LedgerError
from once.ledger.errors import not_ready
from once.report.check import CRITICAL, OK, UNKNOWN, WARNING
from once.report.check import not_ready as not_ready_finding
from once.report.doctor import _sync_quorum, judge, render, worst

PRIMARY = {"in_recovery": False, "synchronous_commit": "on", "synchronous_standby_names": "",
           "fsync": "on", "default_transaction_read_only": "off", "standbys": 0,
           "sync_standbys": 0, "hidden_standbys": 0, "replay_lag": None}
MARIADB = {"innodb_flush_log_at_trx_commit": 1, "sync_binlog": 0, "log_bin": 0,
           "read_only": 0, "max_allowed_packet": 16 * 2**20, "wsrep_on": 0, "replica_of": [],
           "replicas": [], "writes_refused": False}
GALERA = {**MARIADB, "wsrep_on": 1, "wsrep_sync_wait": 1, "wsrep_cluster_status": "Primary",
          "wsrep_ready": "ON", "wsrep_cluster_size": "3"}


def _lines(dialect: str, facts: dict, tail: int = 16384) -> list[str]:
    return [v.line for v in judge(dialect, facts, tail)]


def _worst(dialect: str, facts: dict, tail: int = 16384) -> int:
    return worst(judge(dialect, facts, tail))


@pytest.mark.parametrize("changes, severity, words", [
    ({}, OK, "no standby attached"),
    ({"in_recovery": True, "replay_lag": 12.0}, CRITICAL, "standby (in recovery, 12s behind"),
    ({"fsync": "off"}, CRITICAL, "fsync = off"),
    ({"synchronous_commit": "off"}, WARNING, "synchronous_commit = off"),
    ({"standbys": 2}, WARNING, "2 standby(s) attached, all asynchronous"),
    ({"standbys": 1, "synchronous_commit": "local", "synchronous_standby_names": "s1"},
     WARNING, "synchronous_commit = local"),
    ({"standbys": 1, "synchronous_standby_names": "s1", "sync_standbys": 1}, WARNING,
     "names no spare"),
    ({"standbys": 2, "sync_standbys": 1, "synchronous_standby_names": "FIRST 1 (s1)"}, WARNING,
     "names no spare"),
    ({"standbys": 2, "synchronous_standby_names": "ANY 1 (s1, s2)", "sync_standbys": 2}, OK,
     "2 synchronous standby(s) connected"),
    # The only synchronous standby down: every claim waits, then exits 75 (issue 34).
    ({"synchronous_standby_names": "*"}, CRITICAL,
     "waits for 1 synchronous standby(s), 0 connected: no claim can commit"),
    ({"synchronous_standby_names": "s1", "synchronous_commit": "remote_apply"}, CRITICAL,
     "0 connected"),
    ({"standbys": 1, "sync_standbys": 1, "synchronous_standby_names": "ANY 2 (s1, s2, s3)"},
     CRITICAL, "waits for 2 synchronous standby(s), 1 connected"),
    ({"synchronous_standby_names": "s1", "synchronous_commit": "local"}, OK,
     "commits do not wait"),
    ({"standbys": 1, "hidden_standbys": 1, "synchronous_standby_names": "s1"}, WARNING,
     "hidden from this role"),
    ({"standbys": 2, "sync_standbys": 1, "synchronous_standby_names": "*"}, OK,
     "1 synchronous standby(s) connected"),
    ({"default_transaction_read_only": "on"}, CRITICAL, "default_transaction_read_only = on"),
    ({"full_page_writes": "off"}, WARNING, "full_page_writes = off"),
    ({"in_recovery": True, "replay_lag": 0.0}, CRITICAL, "(in recovery, 0s behind"),
])
def test_postgresql(changes: dict, severity: int, words: str) -> None:
    facts = {**PRIMARY, **changes}
    assert _worst("postgresql", facts) == severity
    assert any(words in line for line in _lines("postgresql", facts)), _lines("postgresql", facts)


@pytest.mark.parametrize("facts, severity, words", [
    (MARIADB, OK, "innodb_flush_log_at_trx_commit = 1"),
    ({**MARIADB, "read_only": 1, "writes_refused": True}, CRITICAL, "read-only"),
    ({**MARIADB, "innodb_flush_log_at_trx_commit": 2}, WARNING, "about a second"),
    ({**MARIADB, "log_bin": 1}, WARNING, "sync_binlog = 0 with the binary log on"),
    ({**MARIADB, "max_allowed_packet": 65536}, WARNING, "cut to fit"),
    (GALERA, OK, "Primary component of 3 node(s)"),
    ({**GALERA, "wsrep_sync_wait": 0}, WARNING, "wsrep_sync_wait = 0"),
    ({**GALERA, "wsrep_cluster_status": "non-Primary"}, CRITICAL, "not in a Primary"),
    # A node that refuses every query while in the Primary component and ready (issue 34).
    ({**GALERA, "wsrep_reject_queries": "ALL"}, CRITICAL, "wsrep_reject_queries = ALL"),
])
def test_mysql(facts: dict, severity: int, words: str) -> None:
    assert _worst("mysql", facts) == severity
    assert any(words in line for line in _lines("mysql", facts)), _lines("mysql", facts)


REPLICATING = {"Master_Host": "db1", "Master_Port": 3306, "Slave_IO_Running": "Yes",
               "Slave_SQL_Running": "Yes", "Seconds_Behind_Master": 0}
REPLICA = {"Server_id": 2, "Host": "db2", "Port": 3306}
SEMI_SYNC = {"log_bin": 1, "sync_binlog": 1, "replicas": [REPLICA], "semi_sync_enabled": 1,
             "semi_sync_status": "ON", "semi_sync_clients": 1,
             "semi_sync_wait_point": "AFTER_SYNC", "semi_sync_timeout": 2000,
             "semi_sync_prefix": "rpl_semi_sync_master"}


@pytest.mark.parametrize("changes, severity, words", [
    # read_only judged by what the server answered this user's write (writes_refused).
    ({"read_only": 1, "writes_refused": True}, CRITICAL, "no claim can be written here"),
    ({"read_only": 1, "writes_refused": False}, WARNING, "this user may write through it"),
    ({"super_read_only": 1, "writes_refused": True}, CRITICAL, "read-only"),
    ({"read_only": 1, "writes_refused": None}, WARNING, "could not be told"),
    ({"tx_read_only": 1, "writes_refused": True}, CRITICAL,
     "tx_read_only = ON: every session begins read-only"),
    ({"offline_mode": 1}, CRITICAL, "offline_mode = ON"),
    ({"innodb_doublewrite": 0}, WARNING, "innodb_doublewrite = OFF"),
    # A replica: claims written there are not its primary's.
    ({"replica_of": [REPLICATING]}, CRITICAL, "a replica of db1:3306 (IO Yes, SQL Yes, 0s"),
    ({"replica_of": [{**REPLICATING, "Slave_IO_Running": "No", "Slave_SQL_Running": "No"}]},
     WARNING, "set up but stopped"),
    ({"replica_of": [{"Source_Host": "db1", "Source_Port": 3306, "Replica_IO_Running": "Yes",
                      "Replica_SQL_Running": "Yes", "Seconds_Behind_Source": 3}]},
     CRITICAL, "a replica of db1:3306 (IO Yes, SQL Yes, 3s behind)"),
    ({"replica_of": None, "slaves_running": 1}, CRITICAL, "1 replication thread(s) running"),
    ({"replica_of": None, "slaves_running": 0, "gtid_slave_pos": ""}, OK,
     "replicates from no other"),
    ({"replica_of": None}, WARNING, "whether the server is a replica could not be told"),
    # The replicas it feeds: asynchronous ones can lose acknowledged claims in a failover.
    ({"log_bin": 1, "sync_binlog": 1, "replicas": [REPLICA]}, WARNING,
     "1 replica(s) attached (db2:3306), asynchronous (rpl_semi_sync_master_enabled = OFF"),
    (SEMI_SYNC, OK, "semi-synchronous (rpl_semi_sync_master_wait_point = AFTER_SYNC"),
    ({**SEMI_SYNC, "semi_sync_wait_point": "AFTER_COMMIT"}, WARNING,
     "wait_point = AFTER_COMMIT: other sessions see a claim or a result before a replica"),
    ({**SEMI_SYNC, "semi_sync_status": "OFF"}, WARNING, "Rpl_semi_sync_master_status = OFF"),
    # No replica acknowledged in time: the primary went on asynchronously.
    ({**SEMI_SYNC, "semi_sync_status": "OFF", "semi_sync_clients": 0, "replicas": []},
     WARNING, "but Rpl_semi_sync_master_status = OFF: no replica acknowledged within "
     "rpl_semi_sync_master_timeout = 2000 ms"),
    # A commit that waits longer than once for its answer: exit 75, the claim committed.
    ({**SEMI_SYNC, "semi_sync_timeout": 60000}, WARNING,
     "rpl_semi_sync_master_timeout = 60000 ms: while no replica acknowledges"),
    ({**SEMI_SYNC, "semi_sync_prefix": "rpl_semi_sync_source", "semi_sync_status": "OFF"},
     WARNING, "Rpl_semi_sync_source_status = OFF"),
    ({"log_bin": 1, "sync_binlog": 1, "replicas": None}, WARNING,
     "whether replicas are attached could not be told"),
    ({"log_bin": 1, "sync_binlog": 1}, OK, "no replica attached"),
])
def test_mysql_replication(changes: dict[str, Any], severity: int, words: str) -> None:
    facts = {**MARIADB, **changes}
    assert _worst("mysql", facts) == severity, _lines("mysql", facts)
    assert any(words in line for line in _lines("mysql", facts)), _lines("mysql", facts)


def _host(name: str, identity: str, **more: Any) -> dict[str, Any]:
    return {"host": name, "identity": identity, "server": f"{identity} {name}", **more}


@pytest.mark.parametrize("dialect, hosts, severity, words", [
    ("postgresql", [_host("a:5432", "71", in_recovery=False),
                    _host("b:5432", "71", in_recovery=True)], OK,
     "2 hosts, one cluster (system_identifier 71): 1 primary"),
    ("postgresql", [_host("a:5432", "71", in_recovery=False),
                    _host("b:5432", "72", in_recovery=False)], CRITICAL,
     "separate servers, not one cluster (a:5432: system_identifier 71; b:5432: "
     "system_identifier 72)"),
    ("postgresql", [_host("a:5432", "71", in_recovery=False),
                    _host("b:5432", "71", in_recovery=False)], CRITICAL, "split brain"),
    ("postgresql", [_host("a:5432", "71", in_recovery=False),
                    _host("b:5432", "71", in_recovery=True, receiving=False)], WARNING,
     "b:5432: a standby that streams from no server"),
    ("postgresql", [_host("a:5432", "71", in_recovery=False),
                    {"host": "b:5432", "error": "Connection refused"}], WARNING,
     "1 of the URL's 2 hosts could not be read (b:5432: Connection refused)"),
    ("mysql", [_host("a:3306", "Galera cluster u"), _host("b:3306", "Galera cluster u")], OK,
     "2 hosts, one server or cluster (Galera cluster u)"),
    ("mysql", [_host("a:3306", "server_id 1 on a:3306"),
               _host("b:3306", "server_id 1 on b:3306", writes_refused=False)], CRITICAL,
     "separate servers"),
    ("mysql", [_host("a:3306", "server_id 1 on a:3306"),
               _host("b:3306", "server_id 2 on b:3306", writes_refused=True)], WARNING,
     "read-only for this user: while the first is down, claims there exit 75"),
    ("mysql", [_host("a:3306", "Galera cluster u"),
               _host("b:3306", "Galera cluster u", not_ready=True)], WARNING,
     "b:3306 outside the Primary component"),
])
def test_host_lists(dialect: str, hosts: list[dict[str, Any]], severity: int,
                    words: str) -> None:
    facts = {**(PRIMARY if dialect == "postgresql" else MARIADB), "hosts": hosts}
    found = [v for v in judge(dialect, facts, 16384) if v.topic == "hosts"]
    assert len(found) == 1 and found[0].severity == severity, found
    assert words in found[0].message, found[0].message


def test_one_host_says_nothing_of_hosts() -> None:
    assert not [v for v in judge("postgresql", PRIMARY, 0) if v.topic == "hosts"]


def test_galera_does_not_ask_for_sync_binlog() -> None:
    assert not any("sync_binlog" in line for line in _lines("mysql", {**GALERA, "log_bin": 1}))


@pytest.mark.parametrize("facts, severity, words", [
    ({"exists": True, "filesystem": "ext4", "journal_mode": "wal"}, OK, "journal_mode = wal"),
    ({"exists": False, "filesystem": "ext4"}, OK, "no SQLite file yet"),
    ({"exists": True, "filesystem": "nfs4", "journal_mode": "wal"}, CRITICAL, "nfs4"),
    ({"exists": True, "filesystem": "ext4", "journal_mode": "delete"}, WARNING, "delete"),
    # Memory: a reboot empties it, and every period runs again (issue 34).
    ({"exists": True, "filesystem": "tmpfs", "directory": "/dev/shm", "journal_mode": "wal"},
     CRITICAL, "on tmpfs (memory: /dev/shm): a reboot empties it"),
    ({"exists": False, "filesystem": "ramfs"}, CRITICAL, "a reboot empties it"),
    ({"exists": True, "filesystem": "overlay", "journal_mode": "wal"}, WARNING,
     "a container's own layer"),
    ({"exists": True, "filesystem": "", "journal_mode": "wal"}, WARNING,
     "could not be told"),
    ({"exists": True, "filesystem": "ext4", "journal_mode": "wal", "writable": False,
      "directory": "/srv/once"}, CRITICAL, "this user may not write the SQLite file"),
])
def test_sqlite(facts: dict, severity: int, words: str) -> None:
    assert _worst("sqlite", facts) == severity
    assert any(words in line for line in _lines("sqlite", facts))


@pytest.mark.parametrize("names, quorum", [("s1", (1, 1)), ("s1, s2", (1, 2)),
                                           ("FIRST 2 (s1, s2, s3)", (2, 3)),
                                           ("ANY 1 (s1,s2)", (1, 2)), ("2 (a, b)", (2, 2)),
                                           ("*", (1, 1))])
def test_sync_quorum(names: str, quorum: tuple[int, int]) -> None:
    assert _sync_quorum(names) == quorum


def test_lines_are_worst_first_and_two_fields_without_spaces() -> None:
    text = render(judge("postgresql", {**PRIMARY, "fsync": "off", "standbys": 1}, 0), False)
    lines = text.splitlines()
    assert lines[0].startswith("CRITICAL durability ")
    assert all(len(line.split(" ", 2)) == 3 for line in lines)


class _Refused(Exception):
    """A PyMySQL error as the driver raises it: (code, message)."""


def test_a_node_that_cannot_answer_is_told_from_a_ledger_error_chain() -> None:
    refused = _Refused(1047, "WSREP has not yet prepared node for application use")
    try:
        try:
            raise refused
        except _Refused as exc:
            raise LedgerError("cannot read the ledger mariadb://db/ops: ...") from exc
    except LedgerError as error:
        assert not_ready(error)
    assert not not_ready(LedgerError("cannot read the ledger: Connection refused"))
    assert not not_ready(_Refused(1213, "Deadlock found"))


def test_check_says_unknown_in_one_line_for_a_node_that_cannot_answer() -> None:
    finding = not_ready_finding("mariadb://db2/ops", "(1047, 'WSREP has not yet prepared "
                                "node for application use')")
    assert finding.severity == UNKNOWN
    assert finding.line.startswith("UNKNOWN - - not-ready (the ledger mariadb://db2/ops cannot "
                                   "be read on this server: (1047, ")
    assert "\n" not in finding.line

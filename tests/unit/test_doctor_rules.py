"""once doctor's rules over the facts a server reports (pure: no database)."""

from __future__ import annotations

import pytest

from once.report.check import CRITICAL, OK, WARNING
from once.report.doctor import _sync_quorum, judge, render, worst

PRIMARY = {"in_recovery": False, "synchronous_commit": "on", "synchronous_standby_names": "",
           "fsync": "on", "standbys": 0, "sync_standbys": 0, "replay_lag": None}
MARIADB = {"innodb_flush_log_at_trx_commit": 1, "sync_binlog": 0, "log_bin": 0,
           "read_only": 0, "max_allowed_packet": 16 * 2**20, "wsrep_on": 0}
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
    ({"standbys": 2, "synchronous_standby_names": "FIRST 1 (s1)"}, WARNING, "names no spare"),
    ({"standbys": 2, "synchronous_standby_names": "ANY 1 (s1, s2)", "sync_standbys": 2}, OK,
     "2 synchronous standby(s) connected"),
])
def test_postgresql(changes: dict, severity: int, words: str) -> None:
    facts = {**PRIMARY, **changes}
    assert _worst("postgresql", facts) == severity
    assert any(words in line for line in _lines("postgresql", facts)), _lines("postgresql", facts)


@pytest.mark.parametrize("facts, severity, words", [
    (MARIADB, OK, "innodb_flush_log_at_trx_commit = 1"),
    ({**MARIADB, "read_only": 1}, CRITICAL, "read-only"),
    ({**MARIADB, "innodb_flush_log_at_trx_commit": 2}, WARNING, "about a second"),
    ({**MARIADB, "log_bin": 1}, WARNING, "sync_binlog = 0 with the binary log on"),
    ({**MARIADB, "max_allowed_packet": 65536}, WARNING, "cut to fit"),
    (GALERA, OK, "Primary component of 3 node(s)"),
    ({**GALERA, "wsrep_sync_wait": 0}, WARNING, "wsrep_sync_wait = 0"),
    ({**GALERA, "wsrep_cluster_status": "non-Primary"}, CRITICAL, "not in a Primary"),
])
def test_mysql(facts: dict, severity: int, words: str) -> None:
    assert _worst("mysql", facts) == severity
    assert any(words in line for line in _lines("mysql", facts)), _lines("mysql", facts)


def test_galera_does_not_ask_for_sync_binlog() -> None:
    assert not any("sync_binlog" in line for line in _lines("mysql", {**GALERA, "log_bin": 1}))


@pytest.mark.parametrize("facts, severity, words", [
    ({"exists": True, "filesystem": "ext4", "journal_mode": "wal"}, OK, "journal_mode = wal"),
    ({"exists": False, "filesystem": "ext4"}, OK, "no SQLite file yet"),
    ({"exists": True, "filesystem": "nfs4", "journal_mode": "wal"}, CRITICAL, "nfs4"),
    ({"exists": True, "filesystem": "ext4", "journal_mode": "delete"}, WARNING, "delete"),
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

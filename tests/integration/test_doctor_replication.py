"""once doctor on MariaDB replication (docs/how-to/high-availability.md, "MySQL and MariaDB
replication"): a primary and its asynchronous replica of this module's own (tests/
private_mariadb.py: Debian's mariadbd on loopback ports of their own, the binary log on,
GTID replication), stopped at the module's end.

doctor called both OK (issue 34), and both ran the same day: the replica is a ledger of its
own for whoever writes there, and a failover to an asynchronous replica loses the claims it
had not received; read_only was CRITICAL for a user who may write through it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import run_once, wait_for
from private_mariadb import PrivateMariadb, mariadb_binaries

pytestmark = pytest.mark.slow


class Replication(NamedTuple):
    primary: PrivateMariadb
    replica: PrivateMariadb
    database: str


@pytest.fixture(scope="module")
def replication() -> Iterator[Replication]:
    binaries = mariadb_binaries()
    # sync_binlog = 1: the binary log's own finding out of the way.
    primary = PrivateMariadb(*binaries, "--server-id=1", "--log-bin=mysql-bin",
                             "--sync-binlog=1")
    try:
        replica = PrivateMariadb(*binaries, "--server-id=2", "--log-bin=mysql-bin",
                                 "--sync-binlog=1", "--log-slave-updates")
    except BaseException:
        primary.stop()
        raise
    try:
        database = "once_r_" + uuid.uuid4().hex[:12]
        replica.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', "
                        f"MASTER_PORT={primary.port}, MASTER_USER='root', "
                        f"MASTER_USE_GTID=slave_pos")
        replica.execute("START SLAVE")
        primary.execute(f"CREATE DATABASE {database}")
        # A user with the ledger's privileges alone: no SUPER, no READ_ONLY ADMIN.
        primary.execute("CREATE USER 'once'@'127.0.0.1' IDENTIFIED BY 'once-pw'")
        primary.execute(f"GRANT ALL ON {database}.* TO 'once'@'127.0.0.1'")
        wait_for(lambda: replica.execute("SELECT count(*) FROM mysql.user WHERE user = 'once'")
                 == [(1,)], timeout=60, what="the replica to replicate")
        yield Replication(primary, replica, database)
    finally:
        replica.stop()
        primary.stop()


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _doctor(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_once("doctor", "--db", url, env=_env(tmp_path))


def _url(server: PrivateMariadb, database: str, user: str = "root") -> str:
    return f"mariadb://{user}@127.0.0.1:{server.port}/{database}"


def test_a_primary_with_an_asynchronous_replica_warns(replication: Replication,
                                                      tmp_path: Path) -> None:
    primary, replica, database = replication
    doctor = _doctor(_url(primary, database), tmp_path)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith(
        f"WARNING replication 1 replica(s) attached (127.0.0.1:{replica.port}), asynchronous "
        "(rpl_semi_sync_master_enabled = OFF, Rpl_semi_sync_master_status = OFF): a failover "
        "to one can lose claims already acknowledged"), doctor.stdout
    assert "OK session the server replicates from no other" in doctor.stdout


def test_a_semi_synchronous_replica_after_sync_is_ok(replication: Replication,
                                                     tmp_path: Path) -> None:
    primary, replica, database = replication
    try:
        primary.execute("SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'")
        primary.execute("SET GLOBAL rpl_semi_sync_master_timeout = 2000")  # below once's bound
        primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = ON")
        replica.execute("SET GLOBAL rpl_semi_sync_slave_enabled = ON")
        replica.execute("STOP SLAVE IO_THREAD")  # the replica says it acknowledges at connect
        replica.execute("START SLAVE IO_THREAD")
        wait_for(lambda: primary.execute("SHOW GLOBAL STATUS LIKE "
                                         "'Rpl_semi_sync_master_clients'") == [
            ("Rpl_semi_sync_master_clients", "1")], what="the replica to acknowledge")
        doctor = _doctor(_url(primary, database), tmp_path)
        primary.execute("SET GLOBAL rpl_semi_sync_master_timeout = 60000")
        waits_longer = _doctor(_url(primary, database), tmp_path)
    finally:
        primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        primary.execute("SET GLOBAL rpl_semi_sync_master_timeout = 10000")
        replica.execute("SET GLOBAL rpl_semi_sync_slave_enabled = OFF")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert (f"OK replication 1 replica(s) attached (127.0.0.1:{replica.port}), "
            "semi-synchronous (rpl_semi_sync_master_wait_point = AFTER_SYNC, 1 acknowledging); "
            "it turns asynchronous after rpl_semi_sync_master_timeout = 2000 ms"
            ) in doctor.stdout, doctor.stdout
    # Longer than once waits for a commit's answer: a claim exits 75 with its row committed.
    assert waits_longer.returncode == 1, waits_longer.stdout
    assert "but rpl_semi_sync_master_timeout = 60000 ms: while no replica acknowledges" \
        in waits_longer.stdout, waits_longer.stdout


def test_a_session_on_the_replica_is_critical(replication: Replication,
                                              tmp_path: Path) -> None:
    primary, replica, database = replication
    doctor = _doctor(_url(replica, database), tmp_path)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith(
        f"CRITICAL session the server is a replica of 127.0.0.1:{primary.port} (IO Yes, SQL "
        "Yes, "), doctor.stdout
    # As the ledger's own user, who may not read SHOW REPLICA STATUS: told all the same.
    user = _doctor(_url(replica, database, "once:once-pw"), tmp_path)
    assert user.returncode == 2, user.stdout + user.stderr
    assert "CRITICAL session the server is a replica (1 replication thread(s) running)" \
        in user.stdout, user.stdout


def test_read_only_is_judged_by_what_the_user_may_write(replication: Replication,
                                                        tmp_path: Path) -> None:
    primary, _, database = replication
    primary.execute("SET GLOBAL read_only = ON")
    try:
        root = _doctor(_url(primary, database), tmp_path)
        user = _doctor(_url(primary, database, "once:once-pw"), tmp_path)
        written = run_once("run", "--db", _url(primary, database), "--job", "j", "--every",
                           "day", "--", "true", env=_env(tmp_path))
    finally:
        primary.execute("SET GLOBAL read_only = OFF")
    # root holds READ_ONLY ADMIN (in ALL PRIVILEGES): its claims are written.
    assert written.returncode == 0, written.stderr
    assert "WARNING session read_only = ON, but this user may write through it (SUPER or " \
           "READ_ONLY ADMIN)" in root.stdout, root.stdout
    assert "CRITICAL session" not in root.stdout
    assert "CRITICAL session the server is read-only (read_only = ON: a replica?): no claim " \
           "can be written here" in user.stdout, user.stdout


def test_a_host_list_of_the_primary_and_its_replica_is_two_ledgers(
        replication: Replication, tmp_path: Path) -> None:
    primary, replica, database = replication
    hosts = f"mariadb://root@127.0.0.1:{primary.port},127.0.0.1:{replica.port}/{database}"
    doctor = _doctor(hosts, tmp_path)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith(
        f"CRITICAL hosts the URL's hosts are separate servers, not one cluster (127.0.0.1:"
        f"{primary.port}: server_id 1 on "), doctor.stdout
    # The replica read-only for the ledger's user: its claims there would exit 75.
    replica.execute("SET GLOBAL read_only = ON")
    try:
        user = _doctor(hosts.replace("root@", "once:once-pw@"), tmp_path)
    finally:
        replica.execute("SET GLOBAL read_only = OFF")
    assert f"WARNING hosts 127.0.0.1:{replica.port} (server_id 2 on " in user.stdout, \
        user.stdout
    assert "read-only for this user: while the first is down, claims there exit 75" \
        in user.stdout


def test_a_claim_that_outlasts_a_semi_synchronous_wait_exits_75_and_holds_the_period(
        replication: Replication, tmp_path: Path) -> None:
    # What the guide says of a rpl_semi_sync_master_timeout above once's statement bound
    # (--stale-after 10s: 3.3 s): once gives up on the commit's answer, the commit lands.
    primary, replica, database = replication
    url = _url(primary, database)
    assert run_once("schema", "--db", url, env=_env(tmp_path)).returncode == 0
    try:
        primary.execute("SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'")
        primary.execute("SET GLOBAL rpl_semi_sync_master_timeout = 15000")
        primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = ON")
        replica.execute("STOP SLAVE")  # no replica acknowledges
        claim = run_once("run", "--db", url, "--job", "held", "--every", "day",
                         "--stale-after", "10s", "--", "echo", "ran", env=_env(tmp_path))
        wait_for(lambda: primary.execute("SELECT status FROM once_runs WHERE job = 'held'",
                                         database) == [("running",)], timeout=60,
                 what="the claim's commit to land")
    finally:
        primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        primary.execute("SET GLOBAL rpl_semi_sync_master_timeout = 10000")
        replica.execute("START SLAVE")
    assert claim.returncode == 75, claim.stdout + claim.stderr
    assert claim.stdout == "" and "nothing was run" in claim.stderr, claim.stderr


def test_sessions_that_begin_read_only_are_critical(replication: Replication,
                                                    tmp_path: Path) -> None:
    # tx_read_only = ON globally: every new session is read-only, SUPER or not; doctor said
    # "OK session the server accepts writes".
    primary, _, database = replication
    primary.execute("SET GLOBAL tx_read_only = ON")
    try:
        doctor = _doctor(_url(primary, database), tmp_path)
    finally:
        primary.execute("SET GLOBAL tx_read_only = OFF")
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("CRITICAL session tx_read_only = ON: every session begins "
                                    "read-only"), doctor.stdout

"""A MariaDB Galera cluster as the ledger (docs/how-to/high-availability.md "Galera"): three
nodes on loopback (tests/private_galera.py), callers spread across them. Certification, not locks,
decides between nodes: a claim that loses it is told "deadlock" (1213) at its commit, and
GET_LOCK, which serialises the tables' creation, is one node's alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import ONCE, release_together, run_once, wait_for
from private_galera import NODES, GaleraCluster
from procs import start_once

pytestmark = pytest.mark.slow

ROUNDS, PER_NODE = 2, 6  # two periods, 18 callers each, six on each node


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _run(url: str, job: str, *command: str, stale: str = "10s", lag: int = 0) -> list[str]:
    return [ONCE, "run", "--db", url, "--job", job, "--every", "day", "--lag", str(lag),
            "--stale-after", stale, "--", *command]


def _race(galera: GaleraCluster, database: str, lag: int, ran: Path, tmp_path: Path) -> None:
    """18 callers, six on each node, released at once for the period `lag` days back: every
    one exits 0 (a loser of a lost certification skips, as any lost claim) and one runs."""
    before = len(ran.read_text().splitlines()) if ran.exists() else 0
    callers = [_run(galera.url(node, database), "race", "sh", "-c",
                    f'echo "$ONCE_PERIOD $ONCE_FENCE" >> {ran}', lag=lag)
               for node in NODES for _ in range(PER_NODE)]
    results = release_together(callers, tmp_path / "gate", _env(tmp_path))
    assert [r.returncode for r in results] == [0] * len(callers), [
        r.stderr for r in results if r.returncode]
    assert len(ran.read_text().splitlines()) == before + 1, f"lag {lag}: not one run"


def test_callers_on_three_nodes_race_for_one_period_and_one_runs(
        galera: GaleraCluster, tmp_path: Path) -> None:
    database = galera.new_database()
    assert run_once("schema", "--db", galera.url(1, database), env=_env(tmp_path)
                    ).returncode == 0
    ran = tmp_path / "ran"
    for lag in range(ROUNDS):  # one job, a period each round: today, yesterday
        _race(galera, database, lag, ran, tmp_path)
    # Today's row as an owner that died long ago leaves it: one caller takes it over.
    today = "(SELECT MAX(period) FROM (SELECT period FROM once_runs) AS p)"
    galera.execute(1, "UPDATE once_runs SET status = 'running', finished_at = NULL, "
                      f"heartbeat_at = period_start WHERE period = {today}", database)
    galera.execute(1, "UPDATE once_attempts SET status = 'running', finished_at = NULL, "
                      f"exit_code = NULL, outcome = NULL WHERE period = {today}",
                   database)  # not a done marker (Run.finish_in's)
    _race(galera, database, 0, ran, tmp_path)
    runs = [tuple(line.split()) for line in ran.read_text().splitlines()]
    fences = [int(fence) for _, fence in runs]
    assert fences == sorted(set(fences)), f"fences not strictly growing: {fences}"
    for node in NODES:  # every node holds every claim, with the fence its command ran with
        rows = galera.execute(node, "SELECT period, status, attempt, fence FROM once_runs "
                                    "ORDER BY period DESC", database)
        assert rows == [(runs[2][0], "done", 2, fences[2]), (runs[1][0], "done", 1, fences[1])]
        assert galera.execute(node, "SELECT COUNT(*) FROM once_attempts", database) == [
            (ROUNDS + 1,)]


def test_a_fresh_ledgers_first_use_from_three_nodes_at_once_creates_it_once(
        galera: GaleraCluster, tmp_path: Path) -> None:
    env = _env(tmp_path)
    for round_ in range(3):  # each on a database of its own: the race is the creation's
        database = galera.new_database()
        ran = tmp_path / f"ran-{round_}"
        callers = [_run(galera.url(node, database), "first", "sh", "-c", f"echo x >> {ran}")
                   for node in NODES for _ in range(2)]
        results = release_together(callers, tmp_path / "gate", env)
        assert [r.returncode for r in results] == [0] * len(callers), [
            r.stderr for r in results if r.returncode]
        assert ran.read_text() == "x\n"
        for node in NODES:
            assert galera.execute(node, "SELECT name, value FROM once_meta", database) == [
                ("schema_version", "5")]
            assert galera.execute(node, "SELECT COUNT(*) FROM once_runs", database) == [(1,)]


def test_two_commands_of_a_new_job_on_three_nodes_run_one(galera: GaleraCluster,
                                                          tmp_path: Path) -> None:
    """--require-same-command across nodes: a node's locks are its own, so two claims of a
    new job on two nodes both read no fingerprint; the certification of the job row's insert
    lets one commit, the other is told deadlock and tries again, and then reads the first's
    fingerprint. Nine callers, a period each, two commands: one command runs."""
    database = galera.new_database()
    assert run_once("schema", "--db", galera.url(1, database), env=_env(tmp_path)
                    ).returncode == 0
    ran = tmp_path / "ran"
    callers = []
    for lag in range(9):
        name = "old" if lag % 2 else "new"
        node = NODES[lag % len(NODES)]
        callers.append([ONCE, "run", "--db", galera.url(node, database), "--job", "drift",
                        "--every", "day", "--lag", str(lag), "--require-same-command", "--",
                        "sh", "-c", f'echo {name} >> "{ran}"', name])
    results = release_together(callers, tmp_path / "gate", _env(tmp_path))
    names = ran.read_text().split()
    assert len(set(names)) == 1, names
    refused = [r for r in results if r.returncode == 2]
    assert len(refused) == len(callers) - len(names), [r.stderr for r in results]
    assert all("last ran a different command" in r.stderr for r in refused)


@pytest.mark.parametrize("route", ["haproxy", "host list"])
def test_the_owners_node_killed_as_its_command_ends_the_finish_lands_on_another(
        galera: GaleraCluster, tmp_path: Path, route: str) -> None:
    # haproxy sends every connection to node 1 while it is up, else to a backup; a URL that
    # lists the three nodes tries them in order. Either way the owner claims on node 1, which
    # dies (SIGKILL) as the command ends: the finish reconnects and lands on node 2, where
    # the claim already is (certified on every node before node 1 answered it).
    database = galera.new_database()
    if route == "haproxy":
        url = f"{galera.start_proxy()}/{database}"
    else:
        url = galera.hosts_url(NODES, database)
    env = _env(tmp_path)
    ran = tmp_path / "ran"
    writer = galera.procs[1].pid
    owner = run_once(*_run(url, "failover", "sh", "-c", f"echo x >> {ran}; kill -9 {writer}"
                           )[1:], env=env, timeout=120)
    assert owner.returncode == 0, owner.stderr
    wait_for(lambda: galera.procs[1].poll() is not None, what="node 1 to be gone")
    assert ran.read_text() == "x\n"
    for node in (2, 3):
        assert galera.execute(node, "SELECT status, attempt FROM once_runs", database) == [
            ("done", 1)]
    # The period is done on what is left of the cluster: a later fire skips.
    again = run_once(*_run(url, "failover", "sh", "-c", f"echo x >> {ran}")[1:], env=env)
    assert again.returncode == 0, again.stderr
    assert ran.read_text() == "x\n"


def test_renewals_and_the_finish_ride_out_a_node_that_refuses_queries(
        galera: GaleraCluster, tmp_path: Path) -> None:
    # wsrep_reject_queries = ALL answers every statement with 1047 ("WSREP has not yet
    # prepared node for application use"), as a node outside the Primary component does.
    database = galera.new_database()
    go = tmp_path / "go"
    owner = start_once(*_run(galera.url(2, database), "refused", "sh", "-c",
                             f"touch {tmp_path}/started; "
                             f"while [ ! -e {go} ]; do sleep 0.05; done", stale="15s")[1:],
                       env=_env(tmp_path))
    try:
        wait_for(lambda: (tmp_path / "started").exists(), timeout=60, what="the command")
        with galera.watch(2) as node:
            with node.refusing():  # until a renewal met 1047 and the owner reconnected
                pass
            with node.refusing():  # the command ends: until the finish met it
                go.touch()
        _, err = owner.communicate(timeout=120)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert owner.returncode == 0, err
    assert galera.execute(1, "SELECT status, attempt FROM once_runs", database) == [
        ("done", 1)]



def test_a_claim_that_decides_from_a_read_decides_as_the_takeover_would(
        galera: GaleraCluster, tmp_path: Path) -> None:
    # After a lost certification the claim reads the row and skips when records.beaten says
    # the takeover could not have matched it: both must agree on every kind of row.
    import pymysql

    from once.ledger.mysql import MysqlLedger
    from once.ledger.records import beaten

    database = galera.new_database()
    assert run_once("schema", "--db", galera.url(1, database), env=_env(tmp_path)
                    ).returncode == 0
    rows = [("running", 1, 0), ("running", 1, 60), ("done", 1, 0), ("failed", 1, 0),
            ("failed", 3, 0)]  # status, attempt, heartbeat age (s) of a row promised 30 s
    for period, (status, attempt, age) in enumerate(rows):
        galera.execute(1, f"""
            INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                                   period_end, started_at, heartbeat_at, stale_after)
            VALUES ('j', '{period}', '{status}', {attempt}, 1, 'them', UTC_TIMESTAMP(),
                    UTC_TIMESTAMP(), UTC_TIMESTAMP(),
                    UTC_TIMESTAMP() - INTERVAL {age} SECOND, 30)""", database)
    conn = pymysql.connect(host="127.0.0.1", port=galera.ports.sql(1), user="root",
                           database=database)
    decided = []
    try:
        for period, rerun in ((p, r) for p in range(len(rows)) for r in (0, 1)):
            params = {"job": "j", "period": str(period), "max_attempts": 3, "attempt_cap": 9,
                      "rerun": rerun,
                      "fence": 2, "owner": "us", "stale_after": 30, "claim_id": "d"}
            with conn.cursor() as cur:
                cur.execute(MysqlLedger.HOLDER, params)
                held = beaten(cur.fetchone(), 3, bool(rerun))
                taken = cur.execute(MysqlLedger.TAKE_OVER, params)
            conn.rollback()
            assert held == (taken == 0), (rows[period], rerun)
            decided.append(held)
    finally:
        conn.close()
    assert decided == [True, True, False, False, True, False, False, False, True, False]


def _cluster_status(galera: GaleraCluster, node: int) -> object:
    return galera.execute(node, "SHOW STATUS LIKE 'wsrep_cluster_status'")[0][1]


def test_check_is_unknown_and_doctor_critical_on_a_node_outside_the_primary_component(
        galera: GaleraCluster, tmp_path: Path) -> None:
    # Node 2 cut off from the others (gmcast.isolate): a component of one node of three,
    # non-Primary, which answers 1047 to every statement but SHOW and SET. `once check`
    # exited 75, outside its own statuses (0-3), and `once doctor` too (it read the
    # server's settings with SELECT), where each can tell: UNKNOWN, CRITICAL.
    database = galera.new_database()
    env = _env(tmp_path)
    assert run_once(*_run(galera.url(1, database), "j", "true")[1:], env=env).returncode == 0
    galera.execute(2, "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
    try:
        wait_for(lambda: _cluster_status(galera, 2) == "non-Primary", timeout=60,
                 what="node 2 to leave the Primary component")
        checked = run_once("check", "--db", galera.url(2, database), env=env)
        as_json = run_once("check", "--json", "--db", galera.url(2, database), env=env)
        doctor = run_once("doctor", "--db", galera.url(2, database), env=env)
    finally:
        galera.execute(2, "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
        wait_for(lambda: _cluster_status(galera, 2) == "Primary", timeout=120,
                 what="node 2 back in the Primary component")
        wait_for(lambda: galera.size(2) == len(NODES), timeout=120, what="three nodes again")
    assert checked.returncode == 3, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"UNKNOWN - - not-ready (the ledger {galera.url(2, database)} cannot be read on this "
        "server: (1047, 'WSREP has not yet prepared node for application use') (a Galera node "
        "outside the Primary component"), checked.stdout
    assert checked.stderr == ""
    assert as_json.returncode == 3 and '"problem": "not-ready"' in as_json.stdout
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("CRITICAL galera the node is not in a Primary component "
                                    "(wsrep_cluster_status = non-Primary"), doctor.stdout
    # Back in the Primary component, the same check reads the ledger.
    wait_for(lambda: run_once("check", "--db", galera.url(2, database),
                              env=env).returncode == 0, timeout=60, what="check to read node 2")


def test_a_node_that_refuses_queries_is_critical_for_doctor_and_unknown_for_check(
        galera: GaleraCluster, tmp_path: Path) -> None:
    # wsrep_reject_queries = ALL, in the Primary component and ready: doctor said "OK galera
    # node of a Primary component of 3 node(s)" while every claim there met 1047.
    database = galera.new_database()
    env = _env(tmp_path)
    assert run_once(*_run(galera.url(1, database), "j", "true")[1:], env=env).returncode == 0
    with galera.watch(2) as node:
        node.reject(True)
        doctor = run_once("doctor", "--db", galera.url(2, database), env=env)
        checked = run_once("check", "--db", galera.url(2, database), env=env)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("CRITICAL galera wsrep_reject_queries = ALL: the node "
                                    "answers every query with 1047"), doctor.stdout
    assert checked.returncode == 3 and checked.stdout.startswith("UNKNOWN - - not-ready "), \
        checked.stdout + checked.stderr

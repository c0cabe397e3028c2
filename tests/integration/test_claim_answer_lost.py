"""A claim whose answer was lost (the client's read timeout ended it: a Galera cluster's
failure detection holds every commit for seconds) is tried again within the claim's patience,
and a try that committed after all is recognised by its claim's id: the period runs once,
neither twice nor not at all (issue 34, row 11).

On a private MariaDB (tests/private_mariadb.py): `BACKUP STAGE BLOCK_COMMIT` holds every
commit of the server, as a Galera cluster holds them while it decides whether a node is gone,
and `SELECT ... FOR UPDATE` of the job's row holds a claim before it writes; the Galera
cluster's own case is in tests/integration/test_galera.py. A relay that keeps the server's
side of a connection open (tests/silent_relay.py) keeps a try the client gave up on in the
server: MariaDB itself ends a COMMIT that waits within a second of its client's close, and a
loaded machine's next try came later than that (the test then waited for two tries that
were never in the server at once)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from helpers import run_once, wait_for
from private_mariadb import PrivateMariadb
from procs import reaped, start_once
from silent_relay import SilentRelay, tcp_upstream

pytestmark = pytest.mark.slow

# A statement timeout of 4 s (the read timeout) and a patience of 12 s: with 6 s, a loaded
# machine used the whole patience on the two tries and the wait for the held commits (75).
STALE = "12s"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _session(server: PrivateMariadb, database: str | None = None,
             autocommit: bool = True) -> Any:
    import pymysql

    return pymysql.connect(host="127.0.0.1", port=server.port, user="root",
                           database=database, autocommit=autocommit)


@contextmanager
def _commits_held(server: PrivateMariadb) -> Iterator[Any]:
    """Every commit of the server waits (BACKUP STAGE BLOCK_COMMIT) until the block's end."""
    holder = _session(server)
    try:
        with holder.cursor() as cur:
            for stage in ("START", "FLUSH", "BLOCK_DDL", "BLOCK_COMMIT"):
                cur.execute(f"BACKUP STAGE {stage}")
        yield holder
    finally:
        with holder.cursor() as cur:
            cur.execute("BACKUP STAGE END")
        holder.close()


def _row_lock_waits(server: PrivateMariadb) -> int:
    """How many times a statement has waited on a row lock in the server (it counts each
    wait as it begins)."""
    rows = server.execute("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'")
    return int(str(rows[0][1]))


def _claims_in(server: PrivateMariadb, database: str) -> int:
    """The statements `once` has in the server for this database: a try the client gave up
    on stays there, waiting, beside the next."""
    rows = server.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE "
                          f"DB = '{database}' AND COMMAND = 'Query' AND ID <> CONNECTION_ID()")
    return int(str(rows[0][0]))


def _run(url: str, ran: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    # A year's period: a test's fires, seconds apart under load, claim one period (with a
    # minute's, the fire after a slow first could claim the next minute and run again).
    return start_once("run", "-v", "--db", url, "--job", "lost", "--every", "year",
                      "--stale-after", STALE, "--", "sh", "-c",
                      f'echo "$ONCE_ATTEMPT $ONCE_FENCE" >> {ran}', env=env)


def _ran_once(server: PrivateMariadb, database: str, ran: Path) -> None:
    assert ran.read_text() == "1 1\n"  # attempt 1, the fence its claim took
    assert server.execute("SELECT status, attempt, fence FROM once_runs", database) == [
        ("done", 1, 1)]
    assert server.execute("SELECT COUNT(*) FROM once_attempts", database) == [(1,)]


def test_a_claim_whose_commit_was_answered_too_late_runs_once(
        private_mariadb: PrivateMariadb, tmp_path: Path) -> None:
    direct = private_mariadb.new_database()
    database = direct.rpartition("/")[2]
    env = _env(tmp_path)
    assert run_once("schema", "--db", direct, env=env).returncode == 0
    relay = SilentRelay(cast("tuple[str, int]", tcp_upstream(direct)), keep_server_side=True)
    url = relay.url_for(direct)
    ran = tmp_path / "ran"
    try:
        with _commits_held(private_mariadb):
            owner = _run(url, ran, env)
            try:
                # Its first try's COMMIT waits; the client gives up on it (4 s) and tries
                # again, which waits for the first try's locks: two statements in the server.
                wait_for(lambda: _claims_in(private_mariadb, database) >= 2
                         or owner.poll() is not None, timeout=30, what="the claim's second try")
            except BaseException:
                reaped(owner, 1)
                raise
        # The first try's commit goes through now: the second finds the row its claim's own.
        _, err = owner.communicate(timeout=60)
    finally:
        relay.close()
    assert owner.returncode == 0, err
    _ran_once(private_mariadb, database, ran)
    again = _run(direct, ran, env)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert ran.read_text() == "1 1\n"  # done: the next fire skips


def test_a_claim_held_past_its_read_timeout_is_tried_again(
        private_mariadb: PrivateMariadb, tmp_path: Path) -> None:
    # The job's row locked by another session: the first try waits, and the next try gets
    # through once the lock is let go. The first never commits. The server ends each try's
    # wait a second before the client's read timeout: a try the client gave up on was left
    # waiting in the server, a session each, up to the user's connection limit (an
    # attacker's finding). Never two of them there at once now.
    url = private_mariadb.new_database()
    database = url.rpartition("/")[2]
    env = _env(tmp_path)
    assert run_once("schema", "--db", url, env=env).returncode == 0
    private_mariadb.execute(
        "INSERT INTO once_jobs (job, fence, fire_count, kind, schedule, tz, `lag`, "
        "max_attempts, stale_after, shards, no_overlap, first_period_start, created_at, "
        "last_fired_at) VALUES ('lost', 0, 0, 'every', 'year', 'UTC', 0, 3, 12, 1, 0, "
        "UTC_TIMESTAMP(), UTC_TIMESTAMP(), UTC_TIMESTAMP())", database)
    locker = _session(private_mariadb, database, autocommit=False)
    ran = tmp_path / "ran"
    try:
        with locker.cursor() as cur:
            cur.execute("SELECT fence FROM once_jobs WHERE job = 'lost' FOR UPDATE")
        waits = _row_lock_waits(private_mariadb)
        owner = _run(url, ran, env)
        seen = []

        def second_wait() -> bool:
            seen.append(_claims_in(private_mariadb, database))
            return _row_lock_waits(private_mariadb) >= waits + 2 or owner.poll() is not None

        wait_for(second_wait, timeout=30, what="the claim's second try to wait")
        assert max(seen) <= 1, seen  # the first try's wait ended before the second's began
    finally:
        locker.rollback()
        locker.close()
    _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    _ran_once(private_mariadb, database, ran)


def test_a_claim_during_a_galera_clusters_failure_detection_runs_once(
        galera: Any, tmp_path: Path) -> None:
    # A node killed (SIGKILL): until the others declare it gone, the cluster certifies no
    # commit, and a claim on a surviving node waits past its read timeout (4 s with
    # --stale-after 12s). It is tried again, and whichever try committed is the claim (a
    # detection that outlasts the first try's promise leaves its row stale: a later try
    # takes it over as attempt 2, the claim's own, and runs it).
    database = galera.new_database()
    env = _env(tmp_path)
    assert run_once("schema", "--db", galera.url(2, database), env=env).returncode == 0
    ran = tmp_path / "ran"
    galera.kill(1)
    owner = _run(galera.url(2, database), ran, env)
    _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    [line] = ran.read_text().splitlines()  # one run
    attempt = int(line.split()[0])
    for node in (2, 3):
        assert galera.execute(node, "SELECT status, attempt FROM once_runs", database) == [
            ("done", attempt)]
        assert galera.execute(node, "SELECT COUNT(*) FROM once_attempts WHERE outcome = "
                                    "'done'", database) == [(1,)]

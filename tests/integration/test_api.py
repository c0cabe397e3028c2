"""The Python API (`import once`): claim, heartbeat, fenced finish, finish in a transaction."""

from __future__ import annotations

import os
import sys
import time

import pytest

import once
from helpers import run_once
from ledger_sql import query
from once.ledger import parse_url


def test_claim_runs_once_and_records_done(ledger_url: str) -> None:
    with once.claim("api", every="day", db=ledger_url) as run:
        assert run.won and run.attempt == 1 and run.fence >= 1
    with once.claim("api", every="day", db=ledger_url) as again:
        assert not again.won and again.skip_reason == "skipped-done"
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


def test_an_exception_records_failed_and_propagates(ledger_url: str) -> None:
    with pytest.raises(RuntimeError), once.claim("boom", every="day", db=ledger_url):
        raise RuntimeError("boom")
    assert query(ledger_url, "SELECT status FROM once_runs") == [("failed",)]
    with once.claim("boom", every="day", db=ledger_url) as retry:
        assert retry.won and retry.attempt == 2


def test_finish_in_the_callers_transaction(ledger_url: str) -> None:
    target = parse_url(ledger_url)
    with once.claim("txn", every="day", db=ledger_url) as run:
        conn, cur = _connect(target)
        cur.execute("CREATE TABLE IF NOT EXISTS work (x INTEGER)")
        _commit(target, conn)
        cur.execute("INSERT INTO work VALUES (1)")
        run.finish_in(conn)
        # Not committed yet: the ledger still says running.
        assert query(ledger_url, "SELECT status FROM once_runs") == [("running",)]
        _commit(target, conn)
        conn.close()
    assert query(ledger_url, "SELECT status FROM once_runs") == [("done",)]
    assert query(ledger_url, "SELECT count(*) FROM work") == [(1,)]


def test_a_forked_child_leaving_the_block_does_not_finish_the_claim(ledger_url: str) -> None:
    """A child forked inside the block that leaves it the usual way (sys.exit) neither
    finishes, renews nor closes the parent's claim; the parent then finishes it as usual."""
    claimer = os.getpid()
    try:
        with once.claim("fork", every="day", db=ledger_url, stale_after=3) as run:
            child = os.fork()
            if child == 0:
                sys.exit(3)
            _, status = os.waitpid(child, 0)
            assert os.waitstatus_to_exitcode(status) == 7
            assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [
                ("running", 1)]
            time.sleep(2)  # past a renewal: the parent's connection still works
            run.check()
    except SystemExit:
        if os.getpid() != claimer:
            os._exit(7)  # the child left the block without touching the claim
        raise
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


@pytest.mark.slow
def test_the_heartbeat_keeps_a_long_block_alive(ledger_url: str) -> None:
    with once.claim("long", every="day", db=ledger_url, stale_after=3) as run:
        for _ in range(16):  # 8 s: past two deadlines without renewals
            time.sleep(0.5)
            run.check()
        assert not run.lost
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]


def _connect(target):  # type: ignore[no-untyped-def]
    if target.dialect == "sqlite":
        import sqlite3

        conn = sqlite3.connect(target.path, timeout=30)
        return conn, conn
    if target.dialect == "postgresql":
        import psycopg

        conn = psycopg.connect(target.connect_args["conninfo"])
        return conn, conn
    import pymysql

    conn = pymysql.connect(**target.connect_args)
    return conn, conn.cursor()


def _commit(target, conn) -> None:  # type: ignore[no-untyped-def]
    conn.commit()


@pytest.mark.parametrize("job, namespace", [
    ("", None), ("nightly report", None), ("x" * 201, None), ("j" * 55, "n" * 200),
    ("ok", "bad ns"),
], ids=repr)
def test_the_api_refuses_a_bad_name_with_the_cli_s_message(
        ledger_url: str, once_env: dict[str, str], job: str, namespace: str | None) -> None:
    # One rule (once.limits.stored_name) for both, before anything is sent.
    ns = ["--namespace", namespace] if namespace is not None else []
    refused = run_once("run", "--job", job, *ns, "--every", "day", "--", "true", env=once_env)
    assert refused.returncode == 2
    with pytest.raises(once.InputError) as error, once.claim(job, every="day", db=ledger_url,
                                                             namespace=namespace):
        raise AssertionError("the block ran")
    assert refused.stderr == f"once: {error.value}\n"

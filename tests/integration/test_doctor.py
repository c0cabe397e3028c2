"""once doctor on real servers: the facts it reads, and a finding that each can be made to
show without touching the shared servers' global settings. Replication's findings, with
servers of their own: test_failover.py (PostgreSQL), test_doctor_replication.py (MariaDB),
test_galera.py."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from helpers import run_once
from once.ledger.schema import VOLATILE_FILESYSTEMS, filesystem_type


def test_doctor_reads_every_server_and_says_ok(backend: Any, once_env: dict[str, str]) -> None:
    assert run_once("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    result = run_once("doctor", "--json", env=once_env)
    report = json.loads(result.stdout)
    if backend.dialect == "sqlite" and _in_memory(once_env["ONCE_DATABASE_URL"]):
        # The suite's files on a tmpfs /tmp (Debian's default since 13): rightly CRITICAL.
        report["findings"] = [f for f in report["findings"] if f["topic"] != "filesystem"]
        report["status"] = max((f["severity"] for f in report["findings"]), key=_rank)
    else:
        assert result.returncode == 0, result.stdout + result.stderr
    assert report["status"] == "OK", report
    topics = {f["topic"] for f in report["findings"]}
    expected = {"sqlite": {"ledger", "filesystem", "journal"},
                "postgresql": {"session", "durability", "replication"},
                "mysql": {"session", "durability", "limits"}}[backend.dialect]
    assert expected <= topics


def test_doctor_warns_of_what_can_lose_a_claim(backend: Any, ledger_url: str,
                                               once_env: dict[str, str]) -> None:
    assert run_once("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    env, args = dict(once_env), ["doctor"]
    if backend.dialect == "sqlite":
        sqlite3.connect(ledger_url.removeprefix("sqlite:///")).execute(
            "PRAGMA journal_mode=DELETE").close()
        expected = "WARNING journal journal_mode = delete"
    elif backend.dialect == "postgresql":  # this session's setting only
        env["ONCE_DATABASE_URL"] = ledger_url.replace(
            "options=", "options=" + quote("-csynchronous_commit=off "), 1)
        expected = "WARNING durability synchronous_commit = off"
    else:  # the packet limit is global: here it is judged against the largest tail
        args += ["--output-tail", "1MiB"]
        expected = "OK limits max_allowed_packet"
    result = run_once(*args, env=env)
    assert expected in result.stdout, result.stdout + result.stderr
    assert result.returncode == (0 if expected.startswith("OK") else 1)
    assert result.stdout.splitlines()[0].startswith(expected.split()[0])  # worst first


def _in_memory(url: str) -> bool:
    return filesystem_type(os.path.dirname(url.removeprefix("sqlite:///"))) in \
        VOLATILE_FILESYSTEMS


def _rank(severity: str) -> int:
    return ["OK", "WARNING", "CRITICAL"].index(severity)


@pytest.mark.skipif(filesystem_type("/dev/shm") not in VOLATILE_FILESYSTEMS,
                    reason="no tmpfs at /dev/shm")
def test_a_sqlite_ledger_in_memory_is_critical(tmp_path: Path) -> None:
    # /dev/shm is emptied by a reboot, and every period done runs again (issue 34): doctor
    # said "OK filesystem local filesystem (tmpfs)". Through a symbolic link too.
    path = Path("/dev/shm") / f"once-doctor-{uuid.uuid4().hex[:12]}.db"
    link = tmp_path / "ledger.db"
    link.symlink_to(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    try:
        for where in (path, link):
            ran = run_once("run", "--db", f"sqlite:///{where}", "--job", "j", "--every", "day",
                           "--", "true", env=env)
            assert ran.returncode == 0, ran.stderr
            result = run_once("doctor", "--db", f"sqlite:///{where}", env=env)
            assert result.returncode == 2, result.stdout + result.stderr
            assert result.stdout.startswith("CRITICAL filesystem the SQLite file is on tmpfs "
                                            "(memory: /dev/shm): a reboot empties it"), \
                result.stdout
    finally:
        for leftover in Path("/dev/shm").glob(f"{path.name}*"):
            leftover.unlink()


@pytest.fixture
def made(backend: Any, once_env: dict[str, str]) -> None:
    """A server's ledger (PostgreSQL, MySQL) whose tables a first run has made."""
    if backend.dialect == "sqlite":
        pytest.skip("a SQLite file's permissions are the ledger topic's")
    assert run_once("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0


@contextmanager
def _user_granted(ledger_url: str, grants: dict[str, str]) -> Iterator[str]:
    """A user of its own on the ledger's server, granted `grants` (table: what, `*` for every
    table of once's), its URL yielded; dropped at the block's end."""
    from urllib.parse import urlsplit, urlunsplit

    from ledger_sql import query

    user = "once_g_" + uuid.uuid4().hex[:8]
    if ledger_url.startswith("postgresql"):
        schema = query(ledger_url, "SELECT current_schema()")[0][0]
        granted = [f"CREATE ROLE {user} LOGIN", f"GRANT USAGE ON SCHEMA {schema} TO {user}",
                   *(f"GRANT {what} ON {'ALL TABLES IN SCHEMA ' + schema if t == '*' else t} "
                     f"TO {user}" for t, what in grants.items())]
        dropped = [f"DROP OWNED BY {user}", f"DROP ROLE {user}"]
    else:
        database = urlsplit(ledger_url).path.lstrip("/")
        granted = [f"CREATE USER '{user}'@'%'", *(
            f"GRANT {what} ON `{database}`.{t} TO '{user}'@'%'" for t, what in grants.items())]
        dropped = [f"DROP USER '{user}'@'%'"]
    for sql in granted:
        query(ledger_url, sql)
    try:
        parts = urlsplit(ledger_url)
        yield urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))
    finally:
        for sql in dropped:
            query(ledger_url, sql)


@pytest.mark.usefixtures("made")
def test_a_user_that_may_only_read_the_tables_is_critical(backend: Any, ledger_url: str,
                                                          once_env: dict[str, str]) -> None:
    # `once doctor` said OK (MySQL: `the server accepts writes`) for a user granted SELECT
    # alone, whose every claim exits 75 (an attacker's finding): it now tries what claims
    # need on each of once's tables (PostgreSQL: has_table_privilege; MySQL: statements that
    # change nothing, rolled back) and names what is missing.
    with _user_granted(ledger_url, {"*": "SELECT"}) as reader:
        env = {**once_env, "ONCE_DATABASE_URL": reader}
        doctor = run_once("doctor", env=env)
        claim = run_once("run", "--job", "k", "--every", "day", "--", "true", env=env)
    assert claim.returncode == 75, claim.stderr  # what the verdict is about
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    [line] = [line for line in doctor.stdout.splitlines() if " grants " in line]
    assert line.startswith("CRITICAL grants this user lacks INSERT on once_attempts, UPDATE "
                           "on once_attempts, INSERT on once_jobs,"), line
    assert "SELECT on" not in line and "once_meta" not in line, line
    assert doctor.stdout.splitlines()[0] == line  # the worst first


@pytest.mark.parametrize("runs", ["none", "UPDATE (attempt)"])
@pytest.mark.usefixtures("made")
def test_a_user_without_the_grants_on_one_table_is_told(backend: Any, ledger_url: str,
                                                       once_env: dict[str, str],
                                                       runs: str) -> None:
    # MySQL lists only the tables a user has some grant on: a table with none was not
    # probed, and doctor said OK of it. An UPDATE granted on the one column the probe
    # updated passed it, and every claim's result was refused (an attacker's finding): a
    # grant on some columns alone is a WARNING (whether it covers once's writes is not
    # told), all columns updated by the probe.
    from once.ledger.server import NEEDED

    grants = {t: ", ".join(what) for t, what in NEEDED.items() if t != "once_runs"}
    if runs != "none":
        grants["once_runs"] = f"SELECT, INSERT, {runs}"
    with _user_granted(ledger_url, grants) as reader:
        doctor = run_once("doctor", env={**once_env, "ONCE_DATABASE_URL": reader})
    [line] = [line for line in doctor.stdout.splitlines() if " grants " in line]
    if runs != "none":
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        assert line == ("WARNING grants whether this user may write once's tables could not "
                        "be told (granted on some columns alone: UPDATE on once_runs)"), line
        return
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert line.startswith("CRITICAL grants this user lacks "), line
    lacks = line.removeprefix("CRITICAL grants this user lacks ").partition(":")[0]
    assert set(lacks.split(", ")) == {"SELECT on once_runs", "INSERT on once_runs",
                                      "UPDATE on once_runs"}, line


@pytest.mark.usefixtures("made")
def test_the_grants_behind_a_table_another_session_locked(backend: Any, ledger_url: str,
                                                          once_env: dict[str, str]) -> None:
    # MySQL learns the grants by statements that wait on a table's lock: the wait is a
    # second, and what it could not tell is a WARNING that says why (a read timeout had
    # broken the connection, and doctor exited 75 with `(0, '')`). PostgreSQL asks its
    # catalog, which the lock does not hold.
    from ledger_sql import tables_locked

    with tables_locked(ledger_url, "once_attempts"):
        doctor = run_once("doctor", env=once_env)
    [line] = [line for line in doctor.stdout.splitlines() if " grants " in line]
    if backend.dialect == "postgresql":
        assert line == "OK grants this user may read and write once's tables", line
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    else:
        assert line.startswith("WARNING grants whether this user may write once's tables "
                               "could not be told (a test write failed: (1205, "), line
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr

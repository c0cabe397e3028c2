"""A fleet at :00: more `once run` at one instant than the server takes connections.

Every server backend. The ledger is reached through a login limited to a few connections
(PostgreSQL `CONNECTION LIMIT`, MariaDB `MAX_USER_CONNECTIONS`): the refusals past the limit
are the same "too many connections" a small max_connections gives. Every fire must end with
a decision (no exit 75) and the command must run exactly once. A refusal that no retry can
cure (a bad password, an unknown database) still exits 75 at once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers import ONCE, release_together, run_once
from ledger_sql import query

LIMIT = 3
FIRES = 30


def _limited_login(backend: object, ledger_url: str) -> tuple[str, str]:
    """A login limited to LIMIT connections with every right on this test's ledger: (URL, its
    name)."""
    from conftest import Server

    assert isinstance(backend, Server)
    name = "once_storm_" + uuid.uuid4().hex[:8]
    parts = urlsplit(ledger_url)
    with backend.admin() as conn:
        if backend.dialect == "postgresql":
            schema = parts.query.rpartition("search_path%3D")[2]
            conn.execute(f"CREATE ROLE {name} LOGIN CONNECTION LIMIT {LIMIT}")
            conn.execute(f"GRANT ALL ON SCHEMA {schema} TO {name}")
            conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {name}")
        else:
            database = parts.path.lstrip("/")
            cur = conn.cursor()
            cur.execute(f"CREATE USER '{name}'@'%' WITH MAX_USER_CONNECTIONS {LIMIT}")
            cur.execute(f"CREATE USER '{name}'@'localhost' WITH MAX_USER_CONNECTIONS {LIMIT}")
            for host in ("%", "localhost"):
                cur.execute(f"GRANT ALL ON {database}.* TO '{name}'@'{host}'")
    # Keep the server's address as written: host and port, or none (a unix socket named in
    # the query, as the embedded PostgreSQL's URL does).
    address = parts.netloc.rpartition("@")[2]
    netloc = f"{name}@{address}"
    return parts._replace(netloc=netloc).geturl(), name


def _drop_login(backend: object, name: str) -> None:
    from conftest import Server

    assert isinstance(backend, Server)
    with backend.admin() as conn:
        if backend.dialect == "postgresql":
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE {name}")
        else:
            for host in ("%", "localhost"):
                conn.cursor().execute(f"DROP USER IF EXISTS '{name}'@'{host}'")


def test_a_storm_above_the_connection_limit_runs_once(backend: object, once_env: dict[str, str],
                                                      tmp_path: Path, ledger_url: str) -> None:
    if getattr(backend, "dialect", "") == "sqlite" or getattr(backend, "name", "") == "pgbouncer":
        pytest.skip("a server backend reached directly")
    # The tables first (a first use under a storm is the torture's business).
    assert run_once("schema", env=once_env).returncode == 0
    url, login = _limited_login(backend, ledger_url)
    try:
        env = {**once_env, "ONCE_DATABASE_URL": url}
        log = tmp_path / "ran"
        command = [ONCE, "run", "--job", "storm", "--every", "day", "--", "sh", "-c",
                   f'echo x >> "{log}"; sleep 0.2']
        results = release_together([command] * FIRES, tmp_path / "gate", env)
        statuses = sorted(r.returncode for r in results)
        assert statuses == [0] * FIRES, [r.stderr for r in results if r.returncode]
        assert log.read_text().split() == ["x"]
        assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]
    finally:
        _drop_login(backend, login)


@pytest.mark.parametrize("fault", ["bad password", "unknown database"])
def test_a_refusal_no_retry_can_cure_fails_at_once(backend: object, once_env: dict[str, str],
                                                   ledger_url: str, fault: str) -> None:
    if getattr(backend, "dialect", "") == "sqlite" or getattr(backend, "name", "") == "pgbouncer":
        pytest.skip("a server backend reached directly")
    parts = urlsplit(ledger_url)
    if fault == "bad password":
        user = parts.username or "root"
        url = parts._replace(netloc=f"{user}:wrong@{parts.hostname}:{parts.port}").geturl()
        if getattr(backend, "dialect", "") == "postgresql":
            pytest.skip("trust authentication here: PostgreSQL takes any password")
    else:
        url = parts._replace(path="/once_no_such_database").geturl()
    began = time.monotonic()
    result = run_once("run", "--job", "x", "--every", "day", "--", "true",
                      env={**once_env, "ONCE_DATABASE_URL": url})
    assert result.returncode == 75, result.stderr
    assert time.monotonic() - began < 5, "a refusal that no retry can cure was retried"
    assert len(result.stderr.splitlines()) == 1

